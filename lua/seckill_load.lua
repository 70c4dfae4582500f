-- Writes one shard of a voucher's sale from MySQL (src/seckill/sale_state/load.rs
-- decides, while it holds the voucher's stock row, that the sale must be
-- written: missing, partly missing, of different loads, or another token's).
-- The shard's hash, buyers and given-back orders are written together or
-- not at all.
-- A sale loaded again (Redis lost it, or lost another of its shards) keeps
-- the orders Redis still holds as pending and MySQL has not written counted:
-- the caller took their units out of ARGV[2] and put their buyers in the
-- buyer ids, and their pending entries stay, so that their writers find
-- them pending. Orders Redis lost with a shard are counted again by their
-- writers (lua/seckill_readmit.lua) while the sale is not open yet.
-- KEYS[1]: the shard's part of the sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the shard's buyer set ({tag}:buyers:<voucherId>)
-- KEYS[3]: the shard's given-back orders ({tag}:given-back:<voucherId>)
-- KEYS[4]: the transfers the shard received ({tag}:received:<voucherId>)
-- ARGV[1]: the shard's initial stock (its stock + its buyers)
-- ARGV[2]: the shard's stock left (its part of MySQL's stock less the
--          orders on their way)
-- ARGV[3]: sale begins, Unix epoch milliseconds
-- ARGV[4]: sale ends, Unix epoch milliseconds
-- ARGV[5]: the voucher's sale token (tb_seckill_voucher.sale_token)
-- ARGV[6]: milliseconds before the sale admits anyone (0: at once); a sale
--          loaded after Redis lost it waits for writers still holding
--          orders admitted before, which count them again meanwhile
-- ARGV[7]: this load's epoch: a transfer lent from an earlier load's sale
--          is not received into this one (this load counted its units)
-- ARGV[8]: the shard's admission sequence to go on from: MySQL's fence, or
--          the highest number of an order on its way when higher (the
--          sequence the shard held is kept when higher still)
-- ARGV[9]: how many user ids follow (n)
-- ARGV[10..9+n]: user ids of the shard that hold an active order in MySQL
--          or an order on its way
-- ARGV[10+n..]: the shard's closed orders: their units are in ARGV[2]
--          already, so they count as given back (a give-back still on its
--          way changes nothing)
-- The shard is stamped with what lua/sale_fence.lua checks: this server's
-- replication id, its buyers' count, its sequence.
-- Returns nothing.
local seq = math.max(tonumber(ARGV[8]), tonumber(redis.call('HGET', KEYS[1], 'seq') or '0'))
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], 'initial', ARGV[1], 'stock', ARGV[2],
  'begin_ms', ARGV[3], 'end_ms', ARGV[4], 'token', ARGV[5], 'epoch', ARGV[7],
  'lent', 0, 'received', 0, 'moves', 0, 'in_transit', 0, 'seq', seq, 'replid', sale_replid())
if tonumber(ARGV[6]) > 0 then
  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('HSET', KEYS[1], 'open_ms', now_ms + tonumber(ARGV[6]))
end
-- SADD in slices: unpack() of too many values overflows Lua's stack.
local function add_all(key, first, last)
  local slice = 1000
  for from = first, last, slice do
    redis.call('SADD', key, unpack(ARGV, from, math.min(from + slice - 1, last)))
  end
end
local buyers_end = 9 + tonumber(ARGV[9])
add_all(KEYS[2], 10, buyers_end)
add_all(KEYS[3], buyers_end + 1, #ARGV)
redis.call('HSET', KEYS[1], 'buyers', redis.call('SCARD', KEYS[2]))

-- Writes one shard of a voucher's sale from MySQL (src/seckill/sale_state.rs
-- decides, while it holds the voucher's stock row, that the sale must be
-- written: missing, partly missing, or another token's). The shard's hash,
-- buyers and given-back orders are written together or not at all.
-- A sale loaded again (Redis lost it, or lost another of its shards) may
-- find orders of the voucher still pending in this shard, admitted into
-- the sale this load replaces: they leave the pending hash, so that their
-- writers count them again in the new sale (lua/seckill_readmit.lua)
-- instead of taking them for counted. A first load leaves the hash alone.
-- KEYS[1]: the shard's part of the sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the shard's buyer set ({tag}:buyers:<voucherId>)
-- KEYS[3]: the shard's given-back orders ({tag}:given-back:<voucherId>)
-- KEYS[4]: the transfers the shard received ({tag}:received:<voucherId>)
-- KEYS[5]: the shard's pending orders ({tag}:pending)
-- ARGV[1]: the shard's initial stock (its stock + its buyers' active orders)
-- ARGV[2]: the shard's stock left (its part of MySQL's stock)
-- ARGV[3]: sale begins, Unix epoch milliseconds
-- ARGV[4]: sale ends, Unix epoch milliseconds
-- ARGV[5]: the voucher's sale token (tb_seckill_voucher.sale_token)
-- ARGV[6]: milliseconds before the sale admits anyone (0: at once); a sale
--          loaded after Redis lost it waits for writers still holding
--          orders admitted before, which count them again meanwhile
-- ARGV[7]: this load's epoch: a transfer lent from an earlier load's sale
--          is not received into this one (this load counted its units)
-- ARGV[8]: the voucher id
-- ARGV[9]: how many user ids follow (n)
-- ARGV[10..9+n]: user ids of the shard that hold an active order
-- ARGV[10+n..]: the shard's closed orders: their units are in ARGV[2]
--          already, so they count as given back (a give-back still on its
--          way changes nothing)
-- Returns the number of pending orders of the voucher it took out of the
-- pending hash (none on a first load: ARGV[6] is 0).
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('HSET', KEYS[1], 'initial', ARGV[1], 'stock', ARGV[2],
  'begin_ms', ARGV[3], 'end_ms', ARGV[4], 'token', ARGV[5], 'epoch', ARGV[7],
  'lent', 0, 'received', 0, 'moves', 0, 'in_transit', 0)
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
local taken = 0
if tonumber(ARGV[6]) == 0 then
  return taken
end
local suffix = ':' .. ARGV[8]
local cursor = '0'
repeat
  local page = redis.call('HSCAN', KEYS[5], cursor, 'COUNT', 1000)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local entry = page[2][i + 1]
    if string.sub(entry, -#suffix) == suffix then
      redis.call('HDEL', KEYS[5], page[2][i])
      taken = taken + 1
    end
  end
until cursor == '0'
return taken

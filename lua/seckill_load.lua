-- Loads one voucher's sale into Redis unless the same sale is already
-- there: the voucher hash and its buyer set are written together or not at
-- all, so nodes loading the same voucher at once agree, and a sale already
-- running (its stock already taken in Redis) is never reset. A hash with
-- another token is an earlier voucher's sale under a reused id: replaced.
-- KEYS[1]: the voucher's sale hash ({seckill}:voucher:<voucherId>)
-- KEYS[2]: the voucher's buyer set ({seckill}:buyers:<voucherId>)
-- KEYS[3]: the voucher's given-back orders ({seckill}:given-back:<voucherId>)
-- ARGV[1]: initial stock (MySQL stock + MySQL's active orders)
-- ARGV[2]: stock left (MySQL stock)
-- ARGV[3]: sale begins, Unix epoch milliseconds
-- ARGV[4]: sale ends, Unix epoch milliseconds
-- ARGV[5]: the voucher's sale token (tb_seckill_voucher.sale_token)
-- ARGV[6]: milliseconds before the sale admits anyone (0: at once); a sale
--          loaded after Redis lost it waits for writers still holding
--          orders admitted before, which count them again meanwhile
-- ARGV[7]: how many user ids follow (n)
-- ARGV[8..7+n]: user ids that hold an active order of the voucher
-- ARGV[8+n..]: the voucher's closed orders: their units are in ARGV[2]
--          already, so they count as given back (a give-back still on its
--          way changes nothing)
-- Returns 1 when the sale was loaded, 2 when it replaced another token's
-- sale, 0 when this very sale was there (nothing written).
local token = redis.call('HGET', KEYS[1], 'token')
local existed = redis.call('EXISTS', KEYS[1]) == 1
-- A sale stored before tokens existed has none: it is token 0's.
if existed and (token or '0') == ARGV[5] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'initial', ARGV[1], 'stock', ARGV[2],
  'begin_ms', ARGV[3], 'end_ms', ARGV[4], 'token', ARGV[5])
if tonumber(ARGV[6]) > 0 then
  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('HSET', KEYS[1], 'open_ms', now_ms + tonumber(ARGV[6]))
end
-- Buyers and give-backs left behind without their hash (an evicted hash),
-- or another voucher's, are MySQL's to say, not ours to keep.
redis.call('DEL', KEYS[2], KEYS[3])
-- SADD in slices: unpack() of too many values overflows Lua's stack.
local function add_all(key, first, last)
  local slice = 1000
  for from = first, last, slice do
    redis.call('SADD', key, unpack(ARGV, from, math.min(from + slice - 1, last)))
  end
end
local buyers_end = 7 + tonumber(ARGV[7])
add_all(KEYS[2], 8, buyers_end)
add_all(KEYS[3], buyers_end + 1, #ARGV)
if existed then
  return 2
end
return 1

-- Loads one voucher's sale into Redis unless it is already there: the
-- voucher hash and its buyer set are written together or not at all, so
-- nodes loading the same voucher at once agree, and a sale already running
-- (its stock already taken in Redis) is never reset.
-- KEYS[1]: the voucher's sale hash ({seckill}:voucher:<voucherId>)
-- KEYS[2]: the voucher's buyer set ({seckill}:buyers:<voucherId>)
-- ARGV[1]: initial stock (MySQL stock + MySQL orders)
-- ARGV[2]: stock left (MySQL stock)
-- ARGV[3]: sale begins, Unix epoch milliseconds
-- ARGV[4]: sale ends, Unix epoch milliseconds
-- ARGV[5..]: user ids that already hold an order of the voucher
-- Returns 1 when the sale was loaded, 0 when the hash existed (nothing written).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'initial', ARGV[1], 'stock', ARGV[2],
  'begin_ms', ARGV[3], 'end_ms', ARGV[4])
-- Buyers left behind without their hash (an evicted hash) are MySQL's to
-- say, not ours to keep.
redis.call('DEL', KEYS[2])
-- SADD in slices: unpack() of too many values overflows Lua's stack.
local slice = 1000
for first = 5, #ARGV, slice do
  redis.call('SADD', KEYS[2], unpack(ARGV, first, math.min(first + slice - 1, #ARGV)))
end
return 1

-- Admits one purchase of a flash sale, or refuses it, in one call: the sale
-- window by Redis's own clock, the stock, the one-order-per-user buyer set,
-- and the hand-off of the admitted order. Every key shares the `{seckill}`
-- hash tag, so the script is valid on a Redis Cluster.
-- KEYS[1]: the voucher's sale hash ({seckill}:voucher:<voucherId>: stock, begin_ms, end_ms)
-- KEYS[2]: the voucher's buyer set ({seckill}:buyers:<voucherId>)
-- KEYS[3]: the order stream ({seckill}:orders)
-- KEYS[4]: the pending orders hash ({seckill}:pending)
-- ARGV[1]: order id
-- ARGV[2]: user id
-- ARGV[3]: voucher id
-- ARGV[4]: '1' to append the order to the stream (`stream` mode), '0' not (`queue`)
-- Returns an integer: 0 admitted (stock taken, user added to the buyers,
-- order appended if asked, order recorded as pending), 1 voucher not found,
-- 2 not started, 3 ended, 4 sold out, 5 already ordered. Nothing is written
-- unless it returns 0.
local sale = redis.call('HMGET', KEYS[1], 'stock', 'begin_ms', 'end_ms')
-- HMGET answers `false` for a missing field: test for it before any
-- tonumber(), so a voucher missing in Redis is an answer, not a script error.
if not sale[1] or not sale[2] or not sale[3] then
  return 1
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now_ms < tonumber(sale[2]) then
  return 2
end
if now_ms > tonumber(sale[3]) then
  return 3
end
if tonumber(sale[1]) < 1 then
  return 4
end
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 1 then
  return 5
end
redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('SADD', KEYS[2], ARGV[2])
if ARGV[4] == '1' then
  redis.call('XADD', KEYS[3], '*', 'id', ARGV[1], 'userId', ARGV[2], 'voucherId', ARGV[3])
end
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2] .. ':' .. ARGV[3])
return 0

-- Claims unpaid orders whose payment deadline has come, for one node's
-- closer: each claimed order's due time moves a lease ahead in the same
-- call, so two nodes never claim one order at once, and an order whose
-- claimer died before closing it comes due again when the lease ends.
-- KEYS[1]: the due times ({seckill}:due), score Unix epoch milliseconds
-- ARGV[1]: now, Unix epoch milliseconds (the claiming node's clock; MySQL's
--          clock has the last word on whether the deadline passed)
-- ARGV[2]: the lease, milliseconds
-- ARGV[3]: at most this many orders
-- Returns the claimed order ids.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
local lease_ends = tonumber(ARGV[1]) + tonumber(ARGV[2])
for _, order_id in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', lease_ends, order_id)
end
return due

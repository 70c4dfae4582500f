-- Gives a closed order's unit and its buyer's turn back to the voucher's
-- sale in Redis, once per order: the order id goes into the sale's
-- given-back set in the same call, so a give-back sent again (a retried
-- close, a relay after a node died between MySQL and Redis, two nodes at
-- once) finds it there and changes nothing. A sale reloaded from MySQL
-- after the close counted the unit already, and lists the order as given
-- back (lua/seckill_load.lua).
-- KEYS[1]: the shard's part of the voucher's sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the voucher's buyer set ({tag}:buyers:<voucherId>)
-- KEYS[3]: the voucher's given-back orders ({tag}:given-back:<voucherId>)
-- ARGV[1]: order id
-- ARGV[2]: the order's buyer
-- Returns 1 when given back now, 0 when it had been, 2 when Redis holds no
-- sale for the voucher (`sync` mode, or a sale the next load reads from
-- MySQL, the unit included).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 2
end
if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'stock', 1)
-- The buyers' count follows the set (lua/sale_fence.lua).
if redis.call('SREM', KEYS[2], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'buyers', -1)
end
return 1

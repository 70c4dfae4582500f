-- Counts again in Redis an order admitted before Redis lost it, which a
-- writer is about to commit: the sale was reloaded from MySQL without it
-- (or not reloaded yet). Run by the writer while it holds the voucher's
-- stock row, so that no reload of the sale can come between this and the
-- commit. Keyed by the order id: running it twice counts the order once.
-- KEYS[1]: the shard's part of the voucher's sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the voucher's buyer set ({tag}:buyers:<voucherId>)
-- KEYS[3]: the pending orders hash ({tag}:pending)
-- KEYS[4]: the order stream ({tag}:orders)
-- ARGV[1]: order id
-- ARGV[2]: user id
-- ARGV[3]: voucher id
-- ARGV[4]: '1' to append the order to the stream again (`stream` mode), so
--          that it is written by the consumers should this writer fail
-- ARGV[5]: the order's admission sequence number: the shard's sequence is
--          raised to it, so that the fence this commit records in MySQL is
--          never above it (lua/sale_fence.lua)
-- Returns 0 when counted now (a unit taken, the buyer added, the order
-- pending again), 1 when it is pending already (Redis never lost it), 2 when
-- Redis holds no sale for the voucher (the reload, after this commit, will
-- count the order from MySQL), 3 when the user was admitted again since the
-- reload, 4 when no unit is left: the last two are orders whose unit went
-- to a buyer admitted after the reload, who keeps it.
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return 1
end
local stock = redis.call('HGET', KEYS[1], 'stock')
if not stock then
  return 2
end
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 1 then
  return 3
end
if tonumber(stock) < 1 then
  return 4
end
redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('HINCRBY', KEYS[1], 'buyers', 1)
redis.call('SADD', KEYS[2], ARGV[2])
local seq = tonumber(ARGV[5])
if seq > tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') then
  redis.call('HSET', KEYS[1], 'seq', seq)
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2] .. ':' .. ARGV[3] .. ':' .. ARGV[5])
if ARGV[4] == '1' then
  redis.call('XADD', KEYS[4], '*', 'id', ARGV[1], 'userId', ARGV[2], 'voucherId', ARGV[3],
    'seq', ARGV[5])
end
return 0

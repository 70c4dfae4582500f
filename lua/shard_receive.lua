-- Receives units another shard of the voucher's sale lent to this one
-- (lua/shard_lend.lua), once per transfer: its id goes into the shard's
-- received set in the same call, so a transfer received again (the mover
-- and a node that found it stale, both) changes nothing.
-- KEYS[1]: the receiving shard's part of the sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the transfers it received ({tag}:received:<voucherId>)
-- ARGV[1]: the transfer's id
-- ARGV[2]: how many units
-- ARGV[3]: the epoch of the sale they were lent from
-- Returns 1 when received now, 0 when received before, 2 when this shard
-- holds no sale (Redis lost it: the sale's next load counts every unit
-- from MySQL), 3 when the sale was loaded again since the units were lent
-- (that load counted them).
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  return 2
end
if epoch ~= ARGV[3] then
  return 3
end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'stock', tonumber(ARGV[2]))
redis.call('HINCRBY', KEYS[1], 'received', tonumber(ARGV[2]))
redis.call('HINCRBY', KEYS[1], 'moves', 1)
return 1

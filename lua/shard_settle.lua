-- Settles a transfer the receiving shard has counted (lua/shard_receive.lua
-- answered): the record leaves the lending shard's units in transit.
-- KEYS[1]: the lending shard's part of the sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the lending shard's units in transit ({tag}:transit)
-- ARGV[1]: the transfer's id
-- Returns 1 when settled now, 0 when it had been. A record of an earlier
-- load's sale (its epoch differs) leaves the counts of this one alone.
local record = redis.call('HGET', KEYS[2], ARGV[1])
if not record then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
local _, _, units, epoch = string.match(record, '^(%d+):(%d+):(%d+):([^:]*):(%d+)$')
if units and redis.call('HGET', KEYS[1], 'epoch') == epoch then
  redis.call('HINCRBY', KEYS[1], 'in_transit', -tonumber(units))
  redis.call('HINCRBY', KEYS[1], 'moves', 1)
end
return 1

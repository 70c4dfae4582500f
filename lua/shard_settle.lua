-- Settles a transfer the receiving shard answered (lua/shard_receive.lua):
-- the record leaves the lending shard's units in transit. A transfer the
-- receiver refused (it holds no sale, or one of another load) gives its
-- units back to the lender's stock: a refused unit is never destroyed.
-- KEYS[1]: the lending shard's part of the sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the lending shard's units in transit ({tag}:transit)
-- ARGV[1]: the transfer's id
-- ARGV[2]: '1' when the receiver refused the units, '0' when it counted them
-- Returns 1 when settled now, 0 when it had been. A record of an earlier
-- load's sale (its epoch differs) leaves the counts of this one alone: that
-- load counted its units from MySQL.
local record = redis.call('HGET', KEYS[2], ARGV[1])
if not record then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
local _, _, units, epoch = string.match(record, '^(%d+):(%d+):(%d+):([^:]*):(%d+)$')
if units and redis.call('HGET', KEYS[1], 'epoch') == epoch then
  redis.call('HINCRBY', KEYS[1], 'in_transit', -tonumber(units))
  redis.call('HINCRBY', KEYS[1], 'moves', 1)
  if ARGV[2] == '1' then
    redis.call('HINCRBY', KEYS[1], 'stock', tonumber(units))
    redis.call('HINCRBY', KEYS[1], 'lent', -tonumber(units))
  end
end
return 1

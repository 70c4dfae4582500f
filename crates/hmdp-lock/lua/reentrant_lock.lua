-- Takes a reentrant hash lock for one holder (Redisson RLock's tryLockInner).
-- The hash maps owner id -> hold count; a free key or one we already hold is
-- (re)entered and its lease reset, anyone else's is left alone.
-- KEYS[1]  the lock hash
-- KEYS[2]  optional: this take's marker, set (with the lease) when the take
--          lands, so that giving it back can tell whether it ever did
--          (`multi` and `redlock`, whose rounds may time out on a node)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id (process id : holder id)
-- Returns {1, count}: taken; count = this owner's holds including this one.
--         {0, pttl}:  held by another owner; pttl = ms left on its lease.
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  if KEYS[2] then
    redis.call('set', KEYS[2], 1, 'px', ARGV[1])
  end
  return {1, count}
end
return {0, redis.call('pttl', KEYS[1])}

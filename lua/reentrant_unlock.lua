-- Gives back one hold of a reentrant hash lock; the last one deletes the key
-- and announces the release to waiters. Idempotent per release id: a retry
-- after a lost reply returns the first attempt's answer instead of a false
-- "not owner" (the key may be gone, or someone else's, by then).
-- KEYS[1]  the lock hash
-- KEYS[2]  the release channel (same hash slot as the lock)
-- KEYS[3]  this release's latch, remembering its answer (same slot)
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds, reset while holds remain
-- ARGV[3]  how long the latch remembers the answer, in milliseconds
-- Returns  n >= 0: released, n holds of this owner remain (0: key deleted)
--          -1: the key was gone (lease expired)
--          -2: another owner holds the key
local done = redis.call('get', KEYS[3])
if done then
  return tonumber(done)
end
local result
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  if redis.call('exists', KEYS[1]) == 0 then
    result = -1
  else
    result = -2
  end
else
  result = redis.call('hincrby', KEYS[1], ARGV[1], -1)
  if result > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
  else
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[2], 'released')
  end
end
redis.call('set', KEYS[3], result, 'px', ARGV[3])
return result

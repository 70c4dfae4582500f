-- Gives back one hold of a reentrant hash lock; the last one deletes the key
-- and announces the release to waiters.
--
-- Retries after a lost reply: a release that leaves holds behind stores its
-- answer in a latch for a while, so a retry returns it instead of taking a
-- second hold away. The last hold's release stores nothing: the caller knows
-- its lease was still running, so a retry that finds the key gone or
-- someone else's can only mean the first attempt released it. (Writing a
-- latch on every release halved the lock's throughput.)
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the release channel (same hash slot as the lock)
-- KEYS[3]  this release's latch (same slot)
-- KEYS[4]  optional: the marker the take of this hold set (see
--          reentrant_lock.lua); consumed here, and without it there is no
--          hold of ours to give back on this node
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds, reset while holds remain
-- ARGV[3]  how long the latch remembers the answer, in milliseconds
-- ARGV[4]  which attempt of this release this is: the first cannot find a
--          latch (release ids are never reused), so it does not look
-- ARGV[5]  how to announce the release: 'publish' (one server) or
--          'spublish' (Redis Cluster: sharded, to the slot's own master)
-- Returns  n >= 0: released, n holds of this owner remain (0: key deleted)
--          -1: the key was gone (lease expired)
--          -2: another owner holds the key
--          -3: no marker, yet the owner holds the key: those are other
--              takes' holds (this one never landed here, or was given back
--              already); nothing changed. Without the marker, a re-entry
--              whose take never landed would take away the outer hold.
if KEYS[4] and redis.call('del', KEYS[4]) == 0 then
  if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    return -3
  end
  if redis.call('exists', KEYS[1]) == 0 then
    return -1
  end
  return -2
end
if ARGV[4] ~= '1' then
  local done = redis.call('get', KEYS[3])
  if done then
    return tonumber(done)
  end
end
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count then
  if redis.call('exists', KEYS[1]) == 0 then
    return -1
  end
  return -2
end
if tonumber(count) > 1 then
  local left = redis.call('hincrby', KEYS[1], ARGV[1], -1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], left, 'px', ARGV[3])
  return left
end
redis.call('del', KEYS[1])
-- The announcement may fail (no SPUBLISH before Redis 7) without failing the
-- release: there no sharded subscription can be opened either, and waiters
-- poll.
redis.pcall(ARGV[5], KEYS[2], 'released')
return 0

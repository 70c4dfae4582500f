-- Watchdog renewal: extends the lease only while the owner still holds the key.
-- KEYS[1]  the lock hash
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id
-- Returns  1: renewed; 0: the owner no longer holds it (expired or taken).
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0

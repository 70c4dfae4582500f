-- Mints the fencing token of one acquisition of a lock key. Tokens never go
-- backwards for a key: a new one is above the last one and at least Redis'
-- clock in microseconds, so even after the counter expired (it is kept only
-- for a day after its last use, so counters of idle users do not pile up) or
-- was lost with a failed-over master, the next token still beats every token
-- handed out before. The same owner asking again (a reentrant acquisition or
-- a retry) gets its token back instead of outdating itself.
-- KEYS[1]  the counter hash (fields: token, owner), next to the lock key
-- ARGV[1]  owner id of the acquisition
-- ARGV[2]  how long the counter outlives its last use, in milliseconds
-- Returns  the token
local token = tonumber(redis.call('hget', KEYS[1], 'token') or '0')
if redis.call('hget', KEYS[1], 'owner') ~= ARGV[1] then
  local now = redis.call('time')
  local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
  token = math.max(token + 1, micros)
  redis.call('hset', KEYS[1], 'token', string.format('%d', token), 'owner', ARGV[1])
end
redis.call('pexpire', KEYS[1], ARGV[2])
return token

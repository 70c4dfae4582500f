-- Mints the fencing token of one acquisition of a lock key, in the same step
-- as checking that the acquisition still holds the key: a holder whose lease
-- ran out before it got here cannot mint a token newer than the next
-- holder's. Tokens never go backwards for a key: a new one is above the last
-- one and at least Redis' clock in microseconds, so even after the counter
-- expired (it is kept only for a day after its last use, so counters of idle
-- users do not pile up) or was lost with a failed-over master, the next token
-- still beats every token handed out before. The same owner asking again (a
-- reentrant acquisition or a retry) gets its token back instead of outdating
-- itself.
-- KEYS[1]  the counter hash (fields: token, owner), next to the lock key
-- KEYS[2]  the lock key
-- ARGV[1]  owner id of the acquisition (in the counter)
-- ARGV[2]  how long the counter outlives its last use, in milliseconds
-- ARGV[3]  how the acquisition appears in the lock key: the value of a string
--          key, a field of a hash key; empty when the lock key lives
--          elsewhere (multi, redlock) and cannot be checked here
-- Returns  the token, or -1 when the lock key no longer holds the acquisition
if ARGV[3] ~= '' then
  local kind = redis.call('type', KEYS[2])['ok']
  local holds = (kind == 'string' and redis.call('get', KEYS[2]) == ARGV[3])
    or (kind == 'hash' and redis.call('hexists', KEYS[2], ARGV[3]) == 1)
  if not holds then
    return -1
  end
end
local token = tonumber(redis.call('hget', KEYS[1], 'token') or '0')
if redis.call('hget', KEYS[1], 'owner') ~= ARGV[1] then
  local now = redis.call('time')
  local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
  token = math.max(token + 1, micros)
  redis.call('hset', KEYS[1], 'token', string.format('%d', token), 'owner', ARGV[1])
end
redis.call('pexpire', KEYS[1], ARGV[2])
return token

-- Checks a login code atomically, so that concurrent guesses cannot exceed
-- the attempt limit.
-- KEYS[1]: the code key (login:code:{phone})
-- KEYS[2]: the failure counter key (login:code:fail:{phone})
-- ARGV[1]: the code the user typed
-- ARGV[2]: failures allowed before the code is invalidated
-- Returns 1 when the code matched (both keys are deleted: a code is single
-- use), 0 when it did not or no code exists (the code is deleted once the
-- failures reach the limit).
local stored = redis.call('GET', KEYS[1])
if not stored then
  return 0
end
if stored == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
local failures = redis.call('INCR', KEYS[2])
if failures == 1 then
  redis.call('PEXPIRE', KEYS[2], redis.call('PTTL', KEYS[1]))
end
if failures >= tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1], KEYS[2])
end
return 0

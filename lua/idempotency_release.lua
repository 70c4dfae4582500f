-- Frees an Idempotency-Key claimed by a synchronous purchase that ended
-- without an order (src/idempotency.rs), or gave up before it knew whether
-- its claim landed: the key is deleted only if it still holds this very
-- claim, so that a claim of another request (after this one's expired) or
-- a kept answer is never deleted.
-- KEYS[1]: the key's entry ({tag}:idempotency:<userId>:<key>)
-- ARGV[1]: this request's claim (`running:<voucherId>:<claim id>`)
-- Returns 1 when freed, 0 when the entry held something else.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0

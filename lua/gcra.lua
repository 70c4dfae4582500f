-- One request against a limit, by the generic cell rate algorithm (GCRA):
-- the key holds the limit's "theoretical arrival time" (TAT), the moment
-- the subject's allowance would be whole again were it to stop now. A
-- request is allowed while that moment lies less than one window ahead.
-- The clock is Redis's own (TIME), so that every node sharing the limit
-- counts on one clock, whatever their own say.
-- KEYS[1]: the limit's key for one subject (limit:{rule}:{subject})
-- ARGV[1]: the emission interval, µs: the window over the quota (one
--          request's share of the window)
-- ARGV[2]: the window, µs: how far ahead the TAT may run (a whole quota
--          at once)
-- ARGV[3]: '1' counts this request if allowed; '-1' gives back one counted
--          earlier (a request that turned out not to count, such as a
--          login whose code was right)
-- Returns {allowed (1 or 0), requests left after this one, µs until the
-- next is allowed (0 when this one was), µs until the allowance is whole}.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
if ARGV[3] == '-1' then
  tat = tat - interval
  if tat > now then
    redis.call('SET', KEYS[1], string.format('%.0f', tat),
      'PX', math.ceil((tat - now) / 1000))
  else
    redis.call('DEL', KEYS[1])
    tat = now
  end
  return {1, math.floor((window - (tat - now)) / interval), 0, tat - now}
end
local next_tat = tat + interval
local allowed_at = next_tat - window
if now < allowed_at then
  return {0, 0, allowed_at - now, tat - now}
end
-- Kept exactly as long as it says anything: a TAT in the past is no TAT.
redis.call('SET', KEYS[1], string.format('%.0f', next_tat),
  'PX', math.ceil((next_tat - now) / 1000))
return {1, math.floor((now - allowed_at) / interval), 0, next_tat - now}

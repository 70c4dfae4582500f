-- Requests against limits, by the generic cell rate algorithm (GCRA): each
-- key holds its limit's "theoretical arrival time" (TAT), the moment the
-- subject's allowance would be whole again were it to stop now. A request
-- is allowed while that moment lies less than one window ahead. The clock
-- is Redis's own (TIME), so that every node sharing a limit counts on one
-- clock, whatever their own say.
-- KEYS[1..n]: the limits' keys, one subject each (limit:{rule}:{subject}),
--             in the order they are checked. On a Redis Cluster, where
--             they lie in other slots, one key a call.
-- ARGV[1]: '1' counts this request under each key in turn, if allowed: the
--          first key that refuses it ends the call, the keys after it not
--          counted; '-1' gives back, under KEYS[1] alone, one request
--          counted earlier (a request that turned out not to count, such
--          as a login whose code was right)
-- ARGV[2k], ARGV[2k+1]: key k's emission interval, µs (the window over the
--          quota: one request's share of it), and its window, µs (how far
--          ahead the TAT may run: a whole quota at once)
-- Returns {allowed (1 or 0), requests left after this one, µs until the
-- next is allowed (0 when this one was), µs until the allowance is whole,
-- the key that answered (the one that refused, else the last)}.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local function tat_of(key)
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then
    return now
  end
  return tat
end

-- Kept exactly as long as it says anything: a TAT in the past is no TAT.
local function keep(key, tat)
  if tat > now then
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
  else
    redis.call('DEL', key)
  end
end

if ARGV[1] == '-1' then
  local interval, window = tonumber(ARGV[2]), tonumber(ARGV[3])
  local tat = math.max(tat_of(KEYS[1]) - interval, now)
  keep(KEYS[1], tat)
  return {1, math.floor((window - (tat - now)) / interval), 0, tat - now, 1}
end

local answer
for k, key in ipairs(KEYS) do
  local interval, window = tonumber(ARGV[2 * k]), tonumber(ARGV[2 * k + 1])
  local tat = tat_of(key)
  local next_tat = tat + interval
  local allowed_at = next_tat - window
  if now < allowed_at then
    return {0, 0, allowed_at - now, tat - now, k}
  end
  keep(key, next_tat)
  answer = {1, math.floor((now - allowed_at) / interval), 0, next_tat - now, k}
end
return answer

-- The generic cell rate algorithm (GCRA) that counts requests against
-- limits (src/limits), put in front of each script that counts: lua/gcra.lua
-- (the limits' own call) and lua/seckill.lua (an admission that counts its
-- purchase's limits in the same call, on a single Redis). Each key holds its
-- limit's "theoretical arrival time" (TAT), the moment the subject's
-- allowance would be whole again were it to stop now. A request is allowed
-- while that moment lies less than one window ahead. The clock is Redis's
-- own (TIME), so that every node sharing a limit counts on one clock,
-- whatever their own say.

-- Redis's clock, µs.
local function gcra_now()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local function gcra_tat(key, now)
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then
    return now
  end
  return tat
end

-- Kept exactly as long as it says anything: a TAT in the past is no TAT.
local function gcra_keep(key, tat, now)
  if tat > now then
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000))
  else
    redis.call('DEL', key)
  end
end

-- Counts one request under `count` keys in turn, KEYS[first_key] on, each
-- with its emission interval (µs: the window over the quota, one request's
-- share of it) and its window (µs: how far ahead the TAT may run, a whole
-- quota at once) at ARGV[first_arg + 2(k - 1)] and the next: the first key
-- that refuses ends the count, the keys after it not counted. Returns
-- {allowed (1 or 0), requests left after this one, µs until the next is
-- allowed (0 when this one was), µs until the allowance is whole, the key
-- that answered (k: the one that refused, else the last)}.
local function gcra_count(now, first_key, count, first_arg)
  local answer
  for k = 1, count do
    local key = KEYS[first_key + k - 1]
    local interval = tonumber(ARGV[first_arg + 2 * (k - 1)])
    local window = tonumber(ARGV[first_arg + 2 * (k - 1) + 1])
    local tat = gcra_tat(key, now)
    local next_tat = tat + interval
    local allowed_at = next_tat - window
    if now < allowed_at then
      return {0, 0, allowed_at - now, tat - now, k}
    end
    gcra_keep(key, next_tat, now)
    answer = {1, math.floor((now - allowed_at) / interval), 0, next_tat - now, k}
  end
  return answer
end

-- A script's answer when a limit it counted refused the request (nothing
-- else done): {'limited', µs until the next is allowed, µs until the
-- allowance is whole, the key that refused}.
local function gcra_refused(counted)
  return {'limited', counted[3], counted[4], counted[5]}
end

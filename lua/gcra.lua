-- Requests against limits (src/limits), after lua/gcra_count.lua.
-- KEYS[1..n]: the limits' keys, one subject each (limit:{rule}:{subject}),
--             in the order they are checked. On a Redis Cluster, where
--             they lie in other slots, one key a call.
-- ARGV[1]: '1' counts this request under each key in turn, if allowed: the
--          first key that refuses it ends the call, the keys after it not
--          counted; '-1' gives back, under KEYS[1] alone, one request
--          counted earlier (a request that turned out not to count, such
--          as a login whose code was right)
-- ARGV[2k], ARGV[2k+1]: key k's emission interval and window, µs
-- Returns gcra_count's answer.
local now = gcra_now()

if ARGV[1] == '-1' then
  local interval, window = tonumber(ARGV[2]), tonumber(ARGV[3])
  local tat = math.max(gcra_tat(KEYS[1], now) - interval, now)
  gcra_keep(KEYS[1], tat, now)
  return {1, math.floor((window - (tat - now)) / interval), 0, tat - now, 1}
end

return gcra_count(now, 1, #KEYS, 2)

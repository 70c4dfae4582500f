-- Closes one shard of a voucher's sale for a while: a sale about to be
-- loaded again from MySQL (src/seckill/sale_state/load.rs) admits nobody while
-- its orders on their way are read, so that no admission comes after that
-- read and goes uncounted by the load. The load rewrites the shard, its
-- own opening time with it; a load that dies leaves the shard to open
-- again by itself at the end of ARGV[1].
-- KEYS[1]: the shard's part of the sale ({tag}:voucher:<voucherId>)
-- ARGV[1]: how long to close it, in milliseconds
-- Returns nothing. A shard Redis does not hold is left alone.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], 'open_ms', now_ms + tonumber(ARGV[1]))

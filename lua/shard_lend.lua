-- Lends units of one shard of a voucher's sale to another shard whose
-- buyer found it empty (src/seckill/sale_state/stock_moves.rs): the units leave this
-- shard's stock and are recorded in transit, under the transfer's id, in
-- the same call. Whatever becomes of the caller afterwards, the record says
-- where they go: the receiving shard counts a transfer once by its id
-- (lua/shard_receive.lua), and the record is settled once it has
-- (lua/shard_settle.lua), by the mover or by whoever finds it stale.
-- KEYS[1]: the lending shard's part of the sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the lending shard's units in transit ({tag}:transit)
-- ARGV[1]: the voucher id
-- ARGV[2]: the voucher's sale token as MySQL has it
-- ARGV[3]: the receiving shard's table index
-- ARGV[4]: the transfer's id (random)
-- ARGV[5]: at most this many units
-- ARGV[6]: the receiving shard's epoch as its mover saw it: a shard of
--          another load lends nothing (shards that disagree are a sale
--          Redis partly forgot, which is loaded again, not moved between)
-- KEYS[3]: the lending shard's buyer set ({tag}:buyers:<voucherId>)
-- ARGV[7]: the lending shard's fence as the node knows MySQL's
-- A shard that cannot be trusted (lua/sale_fence.lua) lends nothing: its
-- units may be ones MySQL has sold. It answers {-1, ''}, and the sale is
-- loaded again.
-- Returns {units lent, the sale's epoch}: {0, ''} when the shard has no
-- unit (or no sale of this token); half its stock, rounded up, at most
-- ARGV[5], otherwise. A transfer id lends once: sent again while its
-- record stands, it is answered with the record.
-- The same transfer sent again (a cluster connection re-sends a call whose
-- reply it lost) lent already: answered with what it lent.
local lent = redis.call('HGET', KEYS[2], ARGV[4])
if lent then
  local _, _, units, epoch = string.match(lent, '^(%d+):(%d+):(%d+):([^:]*):(%d+)$')
  return {tonumber(units), epoch}
end
local sale = redis.call('HMGET', KEYS[1], 'stock', 'token', 'epoch', 'replid', 'buyers', 'seq')
if not sale[1] or (sale[2] or '0') ~= ARGV[2] then
  return {0, ''}
end
if sale_suspect(sale[4], sale[5], sale[6], KEYS[3], ARGV[7]) then
  return {-1, ''}
end
local stock = tonumber(sale[1])
if stock < 1 or (sale[3] or '') ~= ARGV[6] then
  return {0, ''}
end
local units = math.min(tonumber(ARGV[5]), math.ceil(stock / 2))
local epoch = sale[3] or ''
redis.call('HINCRBY', KEYS[1], 'stock', -units)
redis.call('HINCRBY', KEYS[1], 'lent', units)
redis.call('HINCRBY', KEYS[1], 'in_transit', units)
redis.call('HINCRBY', KEYS[1], 'moves', 1)
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[2], ARGV[4],
  ARGV[1] .. ':' .. ARGV[3] .. ':' .. units .. ':' .. epoch .. ':' .. now_ms)
return {units, epoch}

-- Admits one purchase of a flash sale, or refuses it, in one call (after
-- lua/gcra_count.lua): the purchase's limits, the sale window by Redis's own
-- clock, the stock, the one-order-per-user buyer set, the order's id, and
-- the hand-off of the admitted order, in one shard of
-- the sale (src/shards.rs): every key shares the shard's hash tag
-- (`{seckill}` for a one-shard sale), so the script is valid on a Redis
-- Cluster. A buyer always belongs to one shard: the buyer set is the
-- shard's, and "one order per user" stays one check.
-- KEYS[1]: the shard's part of the voucher's sale ({tag}:voucher:<voucherId>: stock, begin_ms,
--          end_ms, token, open_ms, and the fence fields replid, buyers, seq)
-- KEYS[2]: the voucher's buyer set ({tag}:buyers:<voucherId>)
-- KEYS[3]: the order stream ({tag}:orders)
-- KEYS[4]: the pending orders hash ({tag}:pending)
-- KEYS[5]: this attempt's answer, when kept: the buyer's Idempotency-Key
--          ({tag}:idempotency:<userId>:<key>), else a random attempt id
--          ({tag}:attempt:<attempt id>)
-- ARGV[1]: user id
-- ARGV[2]: voucher id
-- ARGV[3]: '1' to append the order to the stream (`stream` mode), '0' not (`queue`)
-- ARGV[4]: the voucher's sale token as MySQL has it
-- ARGV[5]: how long to keep this attempt's answer, in milliseconds; '0' keeps
--          none (no Idempotency-Key, on a connection that never sends a call
--          twice). A kept answer reads '<voucherId>:<orderId>'.
-- ARGV[6]: the order id's low word: top bit set, the shard's table index,
--          then a number from MySQL's id blocks (src/seckill/order_ids.rs),
--          which no Redis loss can hand out twice
-- ARGV[7]: the shard's fence as this node knows MySQL's: the highest
--          admission sequence number of an order MySQL has written
-- ARGV[8]: the admission's W3C trace context, written into the stream entry
--          as its `traceparent` field; '' (traces not exported) writes none
-- ARGV[9]: how many limits the purchase counts in this call, n (on a single
--          Redis; '0' on a Redis Cluster, whose slots part the keys, where
--          src/limits counts them in calls of its own first): their keys
--          KEYS[6..5+n], their intervals and windows ARGV[10..9+2n], as
--          lua/gcra_count.lua counts them. A purchase a limit refuses is
--          answered gcra_refused's {'limited', ...}, nothing else done.
-- A sale reloaded after Redis lost it opens at its `open_ms` (Redis's clock),
-- once writers holding orders admitted before the loss have counted them
-- again (lua/seckill_readmit.lua).
-- Before it answers anything from the sale, the script checks that Redis
-- still holds all it was told (lua/sale_fence.lua): a sale that fails is
-- refused with 9, 10 or 11, nothing done, and the node loads it again from
-- MySQL (src/seckill/sale_state/fence.rs).
-- Returns '<orderId>:<sequence>' when admitted (stock taken, user added to
-- the buyers, order appended if asked, order recorded as pending; the
-- sequence is the admission's number in the shard, which its writer
-- records in MySQL's fence), or an
-- integer refusal: 1 voucher not found, 2 not started, 3 ended, 4 sold out,
-- 5 already ordered (4 and 5 as far as this shard knows: the caller moves
-- stock from other shards before it answers sold out), 6 the sale in Redis is another voucher's (its token
-- differs: the id was reused), 7 reloaded and not open yet, 8 the
-- Idempotency-Key was first sent for another voucher, 9 Redis restarted or
-- failed over since the sale was loaded, 10 the buyer set lost members, 11
-- MySQL has written admissions this Redis does not hold. Nothing is written
-- unless it admits. A refusal is not kept: it changed nothing.
-- The same attempt again — a buyer who lost the answer sent the same
-- Idempotency-Key, or redis-rs's cluster connection sent the call anew after
-- a dropped connection — was admitted, and is answered 'again:<orderId>'
-- with the id it got.
-- Redis's clock, read once: the limits and the sale window count on it.
local now_us = gcra_now()
local limits = tonumber(ARGV[9])
if limits > 0 then
  local counted = gcra_count(now_us, 6, limits, 10)
  if counted[1] == 0 then
    return gcra_refused(counted)
  end
end
local kept = ARGV[5] ~= '0'
if kept then
  local answered = redis.call('GET', KEYS[5])
  if answered then
    local voucher, id = string.match(answered, '^(%d+):(%d+)$')
    if voucher ~= ARGV[2] then
      return 8
    end
    return 'again:' .. id
  end
end
local sale = redis.call('HMGET', KEYS[1], 'stock', 'begin_ms', 'end_ms', 'token', 'open_ms',
  'replid', 'buyers', 'seq')
-- HMGET answers `false` for a missing field: test for it before any
-- tonumber(), so a voucher missing in Redis is an answer, not a script error.
if not sale[1] or not sale[2] or not sale[3] then
  return 1
end
-- A sale stored before tokens existed has none: it is token 0's.
if (sale[4] or '0') ~= ARGV[4] then
  return 6
end
local suspect = sale_suspect(sale[6], sale[7], sale[8], KEYS[2], ARGV[7])
if suspect then
  return suspect
end
local now_s = math.floor(now_us / 1000000)
local now_ms = math.floor(now_us / 1000)
if sale[5] and now_ms < tonumber(sale[5]) then
  return 7
end
if now_ms < tonumber(sale[2]) then
  return 2
end
if now_ms > tonumber(sale[3]) then
  return 3
end
if tonumber(sale[1]) < 1 then
  return 4
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return 5
end

-- The id worker's layout (src/id_worker.rs), drawn here to spare a round
-- trip: seconds since 2022-01-01 UTC in the high 32 bits, the low word from
-- the node (ARGV[6]). Its top bit set keeps it apart from the id worker's
-- daily counter, the shard's table index below it from other shards', and
-- the block number below that repeats only after 2^24 ids.
local sequence = tonumber(ARGV[6])
local seconds = now_s - 1640995200
local low = seconds * 967296 + sequence
local high = seconds * 4294 + math.floor(low / 1000000)
local id = string.format('%.0f%06.0f', high, low % 1000000)

local admitted = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('HINCRBY', KEYS[1], 'buyers', 1)
redis.call('SADD', KEYS[2], ARGV[1])
if ARGV[3] == '1' then
  if ARGV[8] ~= '' then
    redis.call('XADD', KEYS[3], '*', 'id', id, 'userId', ARGV[1], 'voucherId', ARGV[2],
      'seq', admitted, 'traceparent', ARGV[8])
  else
    redis.call('XADD', KEYS[3], '*', 'id', id, 'userId', ARGV[1], 'voucherId', ARGV[2],
      'seq', admitted)
  end
end
redis.call('HSET', KEYS[4], id, ARGV[1] .. ':' .. ARGV[2] .. ':' .. admitted)
if kept then
  redis.call('SET', KEYS[5], ARGV[2] .. ':' .. id, 'PX', ARGV[5])
end
return id .. ':' .. admitted

-- Whether a shard of a sale still holds all that Redis was told, put in
-- front of the scripts that answer from it (lua/seckill.lua; the loads
-- compare the same fields, src/seckill/sale_state/fence.rs). MySQL is the
-- truth and Redis a cache that may forget: a restart from an AOF or an RDB
-- file, a failover to a replica that missed the last writes, an evicted
-- key. Each way leaves a mark the shard can be checked for in O(1):
--
-- `replid`: the server's replication id when the sale was loaded. Redis
--   draws a new one at every start and at every promotion of a replica, so
--   a sale kept through either (from an AOF, replicated) no longer matches
--   the server that holds it, however complete it looks.
-- `buyers`: how many members the buyer set has, counted beside it by every
--   script that adds or removes one: a set that lost members (or the whole
--   key) no longer matches.
-- `seq`: the shard's admissions, numbered; a writer records the highest
--   number it wrote in MySQL (`tb_seckill_voucher.sale_fence`), and the node
--   passes what it knows of it: a shard below it lost admissions MySQL has.

-- The server's replication id.
local function sale_replid()
  return string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
end

-- 9, 10 or 11 (the admission script's codes) when the shard cannot be
-- trusted, false when it can: `replid`, `buyers` and `seq` as HMGET read
-- them from the shard's hash, `buyers_key` its buyer set, `floor` MySQL's
-- fence as the node knows it.
local function sale_suspect(replid, buyers, seq, buyers_key, floor)
  if replid ~= sale_replid() then
    return 9
  end
  if tonumber(buyers or '-1') ~= redis.call('SCARD', buyers_key) then
    return 10
  end
  if tonumber(seq or '0') < tonumber(floor) then
    return 11
  end
  return false
end

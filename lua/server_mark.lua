-- Which Redis server holds a shard's keys, as the per-second probe reads
-- it (src/seckill/sale_state/server_probe.rs): run on a key of the shard,
-- so that a Redis Cluster runs it on the master of the shard's slot.
-- KEYS[1]: any key of the shard ({tag}:pending)
-- Returns {run_id, master_replid, master_repl_offset}: a restart draws a
-- new run id and replication id, a promoted replica a new replication id.
local server = redis.call('INFO', 'server')
local replication = redis.call('INFO', 'replication')
return {string.match(server, 'run_id:(%x+)'),
  string.match(replication, 'master_replid:(%x+)'),
  string.match(replication, 'master_repl_offset:(%d+)')}

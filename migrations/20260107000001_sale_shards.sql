-- How many shards the voucher's sale is split into in Redis
-- (src/seckill/shards.rs): 1 keeps every key of the sale under the hash tag
-- `{seckill}`; more spread its admissions over a Redis Cluster's masters.
-- Chosen when the voucher is created and kept with it, so that every node
-- splits the sale the same way. Not in hmdp's schema.
ALTER TABLE `tb_seckill_voucher`
  ADD COLUMN `shards` smallint unsigned NOT NULL DEFAULT 1 COMMENT '秒杀在Redis中的分片数';

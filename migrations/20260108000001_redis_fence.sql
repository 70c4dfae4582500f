-- Redis fenced by MySQL: what lets a node see that Redis forgot admissions
-- MySQL has written, and order ids that no Redis loss can hand out twice.
--
-- `sale_fence`: for each shard of the voucher's sale (keyed "s<index>", the
-- shard's table index), the highest admission sequence number of an order
-- written to MySQL. Every admission in Redis takes the next number of its
-- shard's sequence (lua/seckill.lua); the transaction that writes orders
-- raises the fence in the `UPDATE` of the stock row it runs anyway, so a
-- Redis whose sequence is below MySQL's fence lost admissions MySQL has,
-- and the sale is closed and loaded again (src/seckill/sale_state/fence.rs).
--
-- `tb_order_id_block`: the order ids of `queue` and `stream`, handed out in
-- blocks, a block a node at a time (src/seckill/order_ids.rs). Redis may go
-- back; this counter only moves forward. Not in hmdp's schema.
ALTER TABLE `tb_seckill_voucher`
  ADD COLUMN `sale_fence` varchar(2048) NOT NULL DEFAULT '{}' COMMENT '各分片已写入MySQL的最高准入序号';

CREATE TABLE IF NOT EXISTS `tb_order_id_block` (
  `name` varchar(32) NOT NULL COMMENT '序列名',
  `next_value` bigint(20) UNSIGNED NOT NULL COMMENT '下一个未分配的值',
  PRIMARY KEY (`name`) USING BTREE
) ENGINE = InnoDB CHARACTER SET = utf8mb4 COLLATE = utf8mb4_general_ci;

-- `idempotency_key_digest`: the synchronous purchase's Idempotency-Key, as
-- the first 8 bytes of its SHA-256, written with the order: the key's answer
-- kept in Redis may be lost with Redis, and the order MySQL wrote for the
-- key answers it then (src/seckill/sync_purchase.rs).
ALTER TABLE `tb_voucher_order`
  ADD COLUMN `idempotency_key_digest` bigint(20) UNSIGNED NULL DEFAULT NULL COMMENT '同步下单的幂等键摘要';

INSERT IGNORE INTO `tb_order_id_block` (`name`, `next_value`) VALUES ('order', 1);

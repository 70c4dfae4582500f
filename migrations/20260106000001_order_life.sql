-- The order's life after the sale: pay, cancel, the unpaid-order timeout.
--
-- `idx_status_create` serves the sweep that closes unpaid orders past their
-- deadline (`status = 1 AND create_time < ?`) that Redis lost the due time
-- of, and the count of orders by status.
--
-- `tb_order_giveback` is the give-back owed to Redis: the transaction that
-- closes an order (status 4) puts its unit back in MySQL's stock and
-- records the order here; the row is deleted once the unit and the buyer's
-- turn are back in the Redis sale (`lua/giveback.lua`, keyed by the order
-- id, so a give-back sent twice counts once). A node killed between the two
-- leaves the row, which any node's relay sends again; a sale reloaded from
-- MySQL meanwhile already counts the unit, and marks every closed order as
-- given back. Not in hmdp's schema.
ALTER TABLE `tb_voucher_order`
  ADD INDEX `idx_status_create` (`status`, `create_time`) USING BTREE;

CREATE TABLE IF NOT EXISTS `tb_order_giveback` (
  `order_id` bigint(20) NOT NULL COMMENT '已关闭的订单id',
  `voucher_id` bigint(20) UNSIGNED NOT NULL COMMENT '代金券id',
  `user_id` bigint(20) UNSIGNED NOT NULL COMMENT '下单的用户id',
  `create_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP COMMENT '关闭时间',
  PRIMARY KEY (`order_id`) USING BTREE,
  INDEX `idx_voucher` (`voucher_id`) USING BTREE,
  INDEX `idx_create` (`create_time`) USING BTREE
) ENGINE = InnoDB CHARACTER SET = utf8mb4 COLLATE = utf8mb4_general_ci;

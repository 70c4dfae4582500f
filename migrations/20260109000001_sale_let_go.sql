-- `sale_loaded` now says whether Redis is meant to hold the voucher's sale:
-- set by its load, cleared when the reconciler lets an ended sale go
-- (src/seckill/sale_state/reconcile/let_go.rs: ended by Redis's clock,
-- nothing on its way, no unpaid order left to close, no give-back owed; its
-- keys then expire). A sale Redis is not meant to hold has no order in any
-- writer's hands, so loading it again is a first load, which opens at once.
-- The reconciler reads the sales Redis is meant to hold every round: the
-- index keeps that one statement cheap however many sales have ended.
-- Not in hmdp's schema.
ALTER TABLE `tb_seckill_voucher`
  MODIFY COLUMN `sale_loaded` tinyint(1) NOT NULL DEFAULT 0 COMMENT '秒杀是否应在Redis中',
  ADD INDEX `idx_sale_loaded` (`sale_loaded`) USING BTREE;

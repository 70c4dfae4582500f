-- Whether the voucher's sale has ever been loaded into Redis. A sale loaded
-- again (Redis lost it) may have orders admitted before the loss still in
-- writers' hands, so it opens only once they could count them again; a
-- sale loaded for the first time has had no admission, so it opens at once.
-- Not in hmdp's schema.
ALTER TABLE `tb_seckill_voucher`
  ADD COLUMN `sale_loaded` tinyint(1) NOT NULL DEFAULT 0 COMMENT '秒杀是否曾载入Redis';

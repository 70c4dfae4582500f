-- A random token per seckill voucher, drawn when it is created and stored
-- with its sale in Redis: a Redis sale whose token differs belongs to an
-- earlier voucher of the same id (a database reset or restored while Redis
-- kept its keys), and is replaced, never sold from. Vouchers created before
-- this column read 0, as do their Redis sales, which carry no token.
-- Not in hmdp's schema.
ALTER TABLE `tb_seckill_voucher`
  ADD COLUMN `sale_token` bigint(20) UNSIGNED NOT NULL DEFAULT 0 COMMENT '秒杀在Redis中的身份';

-- Fencing tokens (`--fencing`): the newest lock token that wrote for each
-- user. The purchase transaction's first statement moves it forward only
-- (`... WHERE token < ?`), so a holder whose lock passed to a newer holder
-- while it was paused is refused, and the row lock orders the purchases of
-- one user by token. Not in hmdp's schema.
CREATE TABLE IF NOT EXISTS `tb_lock_fence` (
  `user_id` bigint(20) UNSIGNED NOT NULL COMMENT '用户id',
  `token` bigint(20) UNSIGNED NOT NULL COMMENT '最新的锁令牌',
  `update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP COMMENT '更新时间',
  PRIMARY KEY (`user_id`) USING BTREE
) ENGINE = InnoDB CHARACTER SET = utf8mb4 COLLATE = utf8mb4_general_ci;

-- What a load finds of one shard of a sale (src/seckill/sale_state/load.rs),
-- after lua/sale_fence.lua: whether Redis holds it, of which token and
-- load, and whether it can be trusted.
-- KEYS[1]: the shard's part of the sale ({tag}:voucher:<voucherId>)
-- KEYS[2]: the shard's buyer set ({tag}:buyers:<voucherId>)
-- ARGV[1]: the shard's fence as the node knows MySQL's
-- Returns {stock, token, epoch, suspect}: `false` for a field the shard
-- lacks (all three when Redis does not hold it), suspect the code
-- lua/sale_fence.lua answers (9, 10, 11) or 0.
local sale = redis.call('HMGET', KEYS[1], 'stock', 'token', 'epoch', 'replid', 'buyers', 'seq')
if not sale[1] then
  return {false, false, false, 0}
end
return {sale[1], sale[2], sale[3],
  sale_suspect(sale[4], sale[5], sale[6], KEYS[2], ARGV[1]) or 0}

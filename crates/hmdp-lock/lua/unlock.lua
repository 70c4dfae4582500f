-- unlock.lua: owner-checked release of a simple lock (lock v3). The check and
-- the delete run as one step inside Redis, so no lease can run out between them.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the caller's owner token
-- returns   1  released: the key held the caller's token and is deleted
--           0  expired: the key is gone
--          -1  not the owner: another token holds the key, which is left alone
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
if holder == false then
    return 0
end
return -1

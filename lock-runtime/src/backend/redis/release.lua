-- release.lua: releases a held lock, for its owner only, and announces it if someone waits.
--
-- KEYS[1]  the lock key, `lock:{<key>}`
-- KEYS[2]  the lock's release channel, `lock:{<key>}:released` (same hash tag)
-- ARGV[1]  the owner id the lock was granted to
--
-- Returns  1   released: the key was deleted, and if its value was marked waited on (the owner
--              id followed by `+`, see acquire.lua) the owner id was published on KEYS[2]
--          0   the key is gone (the lease ran out, or it was deleted)
--          -1  the key holds another owner's id (left untouched)
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  redis.call('del', KEYS[1])
  return 1
end
if holder == ARGV[1] .. '+' then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
if holder == false then
  return 0
end
return -1

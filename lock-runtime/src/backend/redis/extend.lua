-- extend.lua: renews a held lock's lease, for its owner only.
--
-- KEYS[1]  the lock key, `lock:{<key>}`
-- ARGV[1]  the owner id the lock was granted to
-- ARGV[2]  the new lease in milliseconds, counted from now
--
-- Returns  1   extended (the value, and any waited-on mark `+` after the owner id, are kept)
--          0   the key is gone (the lease ran out, or it was deleted)
--          -1  the key holds another owner's id
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] or holder == ARGV[1] .. '+' then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
if holder == false then
  return 0
end
return -1

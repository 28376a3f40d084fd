-- extend.lua: renews a held lock's lease, for its owner only.
--
-- KEYS[1]  the lock key, `lock:{<key>}` (`<owner>#<token>#<granted ms>[+]`, see acquire.lua)
-- ARGV[1]  the owner the lock was granted to (acquire.lua's ARGV[1])
-- ARGV[2]  the new lease in milliseconds, counted from now
--
-- Returns  1   extended (the value, and any waited-on mark `+`, are kept)
--          0   the key is gone (the lease ran out, or it was deleted)
--          -1  the key holds another owner
local holder = redis.call('get', KEYS[1])
if holder == false then
  return 0
end
local mine = ARGV[1] .. '#'
if string.sub(holder, 1, #mine) == mine then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
return -1

-- release.lua: releases a held lock, for its owner only, and announces it if someone waits.
--
-- Defines `release(KEYS[1], ARGV[1], ARGV[2])`: the script sent alone ends with that call (see
-- mod.rs); handoff.lua calls it before granting the lock to the releasing process's next
-- waiter.
--
-- KEYS[1]  the lock key, `lock:{<key>}` (`<owner>#<token>#<granted ms>[+]`, see acquire.lua)
-- ARGV[1]  the owner the lock was granted to (acquire.lua's ARGV[1])
-- ARGV[2]  the lock's release channel, `lock:{<key>}:released` (an argument, not a key: it is no key to
--          Redis Cluster, so a slot being migrated never refuses the script for it)
--
-- Returns  1   released: the key was deleted, and if its value was marked waited on (ending
--              in `+`, see acquire.lua) the owner was published on ARGV[2]
--          0   the key is gone (the lease ran out, or it was deleted)
--          -1  the key holds another owner (left untouched)
local function release(lock, owner, channel)
  local holder = redis.call('get', lock)
  if holder == false then
    return 0
  end
  local mine = owner .. '#'
  if string.sub(holder, 1, #mine) ~= mine then
    return -1
  end
  redis.call('del', lock)
  if string.sub(holder, -1) == '+' then
    redis.call('publish', channel, owner)
  end
  return 1
end

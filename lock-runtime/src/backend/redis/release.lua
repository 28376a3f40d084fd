-- release.lua: releases a held lock, for its owner only, and announces it if someone waits;
-- with a queue, grants it to the first waiting process queued in the lock's slot instead.
--
-- Defines `release(KEYS[1], ARGV[1], ARGV[2], KEYS[2], KEYS[3], now)`: the script sent alone
-- ends with that call (see mod.rs); handoff.lua calls it before granting the lock to the
-- releasing process's next waiter, with the server's `TIME` it read already (`now`, else read
-- here when needed). Composed after acquire.lua and queue.lua.
--
-- KEYS[1]  the lock key, `lock:{<key>}` (`<owner>#<token>#<granted ms>[#q][+]`, see acquire.lua)
-- KEYS[2]  optional: the lock's queue, `lock:{<key>}:queue` (see queue.lua); the function
--          also takes `true` for `<lock key>:queue`, named only if needed (batch.lua)
-- KEYS[3]  with KEYS[2]: the fencing counter (acquire.lua's KEYS[2])
-- ARGV[1]  the owner the lock was granted to (acquire.lua's ARGV[1])
-- ARGV[2]  the lock's release channel, `lock:{<key>}:released` (an argument, not a key: it is no key to
--          Redis Cluster, so a slot being migrated never refuses the script for it); the
--          function takes `nil` for `<lock key>:released`, named only if needed (batch.lua)
--
-- Returns  1   released: the key was deleted, and if its value was marked waited on (ending
--              in `+`, see acquire.lua) either granted to the queue's first live entry (and
--              that grant announced, see queue.lua) or the owner published on ARGV[2]
--          0   the key is gone (the lease ran out, or it was deleted)
--          -1  the key holds another owner (left untouched)
--          With a queue, any entry of ARGV[1] in it is removed (an acquisition dropped while
--          it waited undoes its entry with this script). `release` returns the owner granted
--          from the queue, its token and its claim window's milliseconds left after its answer
--          (a script's reply is the first).
local function release(lock, owner, channel, queue, fence, now)
  local holder = redis.call('get', lock)
  -- `<owner>#` in front: compared in place (no string made for it, nor for a part of the value).
  local ours = holder ~= false and string.byte(holder, #owner + 1) == 35 and string.find(holder, owner, 1, true) == 1
  -- '+' last: waited on.
  local waited = holder ~= false and string.byte(holder, -1) == 43
  if queue == true then
    queue = nil
    if not ours or waited then
      queue = lock .. ':queue'
    end
  end
  if not ours then
    if queue then
      redis.call('hdel', queue, owner)
    end
    if holder == false then
      return 0
    end
    return -1
  end
  redis.call('del', lock)
  if waited then
    channel = channel or (lock .. ':released')
    if queue then
      local grantee, token, left = grant_next(lock, fence, queue, channel, owner, now or redis.call('time'))
      if grantee then
        return 1, grantee, token, left
      end
    end
    redis.call('publish', channel, owner)
  end
  return 1
end

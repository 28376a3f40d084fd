-- handoff.lua: a holder's release that grants the lock, in the same atomic step, to the next
-- waiter of the holder's own process (see handoff.rs), so that the waiter holds it one round
-- trip after the release was sent instead of two. Composed after release.lua and acquire.lua,
-- whose functions it calls: the release is exactly release.lua's (owner-checked, announced if
-- someone waits), and the grant exactly acquire.lua's (a token of its own, never below the
-- server's clock in microseconds).
--
-- KEYS[1]  the lock key, `lock:{<key>}`
-- KEYS[2]  the fencing counter of its hash slot (acquire.lua's KEYS[2])
-- ARGV[1]  the releasing owner (release.lua's ARGV[1])
-- ARGV[2]  the lock's release channel (release.lua's ARGV[2])
-- ARGV[3]  the waiter's owner (acquire.lua's ARGV[1])
-- ARGV[4]  the waiter's lease in milliseconds (acquire.lua's ARGV[2])
--
-- Returns  {released, status, value}: `released` release.lua's answer (1, 0 or -1), then
--          acquire.lua's answer for the waiter: {1, token} granted, {0, pttl} held by someone
--          else (when the release found the lock another owner's)
local released = release(KEYS[1], ARGV[1], ARGV[2])
local granted = acquire(KEYS[1], KEYS[2], ARGV[3], ARGV[4], nil, redis.call('time'))
return {released, granted[1], granted[2]}

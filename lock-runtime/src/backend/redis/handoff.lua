-- handoff.lua: a holder's release that grants the lock, in the same atomic step, to the next
-- waiter of the holder's own process (see handoff.rs), so that the waiter holds it one round
-- trip after the release was sent instead of two. Composed after acquire.lua, queue.lua and
-- release.lua, whose functions it calls: the release is exactly release.lua's (owner-checked,
-- granted to the queue's first live entry or announced if someone waits), and the grant
-- exactly acquire.lua's (a token of its own, never below the server's clock in microseconds).
-- A waiter of another process queued in the lock's slot thus goes first (the waiter here is
-- queued, or has its entry renewed, instead); the queue's entry of the waiter here is granted
-- again at once.
--
-- KEYS[1]  the lock key, `lock:{<key>}`
-- KEYS[2]  the fencing counter of its hash slot (acquire.lua's KEYS[2])
-- KEYS[3]  optional: the lock's queue (queue.lua; not on a Cluster, see cluster.md)
-- ARGV[1]  the releasing owner (release.lua's ARGV[1])
-- ARGV[2]  the lock's release channel (release.lua's ARGV[2])
-- ARGV[3]  the waiter's owner (acquire.lua's ARGV[1])
-- ARGV[4]  the waiter's lease in milliseconds (acquire.lua's ARGV[2])
-- ARGV[5]  the waiter's claim window in milliseconds (queue.lua's `window`), or '' (none)
-- ARGV[6]  '1' when the waiter may have an entry in the queue (queue.lua's `registered`)
--
-- Returns  {released, status, value}: `released` release.lua's answer (1, 0 or -1), then
--          acquire.lua's answer for the waiter: {1, token} granted, {0, pttl} held by someone
--          else (when the release found the lock another owner's, or granted it from the queue)
local now = redis.call('time')
local released, grantee, _, left = release(KEYS[1], ARGV[1], ARGV[2], KEYS[3], KEYS[2], now)
local status, value
if grantee and grantee ~= ARGV[3] then
  -- Granted from the queue to another process's waiter: the lock is that grant's until its
  -- claim deadline, `left` ms from now, and marked waited on (`#q+`, its release is
  -- announced), which is all an attempt would find out; the waiter here only registers.
  status, value = 0, left
else
  -- Granted from the queue already (the waiter's own entry): claimed here at once, as acquire
  -- claims any grant of its owner (the grant's token, the waiter's own lease, no `#q` left).
  status, value = attempt(KEYS[1], KEYS[2], ARGV[3], ARGV[4], nil, now)
end
if grantee ~= ARGV[3] then
  queued(KEYS[3], ARGV[3], {status, value}, ARGV[5], ARGV[6], now)
end
return {released, status, value}

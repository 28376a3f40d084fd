-- acquire.lua: one attempt to take a lock, minting its fencing token; an attempt that finds
-- the lock held marks it as waited on, so that its release is announced.
--
-- KEYS[1]  the lock key, `lock:{<key>}` (a string holding the owner id, followed by `+` once
--          someone waits for it; expires with the lease)
-- KEYS[2]  the fencing counter of the lock key's hash slot, `lock:fence:{<slot tag>}` (same slot)
-- ARGV[1]  the owner id: unique to this acquisition
-- ARGV[2]  the lease in milliseconds
--
-- Returns  {1, token}  acquired: `token` is the counter's next value, strictly greater than
--                      every token handed out before for any key of this slot
--          {0, pttl}   held by someone else (now marked waited on); `pttl` is its remaining
--                      lease in milliseconds (-1 if the key has no expiry)
--
-- Why the mark: release.lua publishes only for a marked value. The mark is set in the same
-- atomic step that sees the lock held, so a release either comes before that step (and this
-- attempt takes the lock) or after it (and publishes). APPEND keeps the key's expiry.
-- A value already holding this owner id (an earlier attempt of the same acquisition took the
-- lock but its answer was lost) is granted again, with a fresh lease and token.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('incr', KEYS[2])}
end
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] or holder == ARGV[1] .. '+' then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, redis.call('incr', KEYS[2])}
end
if type(holder) == 'string' and string.sub(holder, -1) ~= '+' then
  redis.call('append', KEYS[1], '+')
end
return {0, redis.call('pttl', KEYS[1])}

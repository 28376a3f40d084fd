-- acquire.lua: one attempt to take a lock, minting its fencing token.
--
-- KEYS[1]  the lock key, `lock:{<key>}` (a string holding the owner id; expires with the lease)
-- KEYS[2]  the fencing counter of the lock key's hash slot, `lock:fence:{<slot tag>}` (same slot)
-- ARGV[1]  the owner id: unique to this acquisition
-- ARGV[2]  the lease in milliseconds
--
-- Returns  {1, token}  acquired: `token` is the counter's next value, strictly greater than
--                      every token handed out before for any key of this slot
--          {0, pttl}   held by someone else; `pttl` is its remaining lease in milliseconds
--                      (-1 if the key has no expiry)
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('incr', KEYS[2])}
end
return {0, redis.call('pttl', KEYS[1])}

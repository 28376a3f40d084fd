-- inspect.lua: a lock's value, its remaining lease and the server's time, read at one instant
-- (what `lockctl` and an election's `leader()` read). A script rather than MULTI/EXEC: the least
-- ACL of the README (which allows EVAL, GET, PTTL and TIME, and no MULTI) runs it.
--
-- KEYS[1]  the lock key, `lock:{<key>}`
--
-- Returns  {value, pttl, {seconds, microseconds}}, the value nil when the key is gone
return {redis.call('get', KEYS[1]) or false, redis.call('pttl', KEYS[1]), redis.call('time')}

-- inspect_kinds.lua: the state of a read-write lock or a semaphore, its remaining life and the
-- server's time, read at one instant (what `lockctl` lists). Reads only.
--
-- KEYS[1]  the kind's state, `lock:rw:{<key>}` or `lock:sem:{<key>}` (see kind_acquire.lua)
--
-- Returns  {fields, pttl, {seconds, microseconds}}: the state's fields and values in turn
--          (HGETALL; empty when the key is gone), its PTTL and the server's clock
return {redis.call('hgetall', KEYS[1]), redis.call('pttl', KEYS[1]), redis.call('time')}

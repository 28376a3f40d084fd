-- inspect.lua: a lock's value, its remaining lease and the server's time, read at one instant
-- (what `lockctl` reads), with the live entries of the lock's queue. A script rather than
-- MULTI/EXEC: the least ACL of the README (which allows EVAL, GET, PTTL and TIME, and no MULTI)
-- runs it.
--
-- KEYS[1]  the lock key, `lock:{<key>}`
-- KEYS[2]  optional: the lock's queue of waiting processes, `lock:{<key>}:queue` (queue.lua)
--
-- Returns  {value, pttl, {seconds, microseconds}, queued}, the value nil when the key is gone;
--          `queued` the queue's entries not run out (nil without KEYS[2], or for a user whose
--          ACL does not allow HGETALL)
local time = redis.call('time')
local queued = false
if KEYS[2] then
  local entries = redis.pcall('hgetall', KEYS[2])
  if not entries.err then
    local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    queued = 0
    -- An entry is `<first µs>:<expiry ms>` (queue.lua).
    for i = 2, #entries, 2 do
      local expiry = tonumber(string.match(entries[i], ':(%d+)$'))
      if expiry and expiry > now_ms then
        queued = queued + 1
      end
    end
  end
end
return {redis.call('get', KEYS[1]) or false, redis.call('pttl', KEYS[1]), time, queued}

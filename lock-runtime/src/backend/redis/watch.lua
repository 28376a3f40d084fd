-- watch.lua: a waiter's look at a lock once its release channel is subscribed; marks the lock
-- as waited on (see acquire.lua), so that its release is announced.
--
-- KEYS[1]  the lock key, `lock:{<key>}`
--
-- Returns  -2    the key is gone: the lock is free
--          pttl  the holder's remaining lease in milliseconds (-1 if the key has no expiry);
--                the value is now marked waited on
local holder = redis.call('get', KEYS[1])
if holder == false then
  return -2
end
if type(holder) == 'string' and string.sub(holder, -1) ~= '+' then
  redis.call('append', KEYS[1], '+')
end
return redis.call('pttl', KEYS[1])

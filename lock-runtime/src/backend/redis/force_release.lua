-- force_release.lua: frees a lock whatever holds it (an operator's `lockctl release --force`),
-- and wakes its waiters as release.lua does. The holder finds its key gone at its next renewal
-- or release and reports the lock lost.
--
-- KEYS[1]  the lock key, `lock:{<key>}` (`<owner>#<token>#<granted ms>[+]`, see acquire.lua)
-- ARGV[1]  the owner expected to hold it (acquire.lua's ARGV[1]), or '' for any owner
-- ARGV[2]  the lock's release channel, `lock:{<key>}:released` (an argument, not a key: it is no key to
--          Redis Cluster, so a slot being migrated never refuses the script for it)
--
-- Returns  {1, owner}  released: the key was deleted and the owner published on ARGV[2]
--                      (always: a waiter that has not marked the value yet may be subscribed)
--          {0, ''}     the key is gone: nobody holds the lock
--          {-1, owner} the key holds another owner than ARGV[1] (left untouched)
local holder = redis.call('get', KEYS[1])
if holder == false then
  return {0, ''}
end
-- The owner: the value up to its first `#` (a value of an older version: all of it, less a
-- trailing `+`).
local owner = string.match(holder, '^([^#]*)#')
if owner == nil then
  owner = string.gsub(holder, '%+$', '')
end
if ARGV[1] ~= '' and owner ~= ARGV[1] then
  return {-1, owner}
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], owner)
return {1, owner}

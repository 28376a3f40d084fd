-- release_after.lua: lets go of a held lock but keeps its name taken for a remainder
-- (`hold_at_least`), for its owner only: the key's expiry is set to the remainder,
-- counted by the server's clock, instead of deleting the key; waiters are told, so that they
-- look again and learn the new expiry.
--
-- KEYS[1]  the lock key, `lock:{<key>}` (`<owner>#<token>#<granted ms>[+]`, see acquire.lua)
-- ARGV[1]  the owner the lock was granted to (acquire.lua's ARGV[1])
-- ARGV[2]  the remainder in milliseconds, counted from now (at least 1)
-- ARGV[3]  the lock's release channel, `lock:{<key>}:released` (an argument, not a key: it is no key to
--          Redis Cluster, so a slot being migrated never refuses the script for it)
--
-- Returns  1   done: the key now expires after ARGV[2] ms, its value unchanged; if it was
--              marked waited on (ending in `+`), the owner was published on ARGV[3]
--          0   the key is gone (the lease ran out, or it was deleted)
--          -1  the key holds another owner (left untouched)
local holder = redis.call('get', KEYS[1])
if holder == false then
  return 0
end
local mine = ARGV[1] .. '#'
if string.sub(holder, 1, #mine) ~= mine then
  return -1
end
-- Set, not only shortened: a watchdog lease shorter than the remainder (its renewals stop
-- with this call) is stretched to it, as the holder asked.
redis.call('pexpire', KEYS[1], ARGV[2])
if string.sub(holder, -1) == '+' then
  redis.call('publish', ARGV[3], ARGV[1])
end
return 1

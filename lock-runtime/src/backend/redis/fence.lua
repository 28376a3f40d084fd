-- fence.lua: raises a Redlock node's fencing counter to the token a quorum granted, while this
-- node still holds the lock for the caller (see redlock.rs: strictly increasing tokens across
-- quorums).
--
-- KEYS[1]  the lock key, `lock:{<key>}` (`<owner>#<token>#<granted ms>[+]`, see acquire.lua)
-- KEYS[2]  the fencing counter of the lock key's hash slot, `lock:fence:{<slot tag>}`
-- ARGV[1]  the owner the lock was granted to (acquire.lua's ARGV[1])
-- ARGV[2]  the combined token: the largest token the granting nodes minted
-- ARGV[3]  optional: `any` raises whoever holds the key (a node that refused the caller's
--          attempt: raising a counter is always safe, it only makes later tokens larger)
--
-- Returns  1  the key holds this owner, and the counter is now at least ARGV[2] (never lowered)
--          2  (`any`) the counter is now at least ARGV[2]
--          0  the key is gone or holds another owner: nothing changed, and this node does not
--             count toward the caller's quorum
local want = tonumber(ARGV[2])
if ARGV[3] == 'any' then
  local have = tonumber(redis.call('get', KEYS[2])) or 0
  if have < want then
    redis.call('set', KEYS[2], string.format('%d', want))
  end
  return 2
end
local holder = redis.call('get', KEYS[1])
local mine = ARGV[1] .. '#'
if holder == false or string.sub(holder, 1, #mine) ~= mine then
  return 0
end
local have = tonumber(redis.call('get', KEYS[2])) or 0
if have < want then
  redis.call('set', KEYS[2], string.format('%d', want))
end
return 1

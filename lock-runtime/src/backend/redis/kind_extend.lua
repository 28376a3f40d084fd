-- kind_extend.lua: renews a reader's, writer's or permit holder's lease, for its owner only.
--
-- KEYS[1]  the kind's state, `lock:rw:{<key>}` or `lock:sem:{<key>}` (see kind_acquire.lua)
-- ARGV[1]  the owner (kind_acquire.lua's ARGV[1])
-- ARGV[2]  the new lease in milliseconds, counted from now (by the server's clock)
--
-- Returns  1  extended (the entry's token and mode are kept; the key lives at least as long)
--          0  the owner holds nothing within its lease (it expired, or was removed)
if redis.replicate_commands then
  redis.replicate_commands()
end

local t = redis.call('time')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local mine_h = 'h:' .. ARGV[1]
local lease = tonumber(ARGV[2])
local held = redis.call('hget', KEYS[1], mine_h)
if not held then
  return 0
end
local expiry = tonumber(string.match(held, '^(%d+)')) or 0
if expiry <= now then
  return 0
end
local rest = string.match(held, '^%d+(#.*)$') or ''
redis.call('hset', KEYS[1], mine_h, string.format('%d', now + lease) .. rest)
if redis.call('pttl', KEYS[1]) < lease then
  redis.call('pexpire', KEYS[1], lease)
end
return 1

-- check.lua: which of the given locks their owners still hold, asked at once after a
-- connection to the server was lost (a restart without persistence, a failover or a flush
-- may have dropped them). Reads only.
--
-- KEYS[1], KEYS[2], … (KEYS[i])
--          a mutex's key `lock:{<key>}` (see acquire.lua) or a kind's state `lock:rw:{<key>}`
--          / `lock:sem:{<key>}` (see kind_acquire.lua); all in one hash slot on a Cluster
-- ARGV[1], ARGV[2], … (ARGV[i])
--          `M` (a mutex) or `K` (another kind), then the owner the i-th lock was granted to
--
-- Returns  an array with, for each key in order, 1 while its owner holds it (a mutex: the key
--          starts with `<owner>#`; another kind: the owner's entry is within its lease by the
--          server's clock), 0 when it does not
local t = redis.call('time')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local owner = string.sub(ARGV[i], 2)
  local held = 0
  if string.sub(ARGV[i], 1, 1) == 'M' then
    local value = redis.call('get', key)
    if value and string.sub(value, 1, #owner + 1) == owner .. '#' then
      held = 1
    end
  else
    local entry = redis.call('hget', key, 'h:' .. owner)
    if entry and (tonumber(string.match(entry, '^(%d+)')) or 0) > now then
      held = 1
    end
  end
  out[i] = held
end
return out

-- kind_release.lua: releases a reader's, writer's or permit holder's entry (or keeps it for a
-- remainder, `hold_at_least`), for its owner only, drops the owner's writer intent, and
-- announces it if someone waits. Also undoes a dropped acquisition (its attempt may have
-- been granted, or it left an intent).
--
-- KEYS[1]  the kind's state, `lock:rw:{<key>}` or `lock:sem:{<key>}` (see kind_acquire.lua)
-- ARGV[1]  the owner (kind_acquire.lua's ARGV[1])
-- ARGV[2]  0 to release now; else a remainder in milliseconds: the entry stays (and keeps
--          its place) until then, counted by the server's clock, and is freed by its expiry
-- ARGV[3]  the name's release channel, `<KEYS[1]>:released` (an argument, not a key: it is no key to
--          Redis Cluster, so a slot being migrated never refuses the script for it)
--
-- Returns  1  released (or kept for the remainder); if the state was marked waited on, the
--             owner was published on ARGV[3]
--          0  the owner held nothing within its lease (expired, pruned, or never granted);
--             anything of it left is removed all the same
if redis.replicate_commands then
  redis.replicate_commands()
end

local t = redis.call('time')
local now = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
local mine_h = 'h:' .. ARGV[1]
local mine_w = 'w:' .. ARGV[1]
local remainder = tonumber(ARGV[2]) or 0

local held = redis.call('hget', KEYS[1], mine_h)
local ok = 0
if held then
  local expiry = tonumber(string.match(held, '^(%d+)')) or 0
  if expiry > now then
    ok = 1
  end
end
if ok == 1 and remainder > 0 then
  local rest = string.match(held, '^%d+(#.*)$') or ''
  redis.call('hset', KEYS[1], mine_h, string.format('%d', now + remainder) .. rest)
elseif held then
  redis.call('hdel', KEYS[1], mine_h)
end
local intent = redis.call('hdel', KEYS[1], mine_w)

-- Prune what expired; the key goes with its last entry (and with it the mark).
local marked = false
local live = false
local latest = now
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  local kind = string.sub(f, 1, 2)
  if f == 'mark' then
    marked = true
  elseif kind == 'h:' or kind == 'w:' then
    local expiry = tonumber(string.match(v, '^(%d+)')) or 0
    if expiry <= now then
      redis.call('hdel', KEYS[1], f)
    else
      live = true
      latest = math.max(latest, expiry)
    end
  end
end
if live then
  redis.call('pexpire', KEYS[1], latest - now)
else
  redis.call('del', KEYS[1])
end
if marked and (held or intent == 1) then
  redis.call('publish', ARGV[3], ARGV[1])
end
return ok

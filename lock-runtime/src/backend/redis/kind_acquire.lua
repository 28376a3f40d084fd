-- kind_acquire.lua: one attempt to take a read lock, a write lock or a semaphore permit,
-- minting its fencing token; an attempt that finds no room marks the state as waited on (so
-- that releases are announced), and a writer that finds no room records its intent, which
-- keeps new readers out (no writer starvation, across processes too).
--
-- KEYS[1]  the kind's state, a hash `lock:rw:{<key>}` (read-write lock) or `lock:sem:{<key>}`
--          (semaphore), with the fields:
--            `h:<owner>`  a holder: `<expiry ms>#<R|W|S>#<token>#<granted ms>`
--            `w:<owner>`  a waiting writer's intent: `<expiry ms>` (renewed by its attempts)
--            `permits`    the semaphore's permits, agreed by all its holders
--            `mark`       someone waits: releases publish on the name's channel
--          Times are the server's clock (`TIME`) in milliseconds; entries past their expiry
--          are pruned here, so a crashed holder or waiter blocks nobody past its lease. The
--          key expires with its last entry.
-- KEYS[2]  the fencing counter: the server's, `lock:fence` (one server, Sentinel), or on a
--          Cluster the one of the name's hash slot, `lock:fence:{<slot tag>}` (same slot,
--          shared with the mutex: see acquire.lua)
-- ARGV[1]  the owner: unique to this acquisition (`<owner id>@<host>/<pid>[/<label>]`)
-- ARGV[2]  the lease in milliseconds (also the life of a writer's intent)
-- ARGV[3]  the mode: `R` (reader), `W` (writer) or `S` (semaphore permit)
-- ARGV[4]  the semaphore's permits (at least 1; ignored for `R` and `W`)
--
-- Returns  {1, token}     acquired: `token` as acquire.lua mints it (one above the slot's
--                         counter, never below the server's clock in microseconds)
--          {0, wait}      no room (now marked waited on); `wait` is how long, in
--                         milliseconds, until the earliest entry in the way expires (for a
--                         writer at most a third of its lease: it attempts again by then,
--                         which renews its intent)
--          {-1, permits}  a semaphore held with another number of permits (nothing changed)
--
-- Room: a reader, when no other writer holds and no other writer's intent lives; a writer,
-- when nobody else holds; a permit, when fewer than `permits` others hold. An entry of this
-- owner (an earlier attempt whose answer was lost) is granted again, with a fresh token.

if redis.replicate_commands then
  redis.replicate_commands()
end

local t = redis.call('time')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(clock / 1000)
local lease = tonumber(ARGV[2])
local mode = ARGV[3]
local mine_h = 'h:' .. ARGV[1]
local mine_w = 'w:' .. ARGV[1]

local fields = redis.call('hgetall', KEYS[1])
local holders, writers, intents = 0, 0, 0
local earliest = nil
local latest = now
local stored = nil
for i = 1, #fields, 2 do
  local f, v = fields[i], fields[i + 1]
  local kind = string.sub(f, 1, 2)
  if f == 'permits' then
    stored = tonumber(v)
  elseif kind == 'h:' or kind == 'w:' then
    local expiry = tonumber(string.match(v, '^(%d+)')) or 0
    if expiry <= now then
      redis.call('hdel', KEYS[1], f)
    else
      latest = math.max(latest, expiry)
      if f ~= mine_h and f ~= mine_w then
        if kind == 'h:' then
          holders = holders + 1
          if string.match(v, '^%d+#(%a)') == 'W' then
            writers = writers + 1
          end
        else
          intents = intents + 1
        end
        if earliest == nil or expiry < earliest then
          earliest = expiry
        end
      end
    end
  end
end

local permits = tonumber(ARGV[4]) or 0
if mode == 'S' and holders > 0 and stored ~= nil and stored ~= permits then
  return {-1, stored}
end

local room
if mode == 'R' then
  room = writers == 0 and intents == 0
elseif mode == 'W' then
  room = holders == 0
else
  room = holders < permits
end

if room then
  local token = math.max((tonumber(redis.call('get', KEYS[2])) or 0) + 1, clock)
  local minted = string.format('%d', token)
  redis.call('set', KEYS[2], minted)
  local expiry = now + lease
  redis.call('hset', KEYS[1], mine_h, string.format('%d#%s#%s#%d', expiry, mode, minted, now))
  redis.call('hdel', KEYS[1], mine_w)
  if mode == 'S' then
    redis.call('hset', KEYS[1], 'permits', ARGV[4])
  end
  redis.call('pexpire', KEYS[1], math.max(latest, expiry) - now)
  return {1, token}
end

redis.call('hset', KEYS[1], 'mark', '1')
local wait = (earliest or (now + lease)) - now
if mode == 'W' then
  local intent = now + lease
  redis.call('hset', KEYS[1], mine_w, string.format('%d', intent))
  latest = math.max(latest, intent)
  wait = math.min(wait, math.max(1, math.floor(lease / 3)))
end
redis.call('pexpire', KEYS[1], latest - now)
return {0, wait}

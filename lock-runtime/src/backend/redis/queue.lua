-- queue.lua: the queue of waiting processes kept in a lock's slot, from which a release grants
-- the lock server-side (see handoff.rs).
--
-- Defines `queued(queue, owner, answer, window, registered, now)`, called after acquire.lua's
-- `attempt` by the scripts that take a queue (acquire, handoff), and `grant_next(lock, fence,
-- queue, channel, releaser, now)`, called by release.lua's `release`. Composed after
-- acquire.lua, whose function `grant_next` calls.
--
-- KEYS     the queue, `lock:{<key>}:queue` (same slot as the lock): a hash from a waiting
--          acquisition's owner (acquire.lua's ARGV[1]) to `<first µs>:<expiry ms>`, the
--          server's clock when it first registered and when its entry runs out (each
--          registration sets it `window` ms ahead). The key expires with its last entry.
-- ARGV     `window` the entry's life in milliseconds (the claim deadline of a grant to it);
--          `registered` '1' when the acquisition may have an entry (removed once granted)
--
-- Returns  `grant_next`: the owner granted, its token and the milliseconds left of its claim
--          window (the grant's expiry), or false (no live entry)

local function clock_ms(now)
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- After an attempt answered `answer` (acquire.lua's): a waiter registers, or renews its entry
-- (keeping its place); a grant removes the owner's entry.
local function queued(queue, owner, answer, window, registered, now)
  if not queue then
    return
  end
  if answer[1] == 1 then
    if registered == '1' then
      redis.call('hdel', queue, owner)
    end
    return
  end
  if tonumber(window) == nil then
    return
  end
  local ms = clock_ms(now)
  local first = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]))
  -- (Only an acquisition that may have an entry has a place to keep.)
  local entry = registered == '1' and redis.call('hget', queue, owner)
  if entry then
    first = string.match(entry, '^(%d+):') or first
  end
  redis.call('hset', queue, owner, first .. ':' .. string.format('%d', ms + tonumber(window)))
  if redis.call('pttl', queue) < tonumber(window) then
    redis.call('pexpire', queue, window)
  end
end

-- After `releaser`'s release deleted a lock someone waited for: grants it to the first live
-- entry (the earliest registered), until that entry runs out (the claim deadline: its
-- acquisition attempts on the announcement, and acquire.lua grants it again with its own
-- lease), and announces the grant on `channel` as `<releaser>#<granted owner>#<ms>`. Entries
-- run out are removed on the way. The grant is marked unclaimed (`#q`: nobody holds the lock
-- until its grantee claims it, so inspection names no leader; the claim keeps the token
-- minted here and drops the `#q`) and waited on (`+`), so that its release is announced too.
local function grant_next(lock, fence, queue, channel, releaser, now)
  local entries = redis.call('hgetall', queue)
  local ms = clock_ms(now)
  local head, head_first, head_expiry
  for i = 1, #entries, 2 do
    local first, expiry = string.match(entries[i + 1], '^(%d+):(%d+)$')
    first, expiry = tonumber(first), tonumber(expiry)
    if expiry == nil or expiry <= ms then
      redis.call('hdel', queue, entries[i])
    elseif head == nil or first < head_first then
      head, head_first, head_expiry = entries[i], first, expiry
    end
  end
  if head == nil then
    return false
  end
  redis.call('hdel', queue, head)
  local left = head_expiry - ms
  local _, token = attempt(lock, fence, head, left, nil, now, '#q+')
  redis.call('publish', channel, releaser .. '#' .. head .. '#' .. string.format('%d', left))
  return head, token, left
end

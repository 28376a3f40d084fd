-- acquire.lua: one attempt to take a lock, minting its fencing token; an attempt that finds
-- the lock held marks it as waited on, so that its release is announced.
--
-- Defines `attempt(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], now[, suffix])`, `now` the
-- server's `TIME` and `suffix` appended to a new grant's value (queue.lua's `#q+`), answering
-- two values (no table made per grant), and a third, `true`, when the lock was this owner's
-- already (a grant from the queue claimed, or an earlier answer lost): the script sent alone
-- ends with that call, then, given a queue, queue.lua's `queued`, and answers the two values
-- as a table (see scripts.rs); batch.lua calls it for each attempt, handoff.lua after a
-- release for the next waiter of the releasing process, and queue.lua's `grant_next` for the
-- first waiting process queued; and `acquire`, the same two values as a table.
--
-- KEYS[1]  the lock key, `lock:{<key>}`: a string `<owner>#<token>#<granted ms>`, then `#q`
--          while it is a grant from the queue not claimed yet (queue.lua), then `+` once
--          someone waits for it; expires with the lease. `<owner>` is ARGV[1] of the
--          acquisition holding it, `<token>` its fencing token, `<granted ms>` the server's
--          clock in milliseconds when it was granted (for inspection tools)
-- KEYS[2]  the fencing counter: the server's, `lock:fence` (one server, Sentinel: every grant
--          of a batch then shares one read and one write of it), or on a Cluster the one of
--          the lock key's hash slot, `lock:fence:{<slot tag>}` (same slot)
-- ARGV[1]  the owner: unique to this acquisition (`<owner id>@<host>/<pid>[/<label>]`, without
--          `#` or `+`)
-- ARGV[2]  the lease in milliseconds
-- ARGV[3]  optional (or ''): a floor for the token (Redlock proposes one, so that the nodes of
--          a quorum mint the same token; see redlock.rs)
-- KEYS[3]  sent alone, optional: the lock's queue (queue.lua); an attempt that finds the lock
--          held registers its owner there (ARGV[4], the claim window in ms, or '' for none),
--          one granted removes its entry when ARGV[5] is '1' (it may have one)
--
-- Returns  {1, token}  acquired: `token` is strictly greater than every token handed out
--                      before for any key of this slot, and never below the server's clock in
--                      microseconds (see the function's first lines)
--          {0, pttl}   held by someone else (now marked waited on); `pttl` is its remaining
--                      lease in milliseconds (-1 if the key has no expiry); `attempt` answers
--                      the holder's value third (Redlock's vote, scripts.rs, tells by it a lock
--                      held on a majority by one owner from votes split between contenders)
--
-- Why the mark: release.lua publishes only for a marked value. The mark is set in the same
-- atomic step that sees the lock held, so a release either comes before that step (and this
-- attempt takes the lock) or after it (and publishes). APPEND keeps the key's expiry.
-- A value already holding this owner (an earlier attempt of the same acquisition took the
-- lock but its answer was lost, or a grant from the queue being claimed) is granted again,
-- with a fresh lease, the same token and its mark.

-- Scripts replicate their effects, not themselves (the default from Redis 7), so that reading
-- the clock is allowed before writing.
if redis.replicate_commands then
  redis.replicate_commands()
end

local function attempt(lock, fence, owner, lease, floor, now, suffix)
  -- The next token: one above the counter, but never below the server's clock in
  -- microseconds. A counter lost with the data (a restart without persistence, FLUSHALL,
  -- eviction, a failover to a replica that had not received it) thus restarts above every
  -- token handed out before, as long as the server's clock has not been set back past them.
  -- (2^53 microseconds, the largest integer a Lua number holds exactly, is reached in the
  -- year 2255.) Minted before the lock is looked at, so that a free lock is taken with one
  -- `SET NX` (no `GET` first); the counter is written only once the lock is granted.
  -- The clock, in microseconds and as the value's `#<granted ms>`, is worked out once per
  -- `now` (a batch grants many locks at one reading: formatting is a good part of a grant).
  -- This runs for every grant: plain comparisons rather than `math.max`, two values returned
  -- rather than a table (a batch's server time is mostly this function and release's).
  local us = now.us
  if not us then
    us = tonumber(now[1]) * 1000000 + tonumber(now[2])
    now.us = us
    now.ms = '#' .. string.format('%d', math.floor(us / 1000))
    now.blocks = {}
  end
  local low = floor and tonumber(floor) or 0
  -- Within one script call, the counter is read once and written once per block of tokens
  -- (`now.reserve` long, 1 by default: a batch reserves one per operation), see below.
  local blocks = now.blocks
  local block = blocks[fence]
  local token
  if block then
    token = block.next
  else
    token = (tonumber(redis.call('get', fence)) or 0) + 1
    if us > token then
      token = us
    end
  end
  if low > token then
    token = low
  end
  local minted = string.format('%d', token)
  local value = owner .. '#' .. minted .. now.ms
  if suffix then
    value = value .. suffix
  end
  if not redis.call('set', lock, value, 'NX', 'PX', lease) then
    local mine = owner .. '#'
    local holder = redis.call('get', lock)
    if holder and string.sub(holder, 1, #mine) ~= mine then
      if string.sub(holder, -1) ~= '+' then
        redis.call('append', lock, '+')
      end
      return 0, redis.call('pttl', lock), holder
    end
    -- This owner's already: an earlier answer of the same acquisition lost, or a grant from
    -- the queue (queue.lua) being claimed. The same grant, so the same token (one term, one
    -- token, wherever it is reported), with a fresh lease; a higher floor (a Redlock quorum
    -- agreeing on a token) mints anew. The grant's time stays; an unclaimed grant's `#q`
    -- goes, its mark stays.
    if holder then
      local held, granted = string.match(string.sub(holder, #mine + 1), '^(%d+)(#%d+)')
      local kept = held and low <= tonumber(held)
      if kept then
        value = mine .. held .. granted
      end
      if string.sub(holder, -1) == '+' then
        value = value .. '+'
      end
      if kept then
        -- The counter is not written: it is at the held token or beyond already.
        redis.call('set', lock, value, 'PX', lease)
        return 1, tonumber(held), true
      end
    end
    redis.call('set', lock, value, 'PX', lease)
  end
  -- Granted: the counter must be at `token` or beyond before the script ends. A token within
  -- the block this script reserved is so already; otherwise a new block is reserved from
  -- `token`, written before any token of it is handed out (so a script that fails later
  -- leaves the counter above every token it granted). Tokens left unused in a block are
  -- skipped: tokens only need to increase.
  if block and token <= block.last then
    block.next = token + 1
  else
    local last = token + (now.reserve or 1) - 1
    redis.call('set', fence, string.format('%d', last))
    blocks[fence] = {next = token + 1, last = last}
  end
  return 1, token
end

-- `attempt`'s answer as a table, `{1, token}` or `{0, pttl}` (for a script that answers it as
-- it is; the backend's own read the third value first, see scripts.rs).
local function acquire(lock, fence, owner, lease, floor, now)
  local status, value = attempt(lock, fence, owner, lease, floor, now)
  return {status, value}
end

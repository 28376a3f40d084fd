-- batch.lua: the acquire attempts and holders' releases of many tasks of one process, sent
-- together in one script call (group commit, see batch.rs); each runs exactly as on its own,
-- in the order they were made. Composed after acquire.lua, queue.lua and release.lua, whose
-- functions it calls. Never on a Cluster: every key is on this server.
--
-- KEYS[1]  the server's fencing counter, `lock:fence` (acquire.lua's KEYS[2])
-- Then per operation, in order, two arguments and its keys (the fewer a batch carries, the
-- less the server parses per lock):
--   lease ms, owner   an attempt (acquire.lua's ARGV[2], ARGV[1]); key: the lock key
--   'r', owner        a holder's release (release.lua's ARGV[1]); key: the lock key, whose
--                     queue is `<lock key>:queue` and channel `<lock key>:released`
--   'q', owner        the same, for a lock key whose queue is named otherwise (a key with an
--                     empty hash tag, see layout.rs); keys: the lock key, then its queue
--
-- Returns  two numbers per operation, in order: an attempt's {1, token} or {0, pttl} (as
--          acquire.lua), a release's status (1, 0 or -1, as release.lua) and 0.
--
-- Fencing is acquire.lua's: the server's clock is read once, before the first attempt, and
-- every grant gets its own token, in the order of the batch; the counter (one per server, see
-- layout.rs) is read once and written once, reserving a token for every operation of the
-- batch before the first is handed out.
local fence = KEYS[1]
local now
local answers = {}
local n = 0
local k, a = 2, 1
local count = #ARGV
while a <= count do
  local op = ARGV[a]
  if op == 'r' then
    answers[n + 1] = (release(KEYS[k], ARGV[a + 1], nil, true, fence))
    answers[n + 2] = 0
    k = k + 1
  elseif op == 'q' then
    answers[n + 1] = (release(KEYS[k], ARGV[a + 1], nil, KEYS[k + 1], fence))
    answers[n + 2] = 0
    k = k + 2
  else
    if not now then
      -- Every operation may grant once (an attempt, or a release from the queue): one block
      -- of tokens covers the batch.
      now = redis.call('time')
      now.reserve = count / 2
    end
    answers[n + 1], answers[n + 2] = attempt(KEYS[k], fence, ARGV[a + 1], op, nil, now)
    k = k + 1
  end
  n = n + 2
  a = a + 2
end
return answers

-- batch.lua: the acquire attempts and holders' releases of many tasks of one process, sent
-- together in one script call (group commit, see batch.rs); each runs exactly as on its own,
-- in the order they were made. Composed after acquire.lua, queue.lua and release.lua, whose
-- functions it calls.
--
-- Per operation, in order: three arguments, then its keys:
--   'a', owner, lease ms       an attempt (acquire.lua's ARGV[1], ARGV[2]), keys: KEYS[1] the
--                              lock key, KEYS[2] the fencing counter of its slot (acquire.lua's)
--   'r', owner, channel        a holder's release (release.lua's ARGV[1], ARGV[2]), keys: KEYS[1]
--                              the lock key, KEYS[2] its queue, KEYS[3] the fencing counter
--                              (release.lua's KEYS[1], KEYS[2], KEYS[3])
--
-- Returns  two numbers per operation, in order: an attempt's {1, token} or {0, pttl} (as
--          acquire.lua), a release's status (1, 0 or -1, as release.lua) and 0.
--
-- Fencing is acquire.lua's: the server's clock is read once, before the first attempt, and
-- every grant gets its own token, in the order of the batch; the counter (one per server, see
-- layout.rs) is read once and written once, reserving a token for every operation of the
-- batch before the first is handed out.
local now
local answers = {}
local k, a = 1, 1
while a <= #ARGV do
  if ARGV[a] == 'a' then
    if not now then
      -- Every operation may grant once (an attempt, or a release from the queue): one block
      -- of tokens covers the batch.
      now = redis.call('time')
      now.reserve = #ARGV / 3
    end
    local answer = acquire(KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], nil, now)
    answers[#answers + 1] = answer[1]
    answers[#answers + 1] = answer[2]
    k = k + 2
  else
    answers[#answers + 1] = (release(KEYS[k], ARGV[a + 1], ARGV[a + 2], KEYS[k + 1], KEYS[k + 2]))
    answers[#answers + 1] = 0
    k = k + 3
  end
  a = a + 3
end
return answers

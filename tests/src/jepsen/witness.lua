-- witness.lua: one operation of the fenced witness store, a read or a write under a fencing
-- token, refused when a higher token was seen before for the name (the storage-side check of a
-- Chubby sequencer or of Kleppmann's fencing tokens). Both operations raise the name's highest
-- token seen; an accepted write also appends `<token>:<value>` to the name's log.
--
-- KEYS[1]  the highest token seen, `witness:{<name>}:max` (a decimal string)
-- KEYS[2]  the value, `witness:{<name>}:value`
-- KEYS[3]  the log of accepted writes, `witness:{<name>}:log` (a list of `<token>:<value>`)
-- ARGV[1]  `read` or `write`
-- ARGV[2]  the token, in decimal without leading zeros (compared as a string, by length first:
--          Lua numbers are doubles and would round tokens above 2^53)
-- ARGV[3]  the value to write (write only; a decimal string)
--
-- Returns  {'value', <the stored value, '0' when none>}   read accepted
--          {'accepted', ARGV[3]}                           write accepted
--          {'refused', <the highest token seen>}           the token is below it
local token = ARGV[2]
local max = redis.call('get', KEYS[1])
if max and (#token < #max or (#token == #max and token < max)) then
  return {'refused', max}
end
redis.call('set', KEYS[1], token)
if ARGV[1] == 'read' then
  return {'value', redis.call('get', KEYS[2]) or '0'}
end
if ARGV[1] == 'write' then
  redis.call('set', KEYS[2], ARGV[3])
  redis.call('rpush', KEYS[3], token .. ':' .. ARGV[3])
  return {'accepted', ARGV[3]}
end
return redis.error_reply('witness.lua: unknown operation ' .. tostring(ARGV[1]))

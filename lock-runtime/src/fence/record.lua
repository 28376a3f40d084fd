-- Records a writer's token, refusing a stale one. KEYS: the fence key alone (an admission), or
-- the value's key then its fence key (a fenced DEL, which also deletes the value; both in one
-- hash slot). ARGV[1]: the writer's token, zero-padded to 20 digits.
-- Replies nil once recorded, or the highest token recorded when the writer's is below it. The
-- fence key keeps the TTL it had, so a stale holder cannot write a deleted value back.
local fence = KEYS[#KEYS]
local highest = redis.call('GET', fence)
if highest and highest > ARGV[1] then
    return highest
end
if #KEYS == 2 then
    redis.call('DEL', KEYS[1])
end
redis.call('SET', fence, ARGV[1], 'KEEPTTL')
return false

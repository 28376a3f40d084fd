-- A fenced SET, or HSET of one field. KEYS[1]: the value's key; KEYS[2]: its fence key (same
-- hash slot). ARGV[1]: the value; ARGV[2]: the writer's token, zero-padded to 20 digits (so that
-- tokens compare as strings, exactly, over all of u64); ARGV[3]: a TTL in ms, or "0" for none;
-- ARGV[4], if given: the hash field to set (HSET; the hash keeps its TTL, and the fence key
-- takes it).
-- Replies nil once written, or the highest token recorded when the writer's is below it.
local highest = redis.call('GET', KEYS[2])
if highest and highest > ARGV[2] then
    return highest
end
if ARGV[4] then
    redis.call('HSET', KEYS[1], ARGV[4], ARGV[1])
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then
        redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
    else
        redis.call('SET', KEYS[2], ARGV[2])
    end
elseif ARGV[3] == '0' then
    redis.call('SET', KEYS[1], ARGV[1])
    redis.call('SET', KEYS[2], ARGV[2])
else
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
return false

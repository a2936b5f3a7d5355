-- forget.lua: remove a tiered cache entry's state (SPEC T4, T5). What stays behind stops a
-- write that was under way when the entry was removed from bringing the old state back.
-- KEYS: the ten keys of the entry (see _prelude.lua).
-- ARGV[1] "keep": the thread's durable state is still there (a conflict, a failed cache
--         write): the entry keeps its versions, so the compare-and-set in cache_put.lua still
--         refuses an older state that arrives late, and takes the durable head or a newer one.
--         "hold": the durable state was removed (a delete, a prune, a copy onto the thread):
--         for ARGV[2] ms the entry refuses every write (cache_put.lua, put_writes.lua); then
--         the next miss seeds it again.
-- ARGV[2] hold (ms)
-- Returns how many of the keys holding state (KEYS[2] to KEYS[9]) existed.
local existed = redis.call("EXISTS", unpack(KEYS, 2))
local kept = {}
local ttl = redis.call("PTTL", KEYS[1])
if ARGV[1] == "keep" then
    local fields = redis.call("HGETALL", KEYS[1])
    for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 8) == "version" .. NUL then
            kept[#kept + 1] = fields[i]
            kept[#kept + 1] = fields[i + 1]
        end
    end
end
redis.call("UNLINK", unpack(KEYS))
if ARGV[1] == "hold" then
    redis.call("HSET", KEYS[1], "gone", "1")
    redis.call("PEXPIRE", KEYS[1], ARGV[2])
elseif #kept > 0 then
    redis.call("HSET", KEYS[1], unpack(kept))
    if ttl > 0 then
        redis.call("PEXPIRE", KEYS[1], ttl)
    end
end
return existed

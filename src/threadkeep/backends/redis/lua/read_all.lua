-- read_all.lua: everything a thread holds, for copy_thread. Reads only.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any)
-- Returns {} when there is no thread (for a user: none with an owner), else {HGETALL cps,
-- HGETALL blobs, HGETALL writes, HGETALL msgs, HGETALL links, HGETALL calls} (the sorted sets follow from
-- these), {"\0forbidden", owner}: the thread belongs to another owner than ARGV[1] (SPEC W3),
-- or {"\0lost", what}: Redis evicted part of the thread (lost_part, _prelude.lua).
if ARGV[1] ~= "" then
    local owner = redis.call("HGET", KEYS[1], "owner")
    if not owner then
        return {}
    end
    if owner ~= ARGV[1] then
        return {NUL .. "forbidden", owner}
    end
end
local lost = lost_part()
if lost then
    return {NUL .. "lost", "the thread lost " .. lost}
end
if redis.call("EXISTS", KEYS[1]) == 0 then
    return {}
end
return {
    redis.call("HGETALL", KEYS[2]),
    redis.call("HGETALL", KEYS[5]),
    redis.call("HGETALL", KEYS[6]),
    redis.call("HGETALL", KEYS[8]),
    redis.call("HGETALL", KEYS[9]),
    redis.call("HGETALL", KEYS[10]),
}

-- put_writes.lua: store a task's writes against a checkpoint (regular writes once, special
-- ones overwritten), creating the thread for the writer if it is new (SPEC W3).
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] thread id       ARGV[2] writer (user id)   ARGV[3] required owner ("" = any)
-- ARGV[4] now (s)         ARGV[5] ttl (ms)           ARGV[6] namespace
-- ARGV[7] checkpoint id   ARGV[8] history limit ("0" = none: writes of a checkpoint the
--                         limit already pruned are dropped with it)
-- ARGV[9] "1" for the tiered cache (T6): drop the writes of a checkpoint older than the
--         entry's state (they can never be read from it), and every write while the entry is
--         held after its thread was removed (forget.lua); keep those of the entry's checkpoint
--         and of a newer one (LangGraph may write a task's writes before its put lands).
--         "0" otherwise
-- ARGV[10] n, then n triples: "<task id>\0<idx>", "<task path>\0<channel>\0<type>\0<value>",
--                             "1" if special (overwrites) else "0"
-- Returns {"ok"}, {"dropped"} or {"forbidden", owner}; errors (storing nothing) if Redis
-- evicted part of the thread (refuse_lost_thread, _prelude.lua); a cache entry drops them.
if ARGV[9] ~= "1" then
    refuse_lost_thread(ARGV[1])
elseif lost_part() then
    return {"dropped"} -- a cache entry Redis evicted part of: it is a miss until filled whole
end
local ns, checkpoint_id = ARGV[6], ARGV[7]
local owner = redis.call("HGET", KEYS[1], "owner")
if owner and ARGV[3] ~= "" and owner ~= ARGV[3] then
    return {"forbidden", owner}
end
local limit = tonumber(ARGV[8])
local member = ns .. NUL .. checkpoint_id
if ARGV[9] == "1" and redis.call("HEXISTS", KEYS[1], "gone") == 1 then
    return {"dropped"}
end
if ARGV[9] == "1" and redis.call("HEXISTS", KEYS[2], member) == 0 then
    local cached = redis.call("HGET", KEYS[1], "version" .. NUL .. ns)
    if cached and cached ~= "-1" and checkpoint_id < cached then
        return {"dropped"}
    end
end
if limit > 0 and redis.call("HEXISTS", KEYS[2], member) == 0 then
    local low, high = ns_bounds(ns)
    local kept = redis.call("ZRANGEBYLEX", KEYS[3], low, high, "LIMIT", 0, 1)
    if redis.call("ZLEXCOUNT", KEYS[3], low, high) >= limit and #kept == 1 and member < kept[1] then
        return {"dropped"}
    end
end
own(ARGV[1], ARGV[2], ARGV[4])
for i = 0, tonumber(ARGV[10]) - 1 do
    local field = member .. NUL .. ARGV[11 + 3 * i]
    if ARGV[13 + 3 * i] == "1" then
        redis.call("HSET", KEYS[6], field, ARGV[12 + 3 * i])
    else
        redis.call("HSETNX", KEYS[6], field, ARGV[12 + 3 * i])
    end
    redis.call("ZADD", KEYS[7], 0, field)
end
touch(ARGV[5])
return {"ok"}

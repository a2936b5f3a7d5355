-- listing.lua: the thread listing's index (SPEC SV1, SV3): ZSETs of thread ids scored by
-- their last write (s), one of every thread and one per owner, all under the one hash tag
-- "{listing}" (see keys.py: a Redis Cluster serves them from one slot, as it does the
-- finished set; a thread's own keys live in its own slot, so the index is written by this
-- script beside the script that writes the thread, in the same round trip, not inside it).
-- The index keeps no more than its threads can live (SPEC R2): "add" drops the entries
-- written longer ago than the platform's waiting horizon (no thread lives longer without a
-- write: a declared horizon is shorter) and gives both keys that horizon as their TTL, so
-- an index whose every thread expired expires too.
-- KEYS[1] every thread's index   KEYS[2] an owner's index (for "add", "remove"; "page": unused)
-- ARGV[1] "add": ARGV[2] thread id, ARGV[3] write time (s); later writes only move it forward
--         (a put and a run's start racing leave the later time), ARGV[4] the platform's
--         waiting horizon (ms)
-- ARGV[1] "restore": ARGV[2] thread id, ARGV[3] the time an "add" gave it, ARGV[4], ARGV[5]
--         the scores that "add" answered for KEYS[1], KEYS[2]: each index where the thread is
--         still at that time gets its score back ("" none: the thread leaves it)
-- ARGV[1] "remove": ARGV[2] thread id (from both keys; KEYS[2] twice: from that one only)
-- ARGV[1] "move": KEYS[3] another owner's index: the thread leaves KEYS[2] for KEYS[3], at
--         its score in KEYS[1] (none there: it only leaves KEYS[2]); ARGV[2] thread id,
--         ARGV[3] the platform's waiting horizon (ms)
-- ARGV[1] "page": KEYS[1] the index to read; ARGV[2] the cursor's time ("inf": none),
--         ARGV[3] the cursor's thread id, ARGV[4] written at or after (s, "-inf"),
--         ARGV[5] written before (s, "inf"), ARGV[6] how many
-- Returns: "add": what KEYS[1] and KEYS[2] held for the thread before ("" none), to
-- "restore" if the write it went with was refused; "restore", "remove", "move": 1; "page":
-- thread id, score, ... newest first, ties by id descending (ZREVRANGEBYSCORE's own order),
-- only after the cursor.
local op = ARGV[1]
if op == "add" then
    local before = {}
    local horizon = tonumber(ARGV[4])
    local oldest = "(" .. string.format("%.17g", tonumber(ARGV[3]) - horizon / 1000)
    for i = 1, 2 do
        local score = redis.call("ZSCORE", KEYS[i], ARGV[2])
        local held = tonumber(score)
        before[i] = score or ""
        if not held or held < tonumber(ARGV[3]) then
            redis.call("ZADD", KEYS[i], ARGV[3], ARGV[2])
        end
        redis.call("ZREMRANGEBYSCORE", KEYS[i], "-inf", oldest)
        redis.call("PEXPIRE", KEYS[i], horizon)
    end
    return before
end
if op == "restore" then
    for i = 1, 2 do
        if tonumber(redis.call("ZSCORE", KEYS[i], ARGV[2])) == tonumber(ARGV[3]) then
            if ARGV[3 + i] == "" then
                redis.call("ZREM", KEYS[i], ARGV[2])
            else
                redis.call("ZADD", KEYS[i], ARGV[3 + i], ARGV[2])
            end
        end
    end
    return 1
end
if op == "remove" then
    redis.call("ZREM", KEYS[1], ARGV[2])
    redis.call("ZREM", KEYS[2], ARGV[2])
    return 1
end
if op == "move" then
    local score = redis.call("ZSCORE", KEYS[1], ARGV[2])
    if KEYS[2] ~= KEYS[3] then
        redis.call("ZREM", KEYS[2], ARGV[2])
    end
    if score then
        local held = tonumber(redis.call("ZSCORE", KEYS[3], ARGV[2]))
        if not held or held < tonumber(score) then
            redis.call("ZADD", KEYS[3], score, ARGV[2])
        end
        redis.call("PEXPIRE", KEYS[3], ARGV[3])
    end
    return 1
end
local at, after_id, low, before, limit = ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local out = {}
local high = "(" .. before
if tonumber(at) < tonumber(before) then
    -- the rows of the cursor's own time that sort after it, then the older ones
    local ties = redis.call("ZREVRANGEBYSCORE", KEYS[1], at, at)
    for _, member in ipairs(ties) do
        if member < after_id and #out < 2 * limit and tonumber(at) >= tonumber(low) then
            out[#out + 1] = member
            out[#out + 1] = at
        end
    end
    high = "(" .. at
end
if #out < 2 * limit then
    local rest = redis.call("ZREVRANGEBYSCORE", KEYS[1], high, low, "WITHSCORES", "LIMIT", 0, limit - #out / 2)
    for _, value in ipairs(rest) do
        out[#out + 1] = value
    end
end
return out

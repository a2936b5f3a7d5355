-- tool_call.lua: the thread's tool-call ledger (SPEC TM5): begin a call, end it, or list the
-- ledger. Entries live in the thread's calls hash (KEYS[10]): in the thread's slot, under
-- its TTL, deleted with it (delete.lua) and copied with it (read_all.lua, merge.lua).
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- An entry is field "<message id>\0<call id>" ->
--   "<seq>\0<started>\0<tool>\0<key>\0<claim>\0<status>\0<finished>\0<type>\0<outcome>"
-- (finished, type and outcome "" while started; the outcome is the encoded result, or the
-- error). seq counts the entries begun on the thread (its field "calls").
-- ARGV[1] "begin": ARGV[2] field   ARGV[3] thread id   ARGV[4] user   ARGV[5] now (s)
--                  ARGV[6] required owner ("" any)   ARGV[7] ttl (ms)   ARGV[8] tool
--                  ARGV[9] key   ARGV[10] claim
--     Records the entry as started unless the ledger holds one for the call; creates the
--     thread for its user if it has none yet (as put.lua would). Returns {"ok", entry} (the
--     entry as stored) or {"forbidden", owner} (nothing written).
-- ARGV[1] "end":   ARGV[2] field   ARGV[3] thread id   ARGV[4] required owner ("" any)
--                  ARGV[5] ttl (ms)   ARGV[6] status   ARGV[7] finished (s)   ARGV[8] type
--                  ARGV[9] outcome
--     Ends a started entry. Returns {"ok"} (ended), {"ended", entry} (it is not started:
--     nothing written, the caller decides), {"missing"} or {"forbidden", owner}.
-- ARGV[1] "list":  ARGV[2] owner filter ("" any)
--     Returns {"ok", HGETALL of the calls hash}, {"none"} (no thread of that owner), or
--     {"\0lost", what} (Redis evicted part of the thread: lost_part).
-- "begin" and "end" error (storing nothing) if Redis evicted part of the thread
-- (refuse_lost_thread, _prelude.lua).
local mode = ARGV[1]
if mode == "list" then
    local owner = redis.call("HGET", KEYS[1], "owner")
    if not owner or (ARGV[2] ~= "" and owner ~= ARGV[2]) then
        return {"none"}
    end
    local lost = lost_part()
    if lost then
        return {NUL .. "lost", "the thread lost " .. lost}
    end
    return {"ok", redis.call("HGETALL", KEYS[10])}
end
refuse_lost_thread(ARGV[3])
if mode == "begin" then
    local owner = own(ARGV[3], ARGV[4], ARGV[5])
    if ARGV[6] ~= "" and owner ~= ARGV[6] then
        return {"forbidden", owner}
    end
    local entry = redis.call("HGET", KEYS[10], ARGV[2])
    if not entry then
        local seq = redis.call("HINCRBY", KEYS[1], "calls", 1)
        entry = table.concat({seq, ARGV[5], ARGV[8], ARGV[9], ARGV[10], "started", "", "", ""}, NUL)
        redis.call("HSET", KEYS[10], ARGV[2], entry)
        touch(ARGV[7])
    end
    return {"ok", entry}
end
local owner = redis.call("HGET", KEYS[1], "owner")
if owner and ARGV[4] ~= "" and owner ~= ARGV[4] then
    return {"forbidden", owner}
end
local entry = redis.call("HGET", KEYS[10], ARGV[2])
if not entry then
    return {"missing"}
end
-- What an end keeps: the entry up to its claim (the fifth field) and the NUL after it.
local kept = 0
for _ = 1, 5 do
    kept = string.find(entry, NUL, kept + 1, true)
end
if string.sub(entry, kept + 1, string.find(entry, NUL, kept + 1, true) - 1) ~= "started" then
    return {"ended", entry}
end
local ended = string.sub(entry, 1, kept) .. table.concat({ARGV[6], ARGV[7], ARGV[8], ARGV[9]}, NUL)
redis.call("HSET", KEYS[10], ARGV[2], ended)
touch(ARGV[5])
return {"ok"}

-- assign.lua: hand the thread to another owner (ThreadkeepSaver.assign_owner), if its owner
-- now is one of the owners it may be taken from.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] the new owner   ARGV[2] "1": take it from any owner; "0": only from ARGV[3]
-- ARGV[3] the owner a thread may be taken from without "1" (the anonymous owner)
-- Returns {"ok", owner before}, {"missing"} if there is no thread (or it lost its record to
-- an eviction: lost_part), or {"refused", owner}: nothing is changed then.
local owner = redis.call("HGET", KEYS[1], "owner")
if not owner then
    return {"missing"}
end
if ARGV[2] ~= "1" and owner ~= ARGV[3] and owner ~= ARGV[1] then
    return {"refused", owner}
end
redis.call("HSET", KEYS[1], "owner", ARGV[1])
return {"ok", owner}

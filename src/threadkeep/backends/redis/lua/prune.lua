-- prune.lua: keep only the newest checkpoint of every namespace (LangGraph's "keep_latest"),
-- with its writes and the channel values it refers to.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any)
-- ARGV[2..] pairs of a namespace and how many of its newest checkpoints to keep (1 when
--           not named: more where a delta field reads older ones)
-- Returns how many checkpoints were removed; 0 for no thread, or one Redis evicted part of
-- (lost_part): what is left is not pruned, but deleted whole by an operator (delete.lua);
-- -1 for a thread of another owner than ARGV[1] (nothing is removed: SPEC W3).
local owner = redis.call("HGET", KEYS[1], "owner")
if ARGV[1] ~= "" and owner and owner ~= ARGV[1] then
    return -1
end
if not owner or lost_part() then
    return 0
end
local counts = {}
for i = 2, #ARGV, 2 do
    counts[ARGV[i]] = tonumber(ARGV[i + 1])
end
local removed = 0
for _, ns in ipairs(namespaces()) do
    removed = removed + keep_newest(ns, counts[ns] or 1)
end
return removed

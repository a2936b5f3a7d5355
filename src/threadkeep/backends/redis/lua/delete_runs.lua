-- delete_runs.lua: delete the checkpoints (and their writes) whose run id is one of ARGV[3..],
-- then the channel values no checkpoint refers to any more.
-- KEYS: the nine keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any); ARGV[2] "1" to delete, "0" to count only; ARGV[3..] run ids.
-- Returns how many checkpoints of the runs the thread held (and, with ARGV[2] "1", removed);
-- -1 if it holds some and belongs to another owner than ARGV[1] (nothing is removed: SPEC
-- W3); 0 for a thread Redis evicted part of (lost_part): what is left is not pruned, but
-- deleted whole by an operator (delete.lua).
if lost_part() then
    return 0
end
local runs = {}
for i = 3, #ARGV do
    runs[ARGV[i]] = true
end
local matched = {}
local entries = redis.call("HGETALL", KEYS[2])
for i = 1, #entries, 2 do
    local record = cjson.decode(entries[i + 1])
    if record.r ~= cjson.null and runs[record.r] then
        matched[#matched + 1] = entries[i]
    end
end
if #matched == 0 then
    return 0
end
if ARGV[1] ~= "" and redis.call("HGET", KEYS[1], "owner") ~= ARGV[1] then
    return -1
end
if ARGV[2] ~= "1" then
    return #matched
end
local touched = {}
for _, member in ipairs(matched) do
    local split = string.find(member, NUL, 1, true)
    local ns = string.sub(member, 1, split - 1)
    drop_checkpoint(ns, string.sub(member, split + 1))
    touched[ns] = true
end
for ns, _ in pairs(touched) do
    collect_blobs(ns)
end
return #matched

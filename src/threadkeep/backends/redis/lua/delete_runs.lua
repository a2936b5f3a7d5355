-- delete_runs.lua: delete the checkpoints (and their writes) whose run id is one of the run ids,
-- but those spared, then the channel values no checkpoint refers to any more.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any); ARGV[2] "1" to delete, "0" to count only; ARGV[3] n, the
-- number of run ids; ARGV[4..3+n] run ids; ARGV[4+n..] checkpoints spared, as
-- "<ns>\0<checkpoint id>" (a later checkpoint's delta fields are rebuilt from them).
-- Returns how many checkpoints of the runs the thread held but the spared ones (and, with
-- ARGV[2] "1", removed); -1 if it holds some (spared or not) and belongs to another owner
-- than ARGV[1] (nothing is removed: SPEC W3); 0 for a thread Redis evicted part of
-- (lost_part): what is left is not pruned, but deleted whole by an operator (delete.lua).
if lost_part() then
    return 0
end
local runs, spared = {}, {}
local n = tonumber(ARGV[3])
for i = 4, 3 + n do
    runs[ARGV[i]] = true
end
for i = 4 + n, #ARGV do
    spared[ARGV[i]] = true
end
local held, matched = false, {}
local entries = redis.call("HGETALL", KEYS[2])
for i = 1, #entries, 2 do
    local record = cjson.decode(entries[i + 1])
    if record.r ~= cjson.null and runs[record.r] then
        held = true
        if not spared[entries[i]] then
            matched[#matched + 1] = entries[i]
        end
    end
end
if not held then
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

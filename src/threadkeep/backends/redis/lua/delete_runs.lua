-- delete_runs.lua: delete the checkpoints (and their writes) whose run id is one of the run ids,
-- but those spared, then the channel values no checkpoint refers to any more.
-- KEYS: the nine keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any); ARGV[2] n, the number of run ids; ARGV[3..2+n] run ids;
-- ARGV[3+n..] checkpoints spared, as "<ns>\0<checkpoint id>" (a later checkpoint's delta
-- fields are rebuilt from them).
-- Returns how many checkpoints were removed; 0 for a thread Redis evicted part of (lost_part):
-- what is left is not pruned, but deleted whole by an operator (delete.lua).
if lost_part() or (ARGV[1] ~= "" and redis.call("HGET", KEYS[1], "owner") ~= ARGV[1]) then
    return 0
end
local runs, spared = {}, {}
local n = tonumber(ARGV[2])
for i = 3, 2 + n do
    runs[ARGV[i]] = true
end
for i = 3 + n, #ARGV do
    spared[ARGV[i]] = true
end
local removed, touched = 0, {}
local entries = redis.call("HGETALL", KEYS[2])
for i = 1, #entries, 2 do
    local record = cjson.decode(entries[i + 1])
    if record.r ~= cjson.null and runs[record.r] and not spared[entries[i]] then
        local member = entries[i]
        local split = string.find(member, NUL, 1, true)
        local ns = string.sub(member, 1, split - 1)
        drop_checkpoint(ns, string.sub(member, split + 1))
        touched[ns] = true
        removed = removed + 1
    end
end
for ns, _ in pairs(touched) do
    collect_blobs(ns)
end
return removed

-- delete.lua: delete everything one thread holds, if the caller may see it.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any owner).
-- ARGV[2] a sweep's now (s), or "" (delete unconditionally): the thread is deleted only if
--         it is still finished and due by then (a run that started since has cleared its
--         "finished_due", finish.lua and retain.lua; a thread with none was never marked:
--         its entry in the finished set is another thread's of the same id, deleted since)
--         and holds no live park. Checked here, in the same script as the delete, so a run
--         that starts or parks after the sweep read its page keeps its thread.
-- Returns 1 if the thread was deleted, 0 if there was none, -1 if the sweep must keep it,
-- -2 if it belongs to another owner than ARGV[1] (nothing is deleted: SPEC W3). What is
-- left of a thread that lost its record to an eviction (lost_part) has no owner to check:
-- an operator (no owner filter) deletes it, at once; for a user it is no thread.
local owner = redis.call("HGET", KEYS[1], "owner")
if not owner and ARGV[1] == "" and lost_part() then
    redis.call("DEL", unpack(KEYS))
    return 1
end
if not owner then
    return 0
end
if ARGV[1] ~= "" and owner ~= ARGV[1] then
    return -2
end
if ARGV[2] ~= "" then
    local now = tonumber(ARGV[2])
    local due = redis.call("HGET", KEYS[1], "finished_due")
    if not due or due == "" or tonumber(due) > now then
        return -1
    end
    local fields = redis.call("HGETALL", KEYS[1])
    for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 5) == "park" .. NUL and tonumber(fields[i + 1]) > now then
            return -1
        end
    end
end
redis.call("DEL", unpack(KEYS))
return 1

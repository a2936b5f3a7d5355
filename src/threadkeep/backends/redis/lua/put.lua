-- put.lua: store one checkpoint, its changed channel values and its new messages, atomically
-- (SPEC W1), if the owner (W3) and head (W2) rules allow it.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] thread id          ARGV[2] writer (user id)    ARGV[3] required owner ("" = any)
-- ARGV[4] now (s)            ARGV[5] ttl (ms)            ARGV[6] namespace
-- ARGV[7] checkpoint id      ARGV[8] required parent ("" = none: a new root or an explicit
--                            branch; else the head must be it, unless the checkpoint is stored)
-- ARGV[9] checkpoint record  ARGV[10] history limit ("0" = none)
-- ARGV[11] c, then c nodes that must be stored already (each message list's known prefix)
-- then n, then n pairs: blob field "<channel>\0<version>", "<type>\0<value>"
-- then m, then m pairs: message digest, "<type>\0<value>"   (stored if absent)
-- then l, then l pairs: link node, "<digest><prev>"          (stored if absent)
-- then k "<channel>\0<version>" of the values the checkpoint keeps from its parent (not
-- sent), and k itself, the last argument
-- Returns {"ok", owner} (the thread's owner: the listing's index is kept by owner),
-- {"forbidden", owner}, {"stale", head or ""}, {"resend", index of the
-- list whose prefix is missing: the caller probes the links and sends the whole rest}, or
-- {"whole"}: a value the checkpoint keeps from its parent is not stored: the caller sends
-- every value.
-- Errors (storing nothing) if Redis evicted part of the thread (refuse_lost_thread,
-- _prelude.lua).
refuse_lost_thread(ARGV[1])
local ns, checkpoint_id, parent = ARGV[6], ARGV[7], ARGV[8]

local owner = redis.call("HGET", KEYS[1], "owner")
if owner and ARGV[3] ~= "" and owner ~= ARGV[3] then
    return {"forbidden", owner}
end
local member = ns .. NUL .. checkpoint_id
if parent ~= "" then
    local head = head_of(ns)
    if head ~= parent and redis.call("HEXISTS", KEYS[2], member) == 0 then
        return {"stale", head or ""}
    end
end

local missing = missing_prefix(11)
if missing then
    return {"resend", missing}
end
-- A value kept from the parent is gone if the history limit collected it after the parent
-- was read (an update of an older checkpoint while the run went on), or Redis evicted it.
local kept = tonumber(ARGV[#ARGV])
for i = #ARGV - kept, #ARGV - 1 do
    if redis.call("HEXISTS", KEYS[5], ns .. NUL .. ARGV[i]) == 0 then
        return {"whole"}
    end
end
owner = own(ARGV[1], ARGV[2], ARGV[4])
store_step(11, ns, checkpoint_id, ARGV[9])
local limit = tonumber(ARGV[10])
if limit > 0 then
    keep_newest(ns, limit)
end
touch(ARGV[5])
return {"ok", owner}

-- cache_put.lua: the tiered provider's hot tier (SPEC T1-T7). An entry holds the newest
-- state of one (thread, user) per namespace, and never moves backwards.
-- KEYS: the ten keys of the entry (see _prelude.lua).
-- ARGV[1] entry id        ARGV[2] user           ARGV[3] now (s)       ARGV[4] ttl (ms)
-- ARGV[5] namespace       ARGV[6] checkpoint id
-- ARGV[7] version: the durable version the state carries (its checkpoint id), or "-1" for a
--         state with no durable version yet, lower than any
-- ARGV[8] parent checkpoint id ("" none)
-- ARGV[9] "1": the state is whole (it replaces the namespace); "0": one step over the parent
-- ARGV[10] checkpoint record
-- ARGV[11] lease (ms)     ARGV[12] since (ms): when the state was known to be the durable head
--          (the writer's clock before its Postgres statement; "": now); an applied state is served
--          without asking Postgres until the lease from then runs out (grant_lease)
-- ARGV[13] on: the step rows, laid out as put.lua's
-- Returns {"ok"}; {"skipped", cached version}: the entry holds a newer state (T4), or
-- {"skipped", "gone"}: the thread's state was removed moments ago (forget.lua); {"full"}:
-- the entry does not hold the parent, so a step cannot apply: send the whole state; or
-- {"resend", i}: list i's prefix is not stored.
local ns, checkpoint_id, version, parent = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local whole = ARGV[9] == "1"
local field = "version" .. NUL .. ns
if redis.call("HEXISTS", KEYS[1], "gone") == 1 then
    return {"skipped", "gone"}
end
local cached = redis.call("HGET", KEYS[1], field)

-- A state that continues the cached one always applies; otherwise an older one is refused.
-- Equal versions apply: a step replayed, or the same state written twice.
local continues = (cached == parent) or (not cached and parent == "")
if cached and cached ~= "-1" and not continues and (version == "-1" or version < cached) then
    return {"skipped", cached}
end
-- An entry Redis evicted part of (lost_part) loses what it holds; KEYS[1] keeps its versions,
-- so an older state is still refused, and only a whole state fills the entry again.
if lost_part() then
    redis.call("DEL", unpack(KEYS, 2))
    if not whole then
        return {"full"}
    end
end
if not whole and not continues and cached ~= version then
    return {"full"}
end
local missing = missing_prefix(13)
if missing then
    return {"resend", missing}
end

own(ARGV[1], ARGV[2], ARGV[3])
store_step(13, ns, checkpoint_id, ARGV[10])
if whole then
    -- The state replaces the namespace. Its own pending writes stay: the same state seeded
    -- again (an equal version) must not lose the writes stored with it (T6).
    keep_only(ns, checkpoint_id)
else
    keep_newest(ns, 1)
end
drop_writes_before(ns, checkpoint_id)
redis.call("HSET", KEYS[1], field, version)
grant_lease(ns, ARGV[12], ARGV[11])
touch(ARGV[4])
return {"ok"}

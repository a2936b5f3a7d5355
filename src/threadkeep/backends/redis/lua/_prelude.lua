-- _prelude.lua: helpers every threadkeep script starts with (threadkeep/backends/redis/
-- scripts.py puts this file in front of each script before loading it).
--
-- Every per-thread script takes the ten keys of one thread as KEYS, in this order (all
-- share the thread's hash tag, so a script runs on one Redis Cluster slot):
--   KEYS[1] thread   HASH  id, owner, created, waiting_ms and finished_m (declared retention),
--                          finished_due (s; "" while a run is on it), "park\0<park id>" ->
--                          deadline (live parks), calls (tool-call entries begun)
--   KEYS[2] cps      HASH  "<ns>\0<checkpoint id>" -> checkpoint record (JSON)
--   KEYS[3] heads    ZSET  "<ns>\0<checkpoint id>", score 0: newest per namespace by lex order
--   KEYS[4] order    ZSET  "<checkpoint id>\0<ns>", score 0: newest across namespaces
--   KEYS[5] blobs    HASH  "<ns>\0<channel>\0<version>" -> "<type>\0<value>"
--   KEYS[6] writes   HASH  "<ns>\0<checkpoint id>\0<task id>\0<idx>" -> "<task path>\0<channel>\0<type>\0<value>"
--   KEYS[7] windex   ZSET  the writes fields, score 0: a checkpoint's writes by lex range
--   KEYS[8] msgs     HASH  "<digest>" -> "<type>\0<value>"      (each message once, SPEC S1)
--   KEYS[9] links    HASH  "<node>" -> "<digest><prev node>"   (message lists as chains)
--                          "<node>p" -> "<32 digests><prev node>" (the page a link at every
--                          LINK_PAGE-th position of a list closes: its messages, oldest first,
--                          and the node before them; empty before a list's first)
--   KEYS[10] calls   HASH  "<message id>\0<call id>" -> tool-call entry (tool_call.lua)
-- A checkpoint record is {"p": parent, "r": run id, "t": created, "c": checkpoint JSON,
-- "m": metadata JSON, "v": ["<channel>\0<version>", ...]}.

local NUL = "\0"
-- Fields an HMGET asks for at most (Lua's unpack takes a few thousand values at a time).
local MGET_CHUNK = 1000
-- threadkeep.core.messages.LINK_PAGE: the links of a list that close a page of messages.
local LINK_PAGE = 32
-- In place of a message's digest where a list's chain broke.
local NO_DIGEST = string.rep(NUL, 16)

-- The lex range of a namespace's members in `heads` (all start with "<ns>\0").
local function ns_bounds(ns)
    return "[" .. ns .. NUL, "(" .. ns .. "\1"
end

-- The newest checkpoint id of a namespace, or nil.
local function head_of(ns)
    local low, high = ns_bounds(ns)
    local top = redis.call("ZREVRANGEBYLEX", KEYS[3], high, low, "LIMIT", 0, 1)
    if #top == 0 then
        return nil
    end
    return string.sub(top[1], #ns + 2)
end

-- Redis's clock, in ms.
local function now_ms()
    local now = redis.call("TIME")
    return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- Sets every key's deadline `ttl_ms` from now, one deadline for all ten (PEXPIRE reads the
-- clock at each call): keys expiring a moment apart would leave a moment where the thread
-- looks part lost (lost_part).
local function expire_all(ttl_ms)
    local deadline = now_ms() + ttl_ms
    for i = 1, #KEYS do
        redis.call("PEXPIREAT", KEYS[i], deadline)
    end
end

-- Every key a write stores carries the thread's waiting retention (SPEC R2); a read never
-- calls this. Keys not created yet are skipped by PEXPIREAT itself.
local function touch(ttl_ms)
    -- A thread's declared waiting retention (retain.lua), if shorter, is its keys' TTL.
    local declared = tonumber(redis.call("HGET", KEYS[1], "waiting_ms"))
    ttl_ms = tonumber(ttl_ms)
    if declared and declared < ttl_ms then
        ttl_ms = declared
    end
    expire_all(ttl_ms)
end

-- What Redis evicted of this thread, or nil. Every key has a TTL (SPEC R2), so a Redis at its
-- maxmemory under a policy other than noeviction may evict some keys of a thread and not
-- others: its record while its checkpoints remain, or one of the keys a write fills together
-- (the checkpoint records and their two indexes; the pending writes and their index). Lost
-- values and messages are found where they are read.
local function lost_part()
    local records = redis.call("EXISTS", KEYS[2]) == 1
    if records and redis.call("HEXISTS", KEYS[1], "owner") == 0 then
        return "its record (its owner)"
    end
    if records ~= (redis.call("EXISTS", KEYS[3]) == 1) or records ~= (redis.call("EXISTS", KEYS[4]) == 1) then
        return "part of its checkpoints"
    end
    if redis.call("EXISTS", KEYS[6]) ~= redis.call("EXISTS", KEYS[7]) then
        return "part of its pending writes"
    end
    -- A thread that began tool calls holds them (a ledger read as empty would run them again).
    if redis.call("HEXISTS", KEYS[1], "calls") == 1 and redis.call("EXISTS", KEYS[10]) == 0 then
        return "its tool-call ledger"
    end
    return nil
end

-- Refuses a write to a thread that lost part of it (lost_part): the write would build on
-- what is left, or make its writer, maybe another user, the owner of the checkpoints left.
-- Call before any write. An operator can delete what is left (delete.lua).
local function refuse_lost_thread(thread_id)
    local lost = lost_part()
    if lost then
        error({err = "threadkeep: thread '" .. thread_id .. "' lost " .. lost .. " to an eviction "
            .. "(run Redis with maxmemory-policy noeviction); its reads and writes are refused "
            .. "until an operator deletes it"})
    end
end

-- The owner of the thread, creating it for `writer` if it does not exist yet.
local function own(thread_id, writer, now)
    local owner = redis.call("HGET", KEYS[1], "owner")
    if not owner then
        redis.call("HSET", KEYS[1], "id", thread_id, "owner", writer, "created", now)
        owner = writer
    end
    return owner
end

-- Removes one checkpoint and its pending writes (its channel values are collected later).
local function drop_checkpoint(ns, checkpoint_id)
    local member = ns .. NUL .. checkpoint_id
    redis.call("HDEL", KEYS[2], member)
    redis.call("ZREM", KEYS[3], member)
    redis.call("ZREM", KEYS[4], checkpoint_id .. NUL .. ns)
    local fields = redis.call("ZRANGEBYLEX", KEYS[7], "[" .. member .. NUL, "(" .. member .. "\1")
    for _, field in ipairs(fields) do
        redis.call("HDEL", KEYS[6], field)
        redis.call("ZREM", KEYS[7], field)
    end
end

-- Deletes the pending writes of a namespace's checkpoints older than `checkpoint_id` (the
-- tiered cache keeps its state's writes, and those that arrived ahead of a newer put).
local function drop_writes_before(ns, checkpoint_id)
    local low, high = ns_bounds(ns)
    for _, field in ipairs(redis.call("ZRANGEBYLEX", KEYS[7], low, high)) do
        local rest = string.sub(field, #ns + 2)
        local id = string.sub(rest, 1, string.find(rest, NUL, 1, true) - 1)
        if id < checkpoint_id then
            redis.call("HDEL", KEYS[6], field)
            redis.call("ZREM", KEYS[7], field)
        end
    end
end

-- Deletes the channel values of a namespace that no remaining checkpoint refers to.
local function collect_blobs(ns)
    local low, high = ns_bounds(ns)
    local referenced = {}
    for _, member in ipairs(redis.call("ZRANGEBYLEX", KEYS[3], low, high)) do
        local record = cjson.decode(redis.call("HGET", KEYS[2], member))
        for _, value in ipairs(record.v) do
            referenced[ns .. NUL .. value] = true
        end
    end
    local prefix = ns .. NUL
    for _, field in ipairs(redis.call("HKEYS", KEYS[5])) do
        if string.sub(field, 1, #prefix) == prefix and not referenced[field] then
            redis.call("HDEL", KEYS[5], field)
        end
    end
end

-- Keeps the newest `keep` checkpoints of a namespace; returns how many were removed.
local function keep_newest(ns, keep)
    local low, high = ns_bounds(ns)
    local count = redis.call("ZLEXCOUNT", KEYS[3], low, high)
    if count <= keep then
        return 0
    end
    local old = redis.call("ZRANGEBYLEX", KEYS[3], low, high, "LIMIT", 0, count - keep)
    for _, member in ipairs(old) do
        drop_checkpoint(ns, string.sub(member, #ns + 2))
    end
    collect_blobs(ns)
    return #old
end

-- Removes every checkpoint of a namespace but `checkpoint_id`, and the values only they used.
local function keep_only(ns, checkpoint_id)
    local low, high = ns_bounds(ns)
    local kept = ns .. NUL .. checkpoint_id
    for _, member in ipairs(redis.call("ZRANGEBYLEX", KEYS[3], low, high)) do
        if member ~= kept then
            drop_checkpoint(ns, string.sub(member, #ns + 2))
        end
    end
    collect_blobs(ns)
end

-- The step rows of a put, from ARGV[at] on: c prefix nodes (each message list's known
-- prefix, which must be stored already), then n blob pairs, m message pairs, l link pairs
-- (see put.lua). Returns the index of the first list whose prefix is not stored, or nil.
local function missing_prefix(at)
    for i = 1, tonumber(ARGV[at]) do
        if redis.call("HEXISTS", KEYS[9], ARGV[at + i]) == 0 then
            return i
        end
    end
    return nil
end

-- Stores the rows of a step (laid out from ARGV[at] as missing_prefix says) and its
-- checkpoint record.
local function store_step(at, ns, checkpoint_id, record)
    at = at + tonumber(ARGV[at]) + 1
    local blobs = tonumber(ARGV[at])
    for i = 1, blobs do
        redis.call("HSET", KEYS[5], ns .. NUL .. ARGV[at + 2 * i - 1], ARGV[at + 2 * i])
    end
    at = at + 2 * blobs + 1
    local messages = tonumber(ARGV[at])
    for i = 1, messages do
        redis.call("HSETNX", KEYS[8], ARGV[at + 2 * i - 1], ARGV[at + 2 * i])
    end
    at = at + 2 * messages + 1
    for i = 1, tonumber(ARGV[at]) do
        redis.call("HSETNX", KEYS[9], ARGV[at + 2 * i - 1], ARGV[at + 2 * i])
    end
    local member = ns .. NUL .. checkpoint_id
    redis.call("HSET", KEYS[2], member, record)
    redis.call("ZADD", KEYS[3], 0, member)
    redis.call("ZADD", KEYS[4], 0, checkpoint_id .. NUL .. ns)
end

-- The namespaces the thread holds checkpoints in.
local function namespaces()
    local seen, out = {}, {}
    for _, member in ipairs(redis.call("ZRANGE", KEYS[3], 0, -1)) do
        local ns = string.sub(member, 1, string.find(member, NUL, 1, true) - 1)
        if not seen[ns] then
            seen[ns] = true
            out[#out + 1] = ns
        end
    end
    return out
end


-- The tiered cache's validity lease: the entry field "valid\0<ns>" holds the Redis time (ms)
-- until which the namespace's state may be served without asking Postgres (docs/tiered.md).
-- A lease runs `lease_ms` from `since_ms`, when the state was known to be the durable head
-- (a time taken before the Postgres statement that showed it; "": now), and never further
-- than `lease_ms` from now.
local function grant_lease(ns, since_ms, lease_ms)
    local now = now_ms()
    local valid = math.min(tonumber(since_ms) or now, now) + tonumber(lease_ms)
    redis.call("HSET", KEYS[1], "valid" .. NUL .. ns, string.format("%d", valid))
end

-- load.lua's answer to the tiered cache: the Redis time (ms), then for each of the k
-- namespaces ARGV[2 + 2i] names, 1 if its state is within its lease, else 0.
local function leases(k)
    local now = now_ms()
    local out = {now}
    for i = 1, k do
        local valid = tonumber(redis.call("HGET", KEYS[1], "valid" .. NUL .. ARGV[2 + 2 * i]))
        out[i + 1] = (valid and valid > now) and 1 or 0
    end
    return out
end

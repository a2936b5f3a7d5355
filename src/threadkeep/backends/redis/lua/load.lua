-- load.lua: checkpoints with their channel values, pending writes and message lists, in
-- one round trip. Never extends a TTL (SPEC R2).
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any owner)   ARGV[2] list tails the caller holds already
--         (concatenated 16-byte nodes: those lists are not sent again)
-- ARGV[3] k, then k pairs: namespace, checkpoint id ("" = the newest of the namespace)
-- Returns k entries, each {} when absent (or another user's), else
--   {checkpoint id, record, {blob field, blob value, ...}, {write field, write value, ...},
--    {tail, digests, message, message, ...}, ...}: one list per message list not held by the
--   caller, messages oldest first, each "<type>\0<value>", after their digests (16 bytes each,
--   concatenated; 16 NULs where the chain broke, whose messages are empty); or, every entry, {"\0lost", what}: Redis
--   evicted part of the thread (lost_part, _prelude.lua). The owner is checked first: a
--   thread that lost its owner is no user's to read (an operator's read says it is lost).
-- ARGV[4 + 2k] "lease" (the tiered cache): one more element after the k entries, the
--   Redis time and whether each state is within its lease (leases, _prelude.lua).
local k = tonumber(ARGV[3])
local function answer(entries)
    if ARGV[4 + 2 * k] == "lease" then
        entries[k + 1] = leases(k)
    end
    return entries
end
if ARGV[1] ~= "" and redis.call("HGET", KEYS[1], "owner") ~= ARGV[1] then
    local empty = {}
    for i = 1, k do
        empty[i] = {}
    end
    return answer(empty)
end
local lost = lost_part()
if lost then
    local entries = {}
    for i = 1, k do
        entries[i] = {NUL .. "lost", "the thread lost " .. lost}
    end
    return answer(entries)
end
local held = {}
for i = 1, #ARGV[2], 16 do
    held[string.sub(ARGV[2], i, i + 15)] = true
end
local out = {}
for i = 1, k do
    local ns, checkpoint_id = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
    if checkpoint_id == "" then
        checkpoint_id = head_of(ns)
    end
    local record = checkpoint_id and redis.call("HGET", KEYS[2], ns .. NUL .. checkpoint_id)
    if not record then
        out[i] = {}
    else
        local entry = {checkpoint_id, record}
        local blobs = {}
        for _, value in ipairs(cjson.decode(record).v) do
            local field = ns .. NUL .. value
            local blob = redis.call("HGET", KEYS[5], field)
            if blob then
                blobs[#blobs + 1] = value
                blobs[#blobs + 1] = blob
                if string.sub(blob, 1, 6) == "chain" .. NUL and not held[string.sub(blob, 7, 22)] then
                    local tail = string.sub(blob, 7, 22)
                    local count = 0
                    for b = 23, 26 do
                        count = count * 256 + string.byte(blob, b)
                    end
                    -- The links first (each names the one before it; a page, the 32 before
                    -- it), then every message in a few HMGETs: one call per message, and
                    -- per link, cost most of a long list's read.
                    local digests = {}
                    local first = count + 1  -- the oldest position found (a broken chain stops)
                    local node = tail
                    local position = count
                    while position >= 1 do
                        local page = position % LINK_PAGE == 0 and redis.call("HGET", KEYS[9], node .. "p")
                        if page then
                            first = position - LINK_PAGE + 1
                            for j = 0, LINK_PAGE - 1 do
                                digests[first + j] = string.sub(page, 16 * j + 1, 16 * j + 16)
                            end
                            node = string.sub(page, 16 * LINK_PAGE + 1)
                            position = first - 1
                        else
                            local link = redis.call("HGET", KEYS[9], node)
                            if not link then
                                break
                            end
                            digests[position] = string.sub(link, 1, 16)
                            first = position
                            node = string.sub(link, 17)
                            position = position - 1
                        end
                    end
                    local list = {tail, ""}
                    for position = 1, first - 1 do
                        digests[position] = NO_DIGEST
                        list[position + 2] = ""
                    end
                    for from = first, count, MGET_CHUNK do
                        local to = math.min(from + MGET_CHUNK - 1, count)
                        local found = redis.call("HMGET", KEYS[8], unpack(digests, from, to))
                        for position = from, to do
                            list[position + 2] = found[position - from + 1] or ""
                        end
                    end
                    list[2] = table.concat(digests, "", 1, count)
                    entry[#entry + 1] = list
                    held[tail] = true
                end
            end
        end
        local writes = {}
        local member = ns .. NUL .. checkpoint_id
        for _, field in ipairs(redis.call("ZRANGEBYLEX", KEYS[7], "[" .. member .. NUL, "(" .. member .. "\1")) do
            local value = redis.call("HGET", KEYS[6], field)
            if value then
                writes[#writes + 1] = string.sub(field, #member + 2)
                writes[#writes + 1] = value
            end
        end
        table.insert(entry, 3, blobs)
        table.insert(entry, 4, writes)
        out[i] = entry
    end
end
return answer(out)

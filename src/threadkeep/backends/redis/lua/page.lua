-- page.lua: one page of a thread's checkpoints, newest first (checkpoint id order across
-- namespaces), for list(). Reads only.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any)     ARGV[2] "1" to keep one namespace only, else "0"
-- ARGV[3] that namespace              ARGV[4] before: only ids below it ("" = none)
-- ARGV[5] cursor: continue below this "order" member ("" = from the newest)
-- ARGV[6] page size                   ARGV[7] checkpoint id to keep only ("" = any)
-- Returns {next cursor ("" when done), checkpoint id, namespace, metadata JSON, ...}, or
-- {"\0lost", what}: Redis evicted part of the thread (lost_part, _prelude.lua; the owner is
-- checked first, as in load.lua).
if ARGV[1] ~= "" and redis.call("HGET", KEYS[1], "owner") ~= ARGV[1] then
    return {""}
end
local lost = lost_part()
if lost then
    return {NUL .. "lost", "the thread lost " .. lost}
end
local high = "+"
if ARGV[5] ~= "" then
    high = "(" .. ARGV[5]
elseif ARGV[4] ~= "" then
    high = "(" .. ARGV[4]
end
local size = tonumber(ARGV[6])
local out = {""}
local scanned = 0
while #out < 1 + 3 * size do
    local chunk = redis.call("ZREVRANGEBYLEX", KEYS[4], high, "-", "LIMIT", 0, size)
    if #chunk == 0 then
        return out
    end
    for _, member in ipairs(chunk) do
        local split = string.find(member, NUL, 1, true)
        local checkpoint_id, ns = string.sub(member, 1, split - 1), string.sub(member, split + 1)
        if (ARGV[2] ~= "1" or ns == ARGV[3]) and (ARGV[7] == "" or checkpoint_id == ARGV[7]) then
            local record = cjson.decode(redis.call("HGET", KEYS[2], ns .. NUL .. checkpoint_id))
            out[#out + 1] = checkpoint_id
            out[#out + 1] = ns
            out[#out + 1] = record.m
        end
        high = "(" .. member
        out[1] = member
        if #out >= 1 + 3 * size then
            return out
        end
    end
    scanned = scanned + #chunk
    if #chunk < size then
        out[1] = ""
        return out
    end
end
return out

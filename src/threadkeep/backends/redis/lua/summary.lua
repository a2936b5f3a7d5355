-- summary.lua: one thread as the listing shows it (SPEC SV1, SV3), read in one script.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] now (s): parks whose deadline is later are live.
-- Returns {} if the thread is gone (its keys expired, or it was deleted), else {owner,
-- finished_due ("" none), waiting_ms ("" none), latest live park deadline ("" none),
-- "1" if its newest root checkpoint holds an interrupt write else "0", that checkpoint's
-- record ("" none), the thread's remaining TTL (ms, -1 none)}.
local fields = redis.call("HGETALL", KEYS[1])
local thread = {}
local until_ = nil
local now = tonumber(ARGV[1])
for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    if string.sub(name, 1, 5) == "park" .. NUL then
        local deadline = tonumber(value)
        if deadline > now and (not until_ or deadline > until_) then
            until_ = deadline
        end
    else
        thread[name] = value
    end
end
if not thread["owner"] then
    return {}
end
local interrupted, record = "0", ""
local head = head_of("")
if head then
    local member = NUL .. head
    record = redis.call("HGET", KEYS[2], member) or ""
    local writes = redis.call("ZRANGEBYLEX", KEYS[7], "[" .. member .. NUL, "(" .. member .. "\1")
    for _, field in ipairs(writes) do
        local value = redis.call("HGET", KEYS[6], field)
        if value then
            local rest = string.sub(value, string.find(value, NUL, 1, true) + 1)
            local channel = string.sub(rest, 1, (string.find(rest, NUL, 1, true) or (#rest + 1)) - 1)
            if channel == "__interrupt__" then
                interrupted = "1"
                break
            end
        end
    end
end
return {
    thread["owner"], thread["finished_due"] or "", thread["waiting_ms"] or "",
    until_ and string.format("%.17g", until_) or "", interrupted, record, redis.call("PTTL", KEYS[1]),
}

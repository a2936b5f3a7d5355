-- stats.lua: what one thread holds. Reads only.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- Returns {checkpoints, channel values, writes, messages, payload bytes}.
local bytes = 0
for _, key in ipairs({KEYS[2], KEYS[5], KEYS[6], KEYS[8]}) do
    local entries = redis.call("HGETALL", key)
    for i = 2, #entries, 2 do
        bytes = bytes + #entries[i]
    end
end
-- A link counts 48 bytes (its node, digest and previous node), a page its value, as the
-- SQL stores count theirs.
local links = redis.call("HGETALL", KEYS[9])
for i = 1, #links, 2 do
    bytes = bytes + (#links[i] == 16 and 48 or #links[i + 1])
end
return {
    redis.call("HLEN", KEYS[2]),
    redis.call("HLEN", KEYS[5]),
    redis.call("HLEN", KEYS[6]),
    redis.call("HLEN", KEYS[8]),
    bytes,
}

-- probe.lua: which of the given message-list links the thread stores.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV: link nodes.
-- Returns one integer per node: 1 stored, 0 not.
local out = {}
for i = 1, #ARGV do
    out[i] = redis.call("HEXISTS", KEYS[9], ARGV[i])
end
return out

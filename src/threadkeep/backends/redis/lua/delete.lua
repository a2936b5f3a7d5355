-- delete.lua: delete everything one thread holds, if the caller may see it.
-- KEYS: the nine keys of the thread (see _prelude.lua).
-- ARGV[1] owner filter ("" = any owner).
-- Returns 1 if the thread was deleted, 0 if there was none to see.
local owner = redis.call("HGET", KEYS[1], "owner")
if not owner or (ARGV[1] ~= "" and owner ~= ARGV[1]) then
    return 0
end
redis.call("DEL", unpack(KEYS))
return 1

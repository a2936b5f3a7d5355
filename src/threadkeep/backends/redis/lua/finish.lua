-- finish.lua: a thread is marked finished (SPEC RT2), if the caller may write it (SPEC W3):
-- record when it is due in its own hash, where delete.lua checks it atomically with the
-- delete (the finished set, which the sweep pages through, is another key, in another Redis
-- Cluster slot). The due time is the finished retention in force now: the thread's declared
-- one, else the platform's capped at its declared waiting (ThreadRetention.finished).
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] now (s)   ARGV[2] the platform's finished retention (minutes)
-- ARGV[3] required owner ("" any)
-- Returns {"ok", due (s, as a string)}, {"missing"} if the thread does not exist (it
-- expired), or {"forbidden", owner}: nothing is written then.
local owner, waiting_ms, finished_m = unpack(redis.call("HMGET", KEYS[1], "owner", "waiting_ms", "finished_m"))
if not owner then
    return {"missing"}
end
if ARGV[3] ~= "" and owner ~= ARGV[3] then
    return {"forbidden", owner}
end
local minutes = tonumber(finished_m)
if not minutes then
    minutes = tonumber(ARGV[2])
    local waiting = tonumber(waiting_ms)
    if waiting and math.floor(waiting / 60000) < minutes then
        minutes = math.floor(waiting / 60000)
    end
end
-- %.17g reads back as the same double (the caller parses this string, not a rounded reply).
local due = string.format("%.17g", tonumber(ARGV[1]) + 60 * minutes)
redis.call("HSET", KEYS[1], "finished_due", due)
return {"ok", due}

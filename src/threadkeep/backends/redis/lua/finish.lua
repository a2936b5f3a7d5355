-- finish.lua: a thread is marked finished (SPEC RT2): record when it is due in its own hash,
-- where delete.lua checks it atomically with the delete (the finished set, which the sweep
-- pages through, is another key, in another Redis Cluster slot).
-- KEYS: the nine keys of the thread (see _prelude.lua).
-- ARGV[1] due (s)
-- Returns 1, or 0 if the thread does not exist (it expired): nothing is written then.
if redis.call("HEXISTS", KEYS[1], "owner") == 0 then
    return 0
end
redis.call("HSET", KEYS[1], "finished_due", ARGV[1])
return 1

-- cache_renew.lua: renew the lease of a tiered cache entry's state once Postgres confirmed
-- it is still the newest (docs/tiered.md, "How stale a read can be").
-- KEYS: the ten keys of the entry (see _prelude.lua).
-- ARGV[1] namespace   ARGV[2] the version Postgres confirmed
-- ARGV[3] since (ms): the Redis time of the read that Postgres's confirmation followed
-- ARGV[4] lease (ms)
-- Returns 1 if the entry still holds that version (its lease is renewed, see grant_lease),
-- else 0 (another write moved it, or it was cleared: nothing changes).
if redis.call("HEXISTS", KEYS[1], "gone") == 1 or redis.call("HGET", KEYS[1], "version" .. NUL .. ARGV[1]) ~= ARGV[2] then
    return 0
end
grant_lease(ARGV[1], ARGV[3], ARGV[4])
return 1

-- threadkeep Postgres schema, version 10: tk_flush goes. Every write commits on its own
-- connection as the session's synchronous_commit says; nothing writes this table any more.
DROP TABLE IF EXISTS tk_flush;

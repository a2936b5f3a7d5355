# ruff: noqa: E501  (prose lines)
"""Write docs/settings.md from threadkeep.settings.VARIABLES: ./dev run python tools/gen_settings_doc.py"""

from pathlib import Path

from threadkeep.settings import VARIABLES

desc = {
    "provider": "The provider: `memory`, `sqlite`, `postgres`, `redis`, `tiered`.",
    "conn_string": "The provider's connection string (a path for sqlite). Unset: sqlite uses `.threadkeep/checkpoints.sqlite`, postgres `DATABASE_URL` (neither set: refused at start; `postgresql://` takes everything from libpq's `PG*`), redis `REDIS_URL`.",
    "cache_url": "tiered only: the Redis URL of the hot tier (else `REDIS_URL`).",
    "cache_ttl_seconds": "tiered only: how long a thread's cached latest state lives after its last write (a read does not extend it); a miss only costs a read from Postgres.",
    "codec": "`json` (the faithful codec) or `msgpack` (LangGraph's `JsonPlusSerializer`).",
    "inline_compress_bytes": "Values encoded larger than this are stored compressed; `null` turns compression off.",
    "retention_waiting_minutes": "How long a thread nobody marked finished lives after its last write.",
    "retention_finished_minutes": "How long a thread lives after it was marked finished; at most the waiting value.",
    "retention_interrupt_minutes": "How long the sweep spares a thread, past its horizon, because its newest root checkpoint waits on an interrupt; past this, the `interrupts` filter no longer claims it and it goes like any other (`docs/operations.md`). Unset: spared for as long as it waits. May exceed the waiting value.",
    "enforce_user_isolation": "A thread belongs to the user who first wrote it.",
    "state_history_limit": "Keep only the newest N checkpoints per (thread, namespace); unset keeps all (tiered: 20).",
    "retry_attempts": "Attempts of a transaction whose connection dropped (postgres, redis).",
    "retry_backoff_seconds": "First retry delay; it doubles each attempt.",
    "pool_min_size": "postgres, tiered: connections each pool keeps open.",
    "pool_max_size": "postgres, tiered: connections each pool may open (threadkeep opens one pool per event loop for the async API, one for the sync API).",
    "pool_timeout_seconds": "postgres, tiered: how long a call waits for a free connection before it fails (and is retried).",
    "connect_timeout_seconds": "postgres, redis, tiered: how long opening a connection may take.",
    "api_keys": "`threadkeep serve`: bearer API keys, comma-separated `key:user:role` (role `admin` or `user`); only an admin key may sweep or write settings. Unset, those routes refuse every request (401) and `threadkeep serve` says so in a WARNING at start. A secret: never logged.",
    "database_url": "Fallback Postgres DSN.",
    "redis_url": "Fallback Redis URL.",
}
out = [
    "# Settings",
    "",
    "Read from the environment when a saver is built (`Settings.from_env()`). A malformed or",
    "out-of-range value is refused at start with `ConfigurationError`, naming the variable and the",
    "value. `open_checkpointer(**options)` overrides some of them per saver.",
    "",
    "| Variable | Default | Meaning |",
    "|---|---|---|",
]
for var, (name, default) in VARIABLES.items():
    out.append(f"| `{var}` | {('`' + default + '`') if default else 'unset'} | {desc[name]} |")
out += [
    "",
    "## Removed",
    "",
    "A deployment that sets either of these is refused at start, and a settings write that sets",
    "one (`Settings.updated({...})`, `PATCH /api/settings`) is refused, naming it:",
    "",
    "- `LLM_PROVIDER_CHECKPOINT_TTL_MINUTES`: use the two retention values.",
    "- `FLOW_CHECKPOINT_RETENTION_DAYS`: use the two retention values and the checkpoint sweep.",
    "",
    "## Per-saver options",
    "",
    "`open_checkpointer(provider, conn_string, **options)` accepts `serde`, `enforce_user_isolation`,",
    "`state_history_limit`, `clock`, and for `sqlite`/`memory`: `synchronous` (`NORMAL` by default,",
    "durable against a crash of the process; `FULL` also against power loss), `busy_timeout_ms`",
    "(5000) and `max_connections` (8); for `postgres`: `pool` and `async_pool` (pools your",
    "application owns: used as given, never closed by threadkeep), `min_size`, `max_size` and",
    "`prepare_threshold` (psycopg's; `None` for PgBouncer in transaction mode); for `redis`:",
    "`client` and `async_client` (redis-py clients your application owns, used as given and never",
    "closed by threadkeep; a `RedisCluster` client works too), `cluster` (`True`/`False`; unset,",
    "threadkeep asks the server whether it is a cluster) and `key_prefix` (`tk`: every key starts",
    "with it, so two stores can share one database). An unknown option is refused, naming it.",
    "",
    "## Connections",
    "",
    "- **postgres** keeps one `psycopg_pool` pool for the sync API and one per event loop for the",
    "  async API, each between `POOL_MIN_SIZE` and `POOL_MAX_SIZE` connections. A program (one",
    "  checkpoint step) holds a connection for one transaction. A pooled connection is checked",
    "  before use without a round trip; after a dropped connection every idle one is tested, and",
    "  the step is retried whole, `RETRY_ATTEMPTS` times in all with `RETRY_BACKOFF_SECONDS`",
    "  doubling between tries. Migrations run once, on a short-lived connection, under an advisory",
    "  lock.",
    "- **redis** uses one redis-py client for the sync API and one per event loop for the async",
    "  API (each with its own connection pool). A step is one Lua script, so a retry after a",
    "  dropped connection never repeats half a step.",
    "",
]
(Path(__file__).resolve().parents[1] / "docs" / "settings.md").write_text("\n".join(out))

"""Deployment settings, read once from the environment and refused loudly when wrong.

Every variable is listed in :data:`VARIABLES` with its default, and described in the
``Attributes`` of :class:`Settings`; ``tools/gen_settings_doc.py`` writes the table of
``docs/settings.md`` from both. A refusal names the variable and the value it saw.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal, get_args

from threadkeep.errors import ConfigurationError

ProviderName = Literal["memory", "sqlite", "postgres", "redis", "tiered"]
CodecName = Literal["json", "msgpack"]

PROVIDERS: tuple[str, ...] = get_args(ProviderName)
CODECS: tuple[str, ...] = get_args(CodecName)

PREFIX = "LLM_PROVIDER_CHECKPOINT"
DEFAULT_SQLITE_PATH = ".threadkeep/checkpoints.sqlite"
DEFAULT_RESUME_STATE_PATH = ".threadkeep/resumable.json"

REMOVED_VARIABLES: Mapping[str, str] = {
    "LLM_PROVIDER_CHECKPOINT_TTL_MINUTES": (
        "use LLM_PROVIDER_CHECKPOINT_RETENTION_WAITING_MINUTES and "
        "LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES"
    ),
    "FLOW_CHECKPOINT_RETENTION_DAYS": (
        "use the two LLM_PROVIDER_CHECKPOINT_RETENTION_*_MINUTES values and the checkpoint sweep"
    ),
}

# variable name -> (Settings field, default as the environment would spell it)
VARIABLES: Mapping[str, tuple[str, str | None]] = {
    PREFIX: ("provider", "sqlite"),
    f"{PREFIX}_CONN_STRING": ("conn_string", None),
    f"{PREFIX}_CACHE_URL": ("cache_url", None),
    f"{PREFIX}_CACHE_TTL_SECONDS": ("cache_ttl_seconds", "86400"),
    f"{PREFIX}_CACHE_LEASE_SECONDS": ("cache_lease_seconds", "2.0"),
    f"{PREFIX}_CODEC": ("codec", "json"),
    f"{PREFIX}_MSGPACK_STRICT": ("msgpack_strict", "true"),
    f"{PREFIX}_INLINE_COMPRESS_BYTES": ("inline_compress_bytes", "65536"),
    f"{PREFIX}_RETENTION_WAITING_MINUTES": ("retention_waiting_minutes", "10080"),
    f"{PREFIX}_RETENTION_FINISHED_MINUTES": ("retention_finished_minutes", "1440"),
    f"{PREFIX}_RETENTION_INTERRUPT_MINUTES": ("retention_interrupt_minutes", None),
    f"{PREFIX}_USER_ISOLATION": ("enforce_user_isolation", "true"),
    f"{PREFIX}_HISTORY_LIMIT": ("state_history_limit", None),
    f"{PREFIX}_RETRY_ATTEMPTS": ("retry_attempts", "3"),
    f"{PREFIX}_RETRY_BACKOFF_SECONDS": ("retry_backoff_seconds", "1.0"),
    f"{PREFIX}_POOL_MIN_SIZE": ("pool_min_size", "1"),
    f"{PREFIX}_POOL_MAX_SIZE": ("pool_max_size", "10"),
    f"{PREFIX}_POOL_TIMEOUT_SECONDS": ("pool_timeout_seconds", "30"),
    f"{PREFIX}_CONNECT_TIMEOUT_SECONDS": ("connect_timeout_seconds", "10"),
    f"{PREFIX}_PREPARE_THRESHOLD": ("prepare_threshold", "5"),
    f"{PREFIX}_COMMAND_TIMEOUT_SECONDS": ("command_timeout_seconds", "30"),
    f"{PREFIX}_STEP_DEADLINE_SECONDS": ("step_deadline_seconds", "10.0"),
    f"{PREFIX}_RESUME_ENABLED": ("resume_enabled", "false"),
    f"{PREFIX}_RESUME_STATE_PATH": ("resume_state_path", DEFAULT_RESUME_STATE_PATH),
    f"{PREFIX}_RESUME_TTL": ("resume_ttl", "3600"),
    f"{PREFIX}_API_KEYS": ("api_keys", None),
    "DATABASE_URL": ("database_url", None),
    "REDIS_URL": ("redis_url", None),
}

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NULL = frozenset({"null", "none", ""})


@dataclass(frozen=True, slots=True)
class Settings:
    """The checkpoint settings of one deployment.

    Build it with :meth:`Settings.from_env`; constructing it directly validates the same way.
    Each field is read from the variable :data:`VARIABLES` names. The descriptions below are
    the table of ``docs/settings.md`` (``python tools/gen_settings_doc.py`` writes it; ``./dev
    test`` fails while it is stale): a new setting needs its line here.

    Attributes:
        provider: The provider: `memory`, `sqlite`, `postgres`, `redis`, `tiered`.
        conn_string: The provider's connection string (a path for sqlite). Unset: sqlite uses
            `.threadkeep/checkpoints.sqlite`, postgres `DATABASE_URL` (neither set: refused at start;
            `postgresql://` takes everything from libpq's `PG*`), redis `REDIS_URL`.
        cache_url: the Redis URL of the tiered provider's hot tier and of the ownership resolver's
            shared cache (`OwnershipResolver.from_settings`), else `REDIS_URL`.
        cache_ttl_seconds: tiered only: how long a thread's cached latest state lives after its last write (a
            read does not extend it); a miss only costs a read from Postgres.
        cache_lease_seconds: tiered only: the staleness bound. A read of a thread's newest state that starts
            more than this long after Postgres committed a newer one returns the newer one, even if that
            state's cache write never arrived (a worker killed after its commit, a network cut to Redis);
            within it a state is served from Redis alone, past it one indexed Postgres lookup confirms it
            first (`docs/tiered.md`).
        codec: `json` (the faithful codec) or `msgpack` (LangGraph's `JsonPlusSerializer`).
        msgpack_strict: With `CODEC=msgpack`: a read builds only LangGraph's safe types, the enum, dataclass
            and pydantic classes of modules already imported (a graph's state types) and the allowlist
            (`saver.with_allowlist`); a stored value naming anything else fails the read with
            `CheckpointSerializationError`, and nothing it names is imported or called (`docs/codec.md`).
            `false` reads as `JsonPlusSerializer()` does by default: a stored value can import any module and
            call anything, so whoever can write to the store can run code in every reader. Only for a store
            nobody else can write.
        inline_compress_bytes: Values encoded larger than this are stored compressed; `null` turns compression
            off.
        retention_waiting_minutes: How long a thread nobody marked finished lives after its last write.
        retention_finished_minutes: How long a thread lives after it was marked finished; at most the waiting
            value.
        retention_interrupt_minutes: How long the sweep spares a thread, past its horizon, because its
            newest root checkpoint waits on an interrupt; past this, the `interrupts` filter no longer
            claims it and it goes like any other (`docs/operations.md`). Unset: spared for as long as it
            waits. May exceed the waiting value.
        enforce_user_isolation: A thread belongs to the user who first wrote it.
        state_history_limit: Keep only the newest N checkpoints per (thread, namespace); unset keeps all
            (tiered: 20).
        retry_attempts: Attempts of a transaction whose connection dropped (postgres, redis).
        retry_backoff_seconds: First retry delay; it doubles each attempt.
        pool_min_size: postgres, tiered: connections each pool keeps open.
        pool_max_size: postgres, tiered: connections each pool may open (threadkeep opens one pool per event
            loop for the async API, one for the sync API).
        pool_timeout_seconds: postgres, tiered: how long a call waits for a free connection before it fails
            (and is retried), at most what is left of `STEP_DEADLINE_SECONDS`.
        connect_timeout_seconds: postgres, redis, tiered: how long opening a connection may take.
        prepare_threshold: postgres, tiered: psycopg's `prepare_threshold`, the runs after which a write
            statement becomes a prepared statement (the state read is prepared at its first run); `null` never
            prepares, for PgBouncer (or another pooler) in transaction mode before PgBouncer 1.21: the state
            read then calls the function `tk_state`. Also read by `threadkeep sweep` and `threadkeep serve`.
        command_timeout_seconds: postgres, tiered (its Postgres store) and redis: how long a command may wait
            for its reply. Past it the connection counts as dropped (postgres: the statement is cancelled and
            the connection closed, since what the server did with the step is not known: a step is stored
            whole or not at all) and the call is retried on a new one (`RETRY_ATTEMPTS`); without a limit, a
            connection that a load balancer or NAT dropped without a word (a failover, an idle timeout) would
            wait for the kernel's TCP timeout, about 15 minutes, and one to a stopped or stuck Postgres
            backend for ever. On postgres the bound is on each try of a step (all its round trips, a COMMIT
            and any lock wait among them), on every pool, one you pass in too; the sweep and the opening of a
            store (its format gate and migrations) run without it. On a Redis Cluster too the bound is per
            try: the cluster clients threadkeep opens do not try a command again themselves (redis-py's
            default is up to 10 more tries, each as long). A try there may first read the cluster's layout
            again, asking the node the last try failed on last, each node it asks bounded by this limit as
            well. Clients passed in (`client=`, `async_client=`) keep their own timeouts. The tiered
            provider's cache has its own limit of 1 s (`docs/tiered.md`).
        step_deadline_seconds: postgres, redis, tiered (its Postgres store): how long one step (a put, a
            task's writes, a read) may spend waiting for a connection and retrying, all together. With the
            store down, a step fails within it with a `StorageError` that names it, whatever
            `POOL_TIMEOUT_SECONDS` and the retries would add up to; no try starts after it, and a wait for a
            connection is cut to what is left of it. A round trip already sent is bounded by
            `COMMAND_TIMEOUT_SECONDS` instead, so a step takes at most about this plus one command timeout,
            and a try given up after the command timeout is retried only within this. Raise it to ride
            out longer outages (a failover) in the step instead of failing the run (`docs/production.md`).
        resume_enabled: `TurnManager`: keep a turn that failed, timed out or was cut off by a crash, so that
            `resume_last_turn(user)` continues it (`docs/turns.md`). Off: such a turn is purged like a
            completed one, and the state file is neither read nor written.
        resume_state_path: `TurnManager`: the file naming each user's resumable turn (its thread, its
            message, a wall-clock stamp), replaced atomically at each change. It holds the user's message:
            keep it where the checkpoints are. Deleting it drops every pending resume.
        resume_ttl: `TurnManager`: seconds a kept turn stays resumable after its stamp; an older entry is
            ignored and dropped at the next write.
        api_keys: `threadkeep serve`: bearer API keys, comma-separated `key:user:role` (role `admin` or
            `user`); only an admin key may sweep or write settings. A secret: never logged.
        database_url: Fallback Postgres DSN.
        redis_url: Fallback Redis URL.
    """

    provider: ProviderName = "sqlite"
    conn_string: str | None = None
    cache_url: str | None = None
    cache_ttl_seconds: int = 86400
    cache_lease_seconds: float = 2.0
    codec: CodecName = "json"
    msgpack_strict: bool = True
    inline_compress_bytes: int | None = 65536
    retention_waiting_minutes: int = 10080
    retention_finished_minutes: int = 1440
    retention_interrupt_minutes: int | None = None
    enforce_user_isolation: bool = True
    state_history_limit: int | None = None
    retry_attempts: int = 3
    retry_backoff_seconds: float = 1.0
    pool_min_size: int = 1
    pool_max_size: int = 10
    pool_timeout_seconds: int = 30
    connect_timeout_seconds: int = 10
    prepare_threshold: int | None = 5
    command_timeout_seconds: int = 30
    step_deadline_seconds: float = 10.0
    resume_enabled: bool = False
    resume_state_path: str = DEFAULT_RESUME_STATE_PATH
    resume_ttl: int = 3600
    api_keys: str | None = field(default=None, repr=False)
    database_url: str | None = field(default=None, repr=False)
    redis_url: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _check_type("enforce_user_isolation", self.enforce_user_isolation, bool)
        _check_type("msgpack_strict", self.msgpack_strict, bool)
        _check_type("resume_enabled", self.resume_enabled, bool)
        _check_type("resume_state_path", self.resume_state_path, str)
        _check_type("retry_backoff_seconds", self.retry_backoff_seconds, (int, float))
        for name in ("conn_string", "cache_url", "api_keys", "database_url", "redis_url"):
            if getattr(self, name) is not None:
                _check_type(name, getattr(self, name), str)
        _check_choice("provider", self.provider, PROVIDERS)
        _check_choice("codec", self.codec, CODECS)
        for name in (
            "retention_waiting_minutes",
            "retention_finished_minutes",
            "cache_ttl_seconds",
            "retry_attempts",
            "pool_min_size",
            "pool_max_size",
            "pool_timeout_seconds",
            "connect_timeout_seconds",
            "command_timeout_seconds",
            "resume_ttl",
        ):
            _check_positive(name, getattr(self, name))
        if self.pool_min_size > self.pool_max_size:
            raise ConfigurationError(
                f"{_variable('pool_min_size')}={self.pool_min_size} exceeds "
                f"{_variable('pool_max_size')}={self.pool_max_size}",
                context={"min_size": self.pool_min_size, "max_size": self.pool_max_size},
            )
        if self.prepare_threshold is not None and (
            isinstance(self.prepare_threshold, bool)
            or not isinstance(self.prepare_threshold, int)
            or self.prepare_threshold < 0
        ):
            raise ConfigurationError(
                f"{_variable('prepare_threshold')}={self.prepare_threshold!r} must be a whole number, "
                "zero or more, or null (never prepare statements: PgBouncer's transaction mode "
                "before 1.21)",
                context={"variable": _variable("prepare_threshold"), "value": repr(self.prepare_threshold)},
            )
        for name in ("inline_compress_bytes", "state_history_limit", "retention_interrupt_minutes"):
            value = getattr(self, name)
            if value is not None:
                _check_positive(name, value)
        for name in ("cache_lease_seconds", "step_deadline_seconds"):
            _check_seconds(name, getattr(self, name))
        if not math.isfinite(self.retry_backoff_seconds) or self.retry_backoff_seconds < 0:
            raise ConfigurationError(
                f"{_variable('retry_backoff_seconds')}={self.retry_backoff_seconds!r} must be a "
                "finite number of seconds, zero or more",
                context={"variable": _variable("retry_backoff_seconds")},
            )
        if self.retention_finished_minutes > self.retention_waiting_minutes:
            raise ConfigurationError(
                f"{_variable('retention_finished_minutes')}={self.retention_finished_minutes} "
                f"exceeds {_variable('retention_waiting_minutes')}="
                f"{self.retention_waiting_minutes}: a finished thread may not outlive a waiting one",
                context={
                    "finished_minutes": self.retention_finished_minutes,
                    "waiting_minutes": self.retention_waiting_minutes,
                },
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``environ`` (default: ``os.environ``).

        Raises:
            ConfigurationError: a removed variable is set, or a value is malformed or out of
                range; the message names the variable and the value.
        """
        env = os.environ if environ is None else environ
        refuse_removed(env)
        values: dict[str, object] = {}
        for variable, (name, _default) in VARIABLES.items():
            raw = env.get(variable)
            if raw is not None:
                values[name] = _parse(variable, name, raw)
        return cls(**values)  # type: ignore[arg-type]

    def with_values(self, **changes: object) -> Settings:
        """Return a copy with ``changes`` applied and validated like :meth:`from_env`."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def updated(self, variables: Mapping[str, str | None]) -> Settings:
        """A settings write: these settings with ``variables`` (spelled as environment
        variables; ``None`` restores a default) applied, validated like :meth:`from_env`.

        Raises:
            ConfigurationError: a removed or unknown variable, or a value refused; the
                message names the variable.
        """
        refuse_removed(variables)
        unknown = sorted(set(variables) - set(VARIABLES))
        if unknown:
            raise ConfigurationError(
                f"unknown setting(s) {', '.join(unknown)}; the settings are listed in docs/settings.md",
                context={"variables": unknown},
            )
        env = {name: value for name, value in self.as_env().items() if value is not None}
        for variable, value in variables.items():
            if value is None:
                env.pop(variable, None)
            else:
                env[variable] = value
        return Settings.from_env(env)

    def sqlite_path(self) -> str:
        """The SQLite file path this deployment uses."""
        return self.conn_string or DEFAULT_SQLITE_PATH

    def postgres_dsn(self) -> str:
        """The Postgres DSN: the connection string, else ``DATABASE_URL``; empty if neither is
        set, which the postgres and tiered providers refuse."""
        return self.conn_string or self.database_url or ""

    def redis_url_for(self, provider: str) -> str | None:
        """The Redis URL of ``redis`` (the connection string) or ``tiered`` (the cache URL)."""
        primary = self.conn_string if provider == "redis" else self.cache_url
        return primary or self.redis_url

    def as_env(self) -> dict[str, str | None]:
        """The settings spelled as environment variables (secrets included; do not log)."""
        out: dict[str, str | None] = {}
        for variable, (name, _default) in VARIABLES.items():
            value = getattr(self, name)
            out[variable] = (
                None if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            )
        return out


def refuse_removed(environ: Mapping[str, object]) -> None:
    """Refuse any removed variable present in ``environ``, naming it and its replacement."""
    for variable, instead in REMOVED_VARIABLES.items():
        if variable in environ:
            raise ConfigurationError(
                f"{variable} was removed and is still set (to {environ[variable]!r}); unset it and {instead}",
                code="CONFIG_REMOVED_001",
                context={"variable": variable},
            )


def _variable(name: str) -> str:
    for variable, (field_name, _default) in VARIABLES.items():
        if field_name == name:
            return variable
    return name  # pragma: no cover - every field has a variable


def _check_type(name: str, value: object, kinds: type | tuple[type, ...]) -> None:
    if not isinstance(value, kinds) or (kinds is not bool and isinstance(value, bool)):
        raise ConfigurationError(
            f"{_variable(name)}={value!r} has the wrong type",
            context={"variable": _variable(name), "value": repr(value)},
        )


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigurationError(
            f"{_variable(name)}={value!r} is not one of {', '.join(choices)}",
            context={"variable": _variable(name), "value": value},
        )


def _check_seconds(name: str, value: float) -> None:
    _check_type(name, value, (int, float))
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"{_variable(name)}={value!r} must be a positive, finite number of seconds",
            context={"variable": _variable(name)},
        )


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(
            f"{_variable(name)}={value!r} must be a positive whole number",
            context={"variable": _variable(name), "value": value},
        )


def _parse(variable: str, name: str, raw: str) -> object:
    kinds = {f.name: f.type for f in fields(Settings)}
    kind = str(kinds[name])
    text = raw.strip()
    if "None" in kind and text.lower() in _NULL:
        return None
    if kind.startswith("bool"):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigurationError(
            f"{variable}={raw!r} is not a boolean (true or false)",
            context={"variable": variable, "value": raw},
        )
    if kind.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise ConfigurationError(
                f"{variable}={raw!r} is not a whole number" + (" (or null)" if "None" in kind else ""),
                context={"variable": variable, "value": raw},
            ) from None
    if kind.startswith("float"):
        try:
            return float(text)
        except ValueError:
            raise ConfigurationError(
                f"{variable}={raw!r} is not a number", context={"variable": variable, "value": raw}
            ) from None
    return text if name in ("provider", "codec") else raw

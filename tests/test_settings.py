"""Deployment settings (SPEC P1, P2, C5, C7, W3, W4, S3, RT1, RT6): defaults, parsing, refusals."""

from __future__ import annotations

from typing import Any

import pytest

import threadkeep
from threadkeep.errors import ConfigurationError
from threadkeep.settings import DEFAULT_SQLITE_PATH, VARIABLES, Settings, refuse_removed

WAITING = "LLM_PROVIDER_CHECKPOINT_RETENTION_WAITING_MINUTES"
FINISHED = "LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES"
COMPRESS = "LLM_PROVIDER_CHECKPOINT_INLINE_COMPRESS_BYTES"
VARIABLES_BY_FIELD = {name: variable for variable, (name, _) in VARIABLES.items()}
REMOVED = ["LLM_PROVIDER_CHECKPOINT_TTL_MINUTES", "FLOW_CHECKPOINT_RETENTION_DAYS"]


def refused(environ: dict[str, str]) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env(environ)
    return caught.value


def refused_direct(**values: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        Settings(**values)
    return caught.value


# --- defaults --------------------------------------------------------------------------------


def test_p1_defaults_with_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings.provider == "sqlite"
    assert settings.conn_string is None
    assert settings.cache_url is None
    assert settings.retention_waiting_minutes == 10080
    assert settings.retention_finished_minutes == 1440
    assert settings.inline_compress_bytes == 65536
    assert settings.codec == "json"
    assert settings.enforce_user_isolation is True
    assert settings.state_history_limit is None
    assert settings.retry_attempts == 3
    assert settings.retry_backoff_seconds == 1.0
    assert settings.database_url is None
    assert settings.redis_url is None
    assert settings == Settings()


def test_p1_default_store_is_a_sqlite_file_under_the_working_directory() -> None:
    assert DEFAULT_SQLITE_PATH == ".threadkeep/checkpoints.sqlite"
    assert Settings.from_env({}).sqlite_path() == ".threadkeep/checkpoints.sqlite"
    conn = {"LLM_PROVIDER_CHECKPOINT_CONN_STRING": "/data/agents.sqlite"}
    assert Settings.from_env(conn).sqlite_path() == "/data/agents.sqlite"


def test_p1_every_variable_default_matches_the_settings_default() -> None:
    defaults = Settings()
    env_defaults = {variable: default for variable, (_, default) in VARIABLES.items() if default is not None}
    assert Settings.from_env(env_defaults) == defaults
    for variable, (name, default) in VARIABLES.items():
        spelled = defaults.as_env()[variable]
        assert spelled == default, f"{variable}: {spelled!r} != {default!r}"
        assert hasattr(defaults, name)


def test_p1_reads_os_environ_when_given_no_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [*VARIABLES, *REMOVED]:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "memory")
    monkeypatch.setenv(WAITING, "6000")
    settings = Settings.from_env()
    assert settings.provider == "memory"
    assert settings.retention_waiting_minutes == 6000


# --- parsing each variable -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["memory", "sqlite", "postgres", "redis", "tiered"])
def test_p1_each_provider_is_accepted(name: str) -> None:
    # (not called ``provider``: the shared conftest parametrizes a fixture of that name)
    assert Settings.from_env({"LLM_PROVIDER_CHECKPOINT": name}).provider == name
    assert Settings.from_env({"LLM_PROVIDER_CHECKPOINT": f"  {name}\n"}).provider == name


def test_p2_connection_strings_are_read() -> None:
    settings = Settings.from_env(
        {
            "LLM_PROVIDER_CHECKPOINT": "tiered",
            "LLM_PROVIDER_CHECKPOINT_CONN_STRING": "postgresql://u:p@db/agents",
            "LLM_PROVIDER_CHECKPOINT_CACHE_URL": "redis://cache:6379/1",
            "DATABASE_URL": "postgresql://base/db",
            "REDIS_URL": "redis://base:6379/0",
        }
    )
    assert settings.conn_string == "postgresql://u:p@db/agents"
    assert settings.cache_url == "redis://cache:6379/1"
    assert settings.database_url == "postgresql://base/db"
    assert settings.redis_url == "redis://base:6379/0"


def test_p2_secrets_stay_out_of_the_repr() -> None:
    settings = Settings.from_env(
        {"DATABASE_URL": "postgresql://u:hunter2@db/x", "REDIS_URL": "redis://:hunter2@r"}
    )
    assert "hunter2" not in repr(settings)


def test_rt1_retention_minutes_are_read() -> None:
    settings = Settings.from_env({WAITING: "120", FINISHED: " 30 "})
    assert settings.retention_waiting_minutes == 120
    assert settings.retention_finished_minutes == 30


INTERRUPT = "LLM_PROVIDER_CHECKPOINT_RETENTION_INTERRUPT_MINUTES"


@pytest.mark.parametrize(("raw", "expected"), [("43200", 43200), ("60", 60), ("null", None)])
def test_rt1_the_interrupt_horizon_is_read_unset_by_default(raw: str, expected: int | None) -> None:
    assert Settings.from_env({}).retention_interrupt_minutes is None
    # it may be longer than the waiting retention: it only ends the interrupts filter's spare
    assert Settings.from_env({INTERRUPT: raw}).retention_interrupt_minutes == expected


@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "a week"])
def test_rt1_the_interrupt_horizon_must_be_positive_or_null(raw: str) -> None:
    assert INTERRUPT in str(refused({INTERRUPT: raw}))


def test_rt1_finished_may_equal_waiting() -> None:
    settings = Settings.from_env({WAITING: "60", FINISHED: "60"})
    assert settings.retention_finished_minutes == settings.retention_waiting_minutes == 60


@pytest.mark.parametrize(
    ("raw", "expected"), [("1024", 1024), ("null", None), ("NULL", None), ("none", None)]
)
def test_c5_inline_compress_bytes_is_read_and_null_turns_it_off(raw: str, expected: int | None) -> None:
    assert Settings.from_env({COMPRESS: raw}).inline_compress_bytes == expected


@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_c7_codec_is_read(codec: str) -> None:
    assert Settings.from_env({"LLM_PROVIDER_CHECKPOINT_CODEC": codec}).codec == codec


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("on", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("off", False),
    ],
)
def test_w3_user_isolation_is_read_as_a_boolean(raw: str, expected: bool) -> None:
    assert (
        Settings.from_env({"LLM_PROVIDER_CHECKPOINT_USER_ISOLATION": raw}).enforce_user_isolation is expected
    )


@pytest.mark.parametrize(("raw", "expected"), [("20", 20), ("null", None)])
def test_s3_history_limit_is_read(raw: str, expected: int | None) -> None:
    assert Settings.from_env({"LLM_PROVIDER_CHECKPOINT_HISTORY_LIMIT": raw}).state_history_limit == expected


def test_w4_retry_attempts_and_backoff_are_read() -> None:
    settings = Settings.from_env(
        {
            "LLM_PROVIDER_CHECKPOINT_RETRY_ATTEMPTS": "5",
            "LLM_PROVIDER_CHECKPOINT_RETRY_BACKOFF_SECONDS": "0.25",
        }
    )
    assert settings.retry_attempts == 5
    assert settings.retry_backoff_seconds == 0.25
    no_wait = Settings.from_env({"LLM_PROVIDER_CHECKPOINT_RETRY_BACKOFF_SECONDS": "0"})
    assert no_wait.retry_backoff_seconds == 0.0


def test_p1_settings_spelled_as_env_read_back_equal() -> None:
    settings = Settings(
        provider="redis",
        conn_string="redis://r/0",
        codec="msgpack",
        inline_compress_bytes=None,
        retention_waiting_minutes=90,
        retention_finished_minutes=15,
        enforce_user_isolation=False,
        state_history_limit=7,
        retry_attempts=2,
        retry_backoff_seconds=0.5,
    )
    spelled = {k: v for k, v in settings.as_env().items() if v is not None}
    spelled[COMPRESS] = "null"
    assert Settings.from_env(spelled) == settings


# --- refusals --------------------------------------------------------------------------------


def test_p1_unknown_provider_is_refused_naming_it() -> None:
    error = refused({"LLM_PROVIDER_CHECKPOINT": "mongo"})
    assert "LLM_PROVIDER_CHECKPOINT" in error.message
    assert "mongo" in error.message
    assert error.code == "CONFIG_001"


def test_c7_unknown_codec_is_refused_naming_it() -> None:
    error = refused({"LLM_PROVIDER_CHECKPOINT_CODEC": "protobuf"})
    assert "LLM_PROVIDER_CHECKPOINT_CODEC" in error.message
    assert "protobuf" in error.message


def test_rt1_finished_above_waiting_is_refused_naming_both_values() -> None:
    error = refused({WAITING: "60", FINISHED: "120"})
    for part in (WAITING, FINISHED, "60", "120"):
        assert part in error.message


def test_rt1_finished_above_the_default_waiting_is_refused_naming_both_values() -> None:
    error = refused({FINISHED: "20000"})
    for part in (WAITING, FINISHED, "10080", "20000"):
        assert part in error.message


@pytest.mark.parametrize("variable", [WAITING, FINISHED])
@pytest.mark.parametrize("raw", ["0", "-5", "abc", "1.5", "", "null"])
def test_rt1_retention_minutes_must_be_positive_whole_numbers(variable: str, raw: str) -> None:
    error = refused({variable: raw})
    assert variable in error.message
    assert raw in error.message


@pytest.mark.parametrize("raw", ["0", "-1", "lots", "1.5"])
def test_c5_inline_compress_bytes_must_be_positive_or_null(raw: str) -> None:
    error = refused({COMPRESS: raw})
    assert COMPRESS in error.message
    assert raw in error.message


@pytest.mark.parametrize("raw", ["maybe", "2", "", "enabled"])
def test_w3_bad_boolean_is_refused_naming_it(raw: str) -> None:
    error = refused({"LLM_PROVIDER_CHECKPOINT_USER_ISOLATION": raw})
    assert "LLM_PROVIDER_CHECKPOINT_USER_ISOLATION" in error.message
    assert repr(raw) in error.message


@pytest.mark.parametrize("raw", ["0", "-3", "many"])
def test_s3_history_limit_must_be_positive_or_null(raw: str) -> None:
    error = refused({"LLM_PROVIDER_CHECKPOINT_HISTORY_LIMIT": raw})
    assert "LLM_PROVIDER_CHECKPOINT_HISTORY_LIMIT" in error.message
    assert raw in error.message


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("LLM_PROVIDER_CHECKPOINT_RETRY_ATTEMPTS", "0"),
        ("LLM_PROVIDER_CHECKPOINT_RETRY_ATTEMPTS", "three"),
        ("LLM_PROVIDER_CHECKPOINT_RETRY_BACKOFF_SECONDS", "-1"),
        ("LLM_PROVIDER_CHECKPOINT_RETRY_BACKOFF_SECONDS", "soon"),
    ],
)
def test_w4_bad_retry_settings_are_refused_naming_them(variable: str, raw: str) -> None:
    error = refused({variable: raw})
    assert variable in error.message
    assert raw in error.message


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_w4_non_finite_backoff_is_refused(raw: str) -> None:
    # time.sleep(nan) raises and time.sleep(inf) never returns: refuse at start instead.
    error = refused({"LLM_PROVIDER_CHECKPOINT_RETRY_BACKOFF_SECONDS": raw})
    assert "LLM_PROVIDER_CHECKPOINT_RETRY_BACKOFF_SECONDS" in error.message


@pytest.mark.parametrize("variable", REMOVED)
@pytest.mark.parametrize("raw", ["60", ""])
def test_rt6_removed_variable_refuses_start(variable: str, raw: str) -> None:
    error = refused({variable: raw})
    assert variable in error.message
    assert error.code == "CONFIG_REMOVED_001"
    assert error.context["variable"] == variable


def test_rt6_removed_variable_refuses_even_beside_valid_settings() -> None:
    error = refused(
        {"LLM_PROVIDER_CHECKPOINT": "memory", WAITING: "60", "FLOW_CHECKPOINT_RETENTION_DAYS": "7"}
    )
    assert "FLOW_CHECKPOINT_RETENTION_DAYS" in error.message
    assert error.code == "CONFIG_REMOVED_001"


@pytest.mark.parametrize("variable", REMOVED)
def test_rt6_removed_variable_refuses_a_settings_write(variable: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        refuse_removed({WAITING: "60", variable: "1"})
    assert variable in caught.value.message
    assert caught.value.code == "CONFIG_REMOVED_001"
    refuse_removed({WAITING: "60"})  # a write without them passes


# --- direct construction and with_values validate the same way ------------------------------


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"provider": "mongo"}, ["LLM_PROVIDER_CHECKPOINT", "mongo"]),
        ({"codec": "xml"}, ["LLM_PROVIDER_CHECKPOINT_CODEC", "xml"]),
        ({"retention_waiting_minutes": 0}, [WAITING, "0"]),
        ({"retention_finished_minutes": -1}, [FINISHED, "-1"]),
        ({"retention_waiting_minutes": True}, [WAITING, "True"]),
        (
            {"retention_waiting_minutes": 60, "retention_finished_minutes": 61},
            [WAITING, FINISHED, "60", "61"],
        ),
        ({"inline_compress_bytes": 0}, [COMPRESS, "0"]),
        ({"state_history_limit": -2}, ["LLM_PROVIDER_CHECKPOINT_HISTORY_LIMIT", "-2"]),
        ({"retry_attempts": 0}, ["LLM_PROVIDER_CHECKPOINT_RETRY_ATTEMPTS", "0"]),
        ({"retry_backoff_seconds": -0.5}, ["LLM_PROVIDER_CHECKPOINT_RETRY_BACKOFF_SECONDS", "-0.5"]),
    ],
)
def test_p1_direct_construction_validates_like_from_env(values: dict[str, Any], names: list[str]) -> None:
    error = refused_direct(**values)
    for name in names:
        assert name in error.message


@pytest.mark.parametrize(
    "values",
    [{"enforce_user_isolation": "maybe"}, {"retry_backoff_seconds": "abc"}],
    ids=["isolation-not-a-bool", "backoff-not-a-number"],
)
def test_w3_w4_direct_construction_refuses_values_of_the_wrong_type(values: dict[str, Any]) -> None:
    # from_env refuses "maybe" and "abc" with a ConfigurationError; so must Settings(...).
    error = refused_direct(**values)
    (name,) = values
    assert VARIABLES_BY_FIELD[name] in error.message


def test_rt1_with_values_validates() -> None:
    base = Settings()
    shorter = base.with_values(retention_waiting_minutes=60, retention_finished_minutes=30)
    assert (shorter.retention_waiting_minutes, shorter.retention_finished_minutes) == (60, 30)
    assert base.retention_waiting_minutes == 10080  # unchanged: settings are values
    with pytest.raises(ConfigurationError) as caught:
        base.with_values(retention_finished_minutes=20000)
    for part in (WAITING, FINISHED, "10080", "20000"):
        assert part in caught.value.message
    with pytest.raises(ConfigurationError, match="mongo"):
        base.with_values(provider="mongo")


# --- open_checkpointer -----------------------------------------------------------------------


def test_p1_open_checkpointer_refuses_an_unknown_provider_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="mongo"):
        threadkeep.open_checkpointer(provider="mongo", settings=Settings())


def test_p1_open_checkpointer_refuses_an_unknown_provider_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in REMOVED:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "mongo")
    with pytest.raises(ConfigurationError, match="mongo"):
        threadkeep.open_checkpointer()


def test_rt6_open_checkpointer_refuses_a_removed_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_TTL_MINUTES", "60")
    with pytest.raises(ConfigurationError, match="LLM_PROVIDER_CHECKPOINT_TTL_MINUTES"):
        threadkeep.open_checkpointer("memory")


def test_p1_open_checkpointer_refuses_an_unknown_option_naming_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        threadkeep.open_checkpointer("memory", settings=Settings(), bogus=1)
    assert "bogus" in caught.value.message
    assert caught.value.context["options"] == ["bogus"]


@pytest.mark.parametrize(("raw", "expected"), [("5", 5), ("0", 0), ("null", None), ("none", None)])
def test_prepare_threshold_is_read(raw: str, expected: int | None) -> None:
    settings = Settings.from_env({"LLM_PROVIDER_CHECKPOINT_PREPARE_THRESHOLD": raw})
    assert settings.prepare_threshold == expected


@pytest.mark.parametrize("raw", ["-1", "x", "1.5"])
def test_prepare_threshold_must_be_zero_or_more_or_null(raw: str) -> None:
    with pytest.raises(ConfigurationError, match="LLM_PROVIDER_CHECKPOINT_PREPARE_THRESHOLD"):
        Settings.from_env({"LLM_PROVIDER_CHECKPOINT_PREPARE_THRESHOLD": raw})


def test_command_timeout_is_read_and_must_be_positive() -> None:
    variable = "LLM_PROVIDER_CHECKPOINT_COMMAND_TIMEOUT_SECONDS"
    assert Settings.from_env({variable: "5"}).command_timeout_seconds == 5
    for raw in ("0", "-1", "x"):
        with pytest.raises(ConfigurationError, match=variable):
            Settings.from_env({variable: raw})


def test_w4_a_step_that_went_unanswered_is_not_said_to_be_unstored() -> None:
    """Out of attempts after a try that got no answer (it may still run on the server),
    even if later tries failed otherwise, the error does not say nothing was stored."""
    from threadkeep import StorageError
    from threadkeep.core.retry import RetryPolicy

    retry = RetryPolicy(attempts=2, backoff=0.0, retryable=lambda error: True, store="postgres")
    refused = ConnectionError("connection refused")
    with pytest.raises(StorageError, match="nothing of this step was stored"):
        retry.delay_after(refused, 2)
    with pytest.raises(StorageError, match="a try got no answer") as raised:
        retry.delay_after(refused, 2, unconfirmed=True)
    assert "nothing of this step was stored" not in str(raised.value)
    with pytest.raises(StorageError, match="unreachable after 2 attempts") as raised:
        retry.delay_after(refused, 2, unconfirmed=True, write=False)  # a read stores no step
    assert "step" not in str(raised.value)
    single = RetryPolicy(attempts=1, backoff=0.0, retryable=lambda error: True, store="postgres")
    with pytest.raises(StorageError, match="unreachable after 1 attempt: connection refused"):
        single.delay_after(refused, 1, write=False)


def test_w4_tries_count_failures_and_keep_an_unanswered_one_through_later_failures() -> None:
    """An engine's retry loop: the first try is known as such, each failure gives the
    policy's backoff, and a try given up on unanswered colours the final error even when
    the last try failed otherwise."""
    from threadkeep import StorageError
    from threadkeep.core.retry import RetryPolicy, Tries

    policy = RetryPolicy(attempts=3, backoff=0.5, retryable=lambda error: True, store="redis")
    tries = Tries(policy, True, lambda error: isinstance(error, TimeoutError))
    assert tries.first
    assert tries.failed(TimeoutError("no reply")) == 0.5
    assert not tries.first
    assert tries.failed(ConnectionError("refused")) == 1.0
    with pytest.raises(StorageError, match="after 3 attempts: refused; a try got no answer"):
        tries.failed(ConnectionError("refused"))


def test_w4_a_postgres_try_may_have_stored_its_step_only_if_lost_while_a_commit_was_out() -> None:
    """The Postgres engine's rule for its tries: only a try that failed while a round trip
    that may commit was out, and not by the server's own answer, may have stored its step."""
    import psycopg

    from threadkeep.backends.postgres.rounds import InFlight

    in_flight = InFlight()
    lost = psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
    in_flight.commits = False
    in_flight.sending()  # BEGIN and a lock: nothing can commit yet
    assert not in_flight(lost)
    in_flight.commits = True
    for error, may_have_run in (
        (lost, True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),  # answered: rolled back
        (psycopg.errors.SerializationFailure("could not serialize access"), False),
    ):
        in_flight.sending()  # the rows and the COMMIT
        assert in_flight(error) is may_have_run
    in_flight.sending()
    assert in_flight(lost)
    in_flight.commits = False  # the next try: BEGIN and a lock, lost; the try before does not count
    in_flight.sending()
    assert not in_flight(lost)


def test_step_deadline_is_read_and_must_be_a_positive_finite_number() -> None:
    variable = "LLM_PROVIDER_CHECKPOINT_STEP_DEADLINE_SECONDS"
    assert Settings().step_deadline_seconds == 10.0
    assert Settings.from_env({variable: "2.5"}).step_deadline_seconds == 2.5
    for raw in ("0", "-1", "inf", "nan", "x"):
        with pytest.raises(ConfigurationError, match=variable):
            Settings.from_env({variable: raw})


def _settings_doc() -> dict[str, Any]:
    import runpy
    from pathlib import Path

    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "tools" / "gen_settings_doc.py"))


def test_docs_settings_page_is_generated_from_the_definitions_and_current() -> None:
    """docs/settings.md's table is what tools/gen_settings_doc.py writes from the settings'
    own definitions, and every setting has a description there (a stale page fails here
    and in ./dev test's --check)."""
    tool = _settings_doc()
    assert tool["undocumented"]() == [], "describe each setting in the Settings docstring's Attributes"
    page = tool["PAGE"].read_text()
    assert page == tool["render"](tool["hand_written"](page)), (
        "docs/settings.md is stale: run python tools/gen_settings_doc.py"
    )


def test_the_settings_doc_generator_describes_a_setting_from_its_definition_and_flags_a_missing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A setting added to VARIABLES without a description does not crash the generator: its
    row says so, and the check names it."""
    tool = _settings_doc()
    variables = {**VARIABLES, "LLM_PROVIDER_CHECKPOINT_NEW_THING": ("new_thing", "7")}
    monkeypatch.setitem(tool["render"].__globals__, "VARIABLES", variables)
    rendered = tool["render"]("hand-written part\n")
    assert "| `LLM_PROVIDER_CHECKPOINT_CONNECT_TIMEOUT_SECONDS` | `10` | postgres, redis, tiered" in rendered
    assert "| `LLM_PROVIDER_CHECKPOINT_NEW_THING` | `7` | (undescribed" in rendered
    assert rendered.endswith(tool["MARKER"] + "\n\nhand-written part\n")
    assert tool["undocumented"]() == ["new_thing"]

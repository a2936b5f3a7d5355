"""How the Postgres engine turns a program into round trips (``backends/postgres/rounds.py``),
checked without a server: what each round trip carries, and what the program receives."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from threadkeep.backends.postgres.rounds import (
    BEGIN,
    COMMIT,
    InFlight,
    PlannedOnce,
    Preparing,
    planned,
    round_trips,
)
from threadkeep.core.program import END_TRANSACTION, Batch, Sql, SqlMany


def trace(program: Any, transaction: bool, answer: Any) -> tuple[list[list[Any]], Any, InFlight]:
    """Run ``program`` through :func:`round_trips`, answering each round trip with
    ``answer(statements)``: the round trips sent, the program's result, its InFlight."""
    in_flight = InFlight()
    trips = round_trips(program, transaction, in_flight)
    sent: list[list[Any]] = []
    try:
        statements = next(trips)
        while True:
            sent.append(statements)
            statements = trips.send(answer(statements))
    except StopIteration as stop:
        return sent, stop.value, in_flight


def answers(statements: list[Any]) -> list[Any]:
    """The server's answers: BEGIN/COMMIT as their status, a statement's rows as its SQL."""
    return [s if isinstance(s, str) else [(s.sql,)] if isinstance(s, Sql) else None for s in statements]


LOCK = Sql("SELECT lock", {})
WRITE = Sql("INSERT row", {"a": 1})
READ = Sql("SELECT state", {})


def test_a_transaction_opens_with_its_first_round_trip_and_held_writes_travel_with_the_commit() -> None:
    def locked_put() -> Any:
        locked = yield LOCK
        written = yield Batch((WRITE, SqlMany("INSERT many", [{"b": 1}])), wanted=False)
        return locked, written

    sent, result, in_flight = trace(locked_put(), True, answers)
    assert sent == [[BEGIN, LOCK], [WRITE, SqlMany("INSERT many", [{"b": 1}]), COMMIT]]
    assert result == ([("SELECT lock",)], [None, None])
    assert in_flight.commits  # the last round trip carried the COMMIT


def test_a_lone_statement_that_may_commit_goes_alone_without_begin_or_commit() -> None:
    def put() -> Any:
        return (yield Batch((WRITE,), ends=True))

    sent, result, in_flight = trace(put(), True, answers)
    assert sent == [[WRITE]]
    assert result == [[("INSERT row",)]]
    assert in_flight.commits


def test_a_program_of_several_transactions_commits_at_each_end_and_begins_anew() -> None:
    def upgrade() -> Any:
        first = yield LOCK
        yield END_TRANSACTION
        yield END_TRANSACTION  # no transaction open: nothing to send
        yield Batch((WRITE,), wanted=False)
        yield END_TRANSACTION
        second = yield LOCK
        return first, second

    sent, result, in_flight = trace(upgrade(), True, answers)
    assert sent == [[BEGIN, LOCK], [COMMIT], [BEGIN, WRITE, COMMIT], [BEGIN, LOCK], [COMMIT]]
    assert result == ([("SELECT lock",)], [("SELECT lock",)])
    assert in_flight.commits


def test_a_read_opens_no_transaction() -> None:
    def read() -> Any:
        state = yield READ
        more = yield Sql("SELECT more", {})
        return state, more

    sent, result, _ = trace(read(), False, answers)
    assert sent == [[READ], [Sql("SELECT more", {})]]
    assert result == ([("SELECT state",)], [("SELECT more",)])


def test_an_independent_batch_runs_as_one_statement_of_ctes() -> None:
    def fused() -> Any:
        return (yield Batch((READ, Sql("DELETE x WHERE k = %(k)s", {"k": 2})), independent=True))

    sent, result, _ = trace(fused(), False, answers)
    ((statement,),) = sent
    assert statement.sql.startswith("WITH r0 AS (\nSELECT state\n), w1 AS (\nDELETE x WHERE k = %(s1_k)s\n)")
    assert statement.params == {"s1_k": 2}
    assert result == [[(statement.sql,)], []]


def test_a_transaction_the_server_rolled_back_is_not_reported_committed() -> None:
    def put() -> Any:
        yield LOCK
        yield Batch((WRITE,), wanted=False)
        return "stored"

    def rolled_back(statements: list[Any]) -> list[Any]:
        return [
            "ROLLBACK" if s == COMMIT else a for s, a in zip(statements, answers(statements), strict=True)
        ]

    with pytest.raises(psycopg.errors.InFailedSqlTransaction, match="nothing of it was stored"):
        trace(put(), True, rolled_back)


def test_a_failed_round_trip_is_raised_inside_the_program_and_what_it_held_is_dropped() -> None:
    def guarded() -> Any:
        yield Batch((WRITE,), wanted=False)
        try:
            yield LOCK
        except psycopg.errors.LockNotAvailable:
            yield Batch((Sql("INSERT note", {}),), wanted=False)
            return "refused"
        return "went on"

    trips = round_trips(guarded(), True, InFlight())
    assert next(trips) == [BEGIN, WRITE, LOCK]
    # what the program does after the failure ends the transaction; the server answers
    # its COMMIT with ROLLBACK (the transaction had failed): nothing of it was stored
    assert trips.throw(psycopg.errors.LockNotAvailable("could not obtain lock")) == [
        Sql("INSERT note", {}),
        COMMIT,
    ]
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        trips.send([None, "ROLLBACK"])


PLANNED = PlannedOnce({"SELECT state": "SELECT tk_state()"}, "SET LOCAL plan_cache_mode")


@pytest.mark.parametrize(
    ("write", "threshold", "prepared"), [(False, 5, False), (True, 5, None), (True, None, None)]
)
def test_only_writes_and_statements_planned_once_are_prepared(
    write: bool, threshold: int | None, prepared: bool | None
) -> None:
    preparing = Preparing(write, PLANNED)
    assert preparing("INSERT row", threshold) is prepared
    assert preparing("SELECT state", threshold) is (True if threshold is not None else prepared)


def test_a_statement_planned_once_goes_behind_its_settings_or_becomes_its_stand_in() -> None:
    preparing = Preparing(False, PLANNED)
    statements, results = planned([READ], preparing, 5)
    assert statements == [Sql("SET LOCAL plan_cache_mode", {}), READ]
    assert results([[], [("row",)]]) == [[("row",)]]
    statements, _ = planned([READ], preparing, None)  # a connection that never prepares
    assert statements == [Sql("SELECT tk_state()", {})]
    assert planned([WRITE], preparing, 5)[0] == [WRITE]

"""The test suite's Postgres schema pool (tests/providers.py): a schema is lent again only
empty and exactly as a fresh store's migrations leave it, so no test sees another's data."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.providers import POSTGRES_URL, SchemaPool
from threadkeep import Settings, open_checkpointer
from threadkeep.workload import build_agent, turn_input

pytestmark = pytest.mark.postgres


@pytest.fixture
def pool() -> Iterator[SchemaPool]:
    own = SchemaPool()
    yield own
    own.drop_all()


def _dsn(schema: str) -> str:
    return f"{POSTGRES_URL} options='-c search_path={schema}'"


def _used(pool: SchemaPool) -> str:
    """A schema lent by ``pool``, holding a thread a graph wrote."""
    schema = pool.lend(f"tk_test_{uuid.uuid4().hex[:16]}")
    with open_checkpointer("postgres", _dsn(schema), settings=Settings()) as saver:
        build_agent(saver).invoke(turn_input(0), {"configurable": {"thread_id": "left-behind"}})
    return schema


def test_a_passed_tests_schema_is_lent_again_empty_and_renamed(pool: SchemaPool) -> None:
    used = _used(pool)
    place = pool.created.index(used)
    pool.give_back(reusable=True)

    renamed = pool.created[place]
    assert renamed != used
    assert renamed in pool.idle
    while pool.lend("tk_test_unused") != renamed:  # the pool also holds its reference store
        pass
    with open_checkpointer("postgres", _dsn(renamed), settings=Settings()) as saver:
        assert saver.get_tuple({"configurable": {"thread_id": "left-behind"}}) is None
        assert list(saver.list(None)) == []
    with psycopg.connect(_dsn(renamed), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM tk_messages").fetchone() == (0,)
        assert conn.execute("SELECT to_regclass(%s)", (f"{used}.tk_threads",)).fetchone() == (None,)


@pytest.mark.parametrize(
    "change",
    [
        "CREATE INDEX tk_extra ON tk_checkpoints (created_at)",
        "ALTER TABLE tk_threads ADD COLUMN extra integer",
        "CREATE TABLE tk_extra (n integer)",
        "UPDATE tk_meta SET value = '0'",
        "DELETE FROM tk_migrations WHERE version = (SELECT max(version) FROM tk_migrations)",
    ],
)
def test_a_schema_a_test_changed_is_not_lent_again(pool: SchemaPool, change: str) -> None:
    used = _used(pool)
    place = pool.created.index(used)
    with psycopg.connect(_dsn(used), autocommit=True) as conn:
        conn.execute(change)  # type: ignore[arg-type]
    pool.give_back(reusable=True)

    assert pool.created[place] == used  # not renamed, so not emptied for another test
    assert used not in pool.idle


def test_a_failed_tests_schema_is_left_as_it_is(pool: SchemaPool) -> None:
    used = _used(pool)
    place = pool.created.index(used)
    pool.give_back(reusable=False)

    assert pool.created[place] == used
    assert used not in pool.idle
    with psycopg.connect(_dsn(used), autocommit=True) as conn:
        assert conn.execute("SELECT thread_id FROM tk_threads").fetchall() == [("left-behind",)]

"""Outages fail fast and recover at once (issue 36 item 6): with the store down, a turn
fails within the step deadline (``STEP_DEADLINE_SECONDS``), whatever the pool timeout and
the retries would add up to, with a ``StorageError`` that names the deadline; once the
store is back, the first turn is served at once, not after a pool's reconnection backoff.

Postgres goes "down" behind a :class:`~tests.servers.TcpProxy` that cuts every connection
and refuses new ones (the shared server keeps running); Redis is a server of the test's
own, killed and started again.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.providers import POSTGRES_URL, REDIS_URL, postgres_schema, track_redis_prefix
from tests.servers import RedisServer, TcpProxy
from threadkeep import Settings, StorageError, open_checkpointer
from threadkeep.workload import build_agent, turn_input

pytestmark = pytest.mark.slow

DEADLINE = 3.0
# Default settings but the deadline: a pool wait of 30 s, three attempts, 1 s then 2 s apart.
SETTINGS = Settings(step_deadline_seconds=DEADLINE)
# Generous room for a loaded machine: the bound is the behaviour, not a speed.
SLACK = 10.0
# How long Postgres stays down: long enough that a pool still backing off its reconnection
# tries (psycopg_pool's default: 1 s, 2 s, 4 s, 8 s apart) would make its next try, and the
# first turn after the outage, wait longer than the deadline.
OUTAGE = 10.0


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    port = int(psycopg.conninfo.conninfo_to_dict(POSTGRES_URL).get("port") or 5432)
    proxy = TcpProxy(port).accept()
    yield proxy
    proxy.close()


def timed(call: Callable[[], Any], guard: float = 120.0) -> tuple[float, BaseException | None]:
    """Run ``call`` in a thread of its own (a hang fails the test instead of stopping it):
    the seconds it took and what it raised."""
    outcome: dict[str, Any] = {"error": None}

    def run() -> None:
        try:
            call()
        except BaseException as error:
            outcome["error"] = error

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(guard)
    assert not worker.is_alive(), f"the call still ran after {guard:g} s"
    return time.monotonic() - started, outcome["error"]


def turns(graph: Any, api: str, thread_id: str) -> Callable[[int], Callable[[], Any]]:
    """Turn ``n`` of ``thread_id`` on ``graph`` as a call; for ``async``, every turn on one
    event loop (whose pool the outage hits), run in the calling thread."""
    config: Any = {"configurable": {"thread_id": thread_id}}
    if api == "sync":
        return lambda n: lambda: graph.invoke(turn_input(n), config)
    loop = asyncio.new_event_loop()

    def turn(n: int) -> Callable[[], Any]:
        return lambda: loop.run_until_complete(graph.ainvoke(turn_input(n), config))

    return turn


def outage_and_recovery(
    saver: Any, api: str, down: Callable[[], None], up: Callable[[], None], outage: float = OUTAGE
) -> None:
    """A turn, the store down (for ``outage`` seconds): the next turn fails within the
    deadline, naming it; the store back: the next turn is served at once, within one
    deadline (a step that waited out a pool's reconnection backoff would fail at the
    deadline instead)."""
    turn = turns(build_agent(saver), api, f"outage-{api}")
    elapsed, error = timed(turn(0))
    assert error is None
    down()
    went_down = time.monotonic()
    elapsed, error = timed(turn(1))
    assert isinstance(error, StorageError), error
    assert "step deadline of 3 s" in str(error)
    assert "STEP_DEADLINE_SECONDS" in str(error)
    assert elapsed < DEADLINE + SLACK, f"the turn failed after {elapsed:.1f} s"
    time.sleep(max(0.0, went_down + outage - time.monotonic()))
    up()
    elapsed, error = timed(turn(2))
    assert error is None, f"the first turn after the store came back failed: {error}"
    assert elapsed < DEADLINE, f"the first turn after the store came back took {elapsed:.1f} s"


@pytest.mark.providers("postgres")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_postgres_outage_fails_within_the_deadline_and_the_first_turn_after_it_is_served(
    provider: Any, proxy: TcpProxy, api: str
) -> None:
    dsn = postgres_schema(uuid.uuid4().hex)
    through = f"{dsn} host=127.0.0.1 port={proxy.port}"
    with open_checkpointer("postgres", through, settings=SETTINGS) as saver:
        outage_and_recovery(saver, api, proxy.refuse, proxy.accept)


@pytest.mark.providers("tiered")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_tiered_postgres_outage_fails_within_the_deadline_and_the_first_turn_after_it_is_served(
    provider: Any, proxy: TcpProxy, api: str
) -> None:
    dsn = postgres_schema(uuid.uuid4().hex)
    through = f"{dsn} host=127.0.0.1 port={proxy.port}"
    prefix = track_redis_prefix(f"tktestc{uuid.uuid4().hex[:10]}")
    settings = SETTINGS.with_values(cache_url=REDIS_URL)
    with open_checkpointer("tiered", through, settings=settings, cache_prefix=prefix) as saver:
        outage_and_recovery(saver, api, proxy.refuse, proxy.accept)


@pytest.mark.providers("redis")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_redis_outage_fails_within_the_deadline_however_many_attempts(provider: Any, api: str) -> None:
    """Ten attempts 1 s, 2 s, 4 s ... apart would wait 511 s: the deadline ends them."""
    server = RedisServer().start()
    try:
        settings = SETTINGS.with_values(retry_attempts=10)
        with open_checkpointer("redis", server.url, settings=settings) as saver:
            outage_and_recovery(saver, api, server.stop, server.start, outage=0.0)
    finally:
        server.close()


def test_the_deadline_cuts_a_long_wait_for_a_connection_to_what_is_left() -> None:
    """A try waits for a connection no longer than the deadline leaves, and a failure whose
    backoff would outlast the deadline ends the call, naming the deadline and the setting."""
    from threadkeep.core.retry import RetryPolicy, Tries

    now = [100.0]
    policy = RetryPolicy(
        attempts=5, backoff=1.0, retryable=lambda error: True, store="postgres", deadline=3.0
    )
    tries = Tries(policy, True, lambda error: False, clock=lambda: now[0])
    assert tries.wait(30.0) == 3.0
    now[0] += 1.5
    assert tries.wait(30.0) == 1.5
    assert tries.failed(ConnectionError("refused")) == 1.0  # 1.5 s left
    now[0] += 1.0
    with pytest.raises(StorageError, match="step deadline of 3 s") as raised:
        tries.failed(ConnectionError("refused"))  # 2 s backoff, 0.5 s left
    assert "LLM_PROVIDER_CHECKPOINT_STEP_DEADLINE_SECONDS; 2 attempts" in str(raised.value)
    assert "nothing of this step was stored" in str(raised.value)
    assert raised.value.context["deadline_seconds"] == 3.0


@pytest.mark.providers("postgres")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_pool_of_dead_connections_serves_the_first_turn_after_a_restart_at_once(
    provider: Any, proxy: TcpProxy, api: str
) -> None:
    """Every pooled connection dies while the pool is idle (a server restart): the first
    turn after it does not wait out psycopg_pool's sleeps between failed checks (0 s, 1 s,
    2 s, 4 s ... for five dead connections) but gets a live connection at once."""
    dsn = postgres_schema(uuid.uuid4().hex)
    through = f"{dsn} host=127.0.0.1 port={proxy.port}"
    with open_checkpointer("postgres", through, settings=SETTINGS, min_size=5) as saver:
        turn = turns(build_agent(saver), api, f"restart-{api}")
        assert timed(turn(0))[1] is None
        proxy.cut()  # every connection killed; new ones are accepted
        elapsed, error = timed(turn(1))
        assert error is None, f"the first turn after the restart failed: {error}"
        assert elapsed < DEADLINE, f"the first turn after the restart took {elapsed:.1f} s"

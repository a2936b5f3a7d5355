"""What is specific to the Redis store: scripts, hash tags, TTLs, the delete rounds, the gate."""

from __future__ import annotations

import re
import time
from importlib import resources
from typing import Any

import pytest

from tests.providers import REDIS_URL, Opener
from threadkeep import (
    CheckpointSerializationError,
    CheckpointStoreFormatError,
    Settings,
    StorageError,
    ThreadkeepError,
    open_checkpointer,
)
from threadkeep.backends.sql.programs import FORMAT_GENERATION
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, run_turns, turn_input

pytestmark = pytest.mark.providers("redis", "redis-cluster")


def raw(saver: Any) -> Any:
    """A client of the saver's own server (cluster-aware)."""
    return saver.backend.engine._sync()


def thread_keys(saver: Any, thread_id: str) -> tuple[str, ...]:
    return saver.backend.space.thread(thread_id)


def test_r1_every_key_of_a_thread_shares_one_hash_tag(open_saver: Opener, provider: Any) -> None:
    saver = open_saver()
    run_turns(build_agent(saver), "tagged", 1)
    client = raw(saver)
    prefix = saver.backend.space.prefix
    keys = [key.decode() for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
    # the store's own keys: its format, and the listing's index (one slot of its own, "{listing}")
    listing = {key for key in keys if key.startswith(f"{prefix}:{{listing}}:")}
    assert saver.backend.space.listing_key in listing
    held = set(keys) - {f"{prefix}:format"} - listing
    tags = {re.search(r"\{([^}]*)\}", key).group(1) for key in held}  # type: ignore[union-attr]
    assert len(tags) == 1
    assert held <= set(thread_keys(saver, "tagged"))
    assert saver.backend.engine.cluster is (provider.name == "redis-cluster")


def test_r1_each_script_documents_its_contract() -> None:
    folder = resources.files("threadkeep.backends.redis") / "lua"
    scripts = [
        entry for entry in folder.iterdir() if entry.name.endswith(".lua") and entry.name != "_prelude.lua"
    ]
    assert len(scripts) >= 10
    for script in scripts:
        header = script.read_text().split("\n\n")[0]
        assert header.startswith(f"-- {script.name}:"), script.name
        assert "KEYS" in header, script.name
        assert "Returns" in header, script.name


def test_r1_scripts_are_reloaded_after_the_server_forgets_them(open_saver: Opener) -> None:
    saver = open_saver()
    graph = build_agent(saver)
    run_turns(graph, "reloaded", 1)
    client = raw(saver)
    client.script_flush() if hasattr(client, "script_flush") else client.execute_command("SCRIPT", "FLUSH")
    run_turns(graph, "reloaded", 1, first=1)
    messages = saver.get_tuple({"configurable": {"thread_id": "reloaded"}}).checkpoint["channel_values"][
        "messages"
    ]
    assert len(messages) == 2 * MESSAGES_PER_TURN


def test_r2_every_key_carries_the_waiting_retention_and_a_read_does_not_extend_it(open_saver: Opener) -> None:
    saver = open_saver()
    saver.backend.ttl_ms = 60_000  # a one-minute waiting retention
    run_turns(build_agent(saver), "ttl", 1)
    client = raw(saver)
    ttls = {key: client.pttl(key) for key in thread_keys(saver, "ttl") if client.exists(key)}
    assert len(ttls) >= 7
    assert all(50_000 < ttl <= 60_000 for ttl in ttls.values()), ttls
    time.sleep(0.05)
    saver.get_tuple({"configurable": {"thread_id": "ttl"}})
    list(saver.list({"configurable": {"thread_id": "ttl"}}))
    for key, ttl in ttls.items():
        assert client.pttl(key) < ttl, key  # the clock kept running; nothing reset it


def test_r2_a_write_restarts_the_waiting_clock_of_every_key(open_saver: Opener) -> None:
    saver = open_saver()
    saver.backend.ttl_ms = 60_000
    graph = build_agent(saver)
    run_turns(graph, "clock", 1)
    client = raw(saver)
    keys = [key for key in thread_keys(saver, "clock") if client.exists(key)]
    for key in keys:
        client.pexpire(key, 1_000)  # as if most of the retention had passed
    graph.invoke(turn_input(1), {"configurable": {"thread_id": "clock"}})
    assert all(client.pttl(key) > 50_000 for key in keys)


@pytest.fixture
def writer_during_delete(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Makes a writer add checkpoints to the thread right after each delete round."""

    def install(saver: Any, added_per_round: list[int]) -> None:
        engine = saver.backend.engine
        original = engine._execute
        rounds = iter(added_per_round)

        def execute(client: Any, request: Any) -> Any:
            reply = original(client, request)
            sent = getattr(request, "requests", (request,))  # a Pipeline's, or the one request
            if any(getattr(one, "name", None) == "delete" for one in sent):
                for _ in range(next(rounds, 0)):
                    saver.put(
                        {"configurable": {"thread_id": "busy", "checkpoint_ns": ""}},
                        _checkpoint(),
                        {"source": "input", "step": -1},
                        {},
                    )
            return reply

        monkeypatch.setattr(engine, "_execute", execute)

    return install


def _checkpoint() -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    return empty_checkpoint()


def test_r3_a_thread_written_right_after_its_delete_stays(
    open_saver: Opener, writer_during_delete: Any
) -> None:
    """A delete is one script: the puts a writer makes once it has run start a new thread,
    and the writer saw them acknowledged, so they stay (issue 33: a later round deleted them)."""
    saver = open_saver()
    run_turns(build_agent(saver), "busy", 1)
    before = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "busy"}})]
    writer_during_delete(saver, [3])
    saver.delete_thread("busy")
    after = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "busy"}})]
    assert len(after) == 3
    assert not set(after) & set(before)


def test_p6_a_redis_store_of_another_generation_is_refused(open_saver: Opener) -> None:
    saver = open_saver()
    run_turns(build_agent(saver), "t", 1)
    space = saver.backend.space
    raw(saver).set(space.format_key, "0")
    with pytest.raises(CheckpointStoreFormatError, match="generation 0"):
        open_saver()
    raw(saver).delete(space.format_key)
    with pytest.raises(CheckpointStoreFormatError, match="generation none"):
        open_saver()


def test_p6_an_older_generation_redis_store_is_read_and_recorded_as_current(open_saver: Opener) -> None:
    saver = open_saver()
    run_turns(build_agent(saver), "t", 1)
    raw(saver).set(saver.backend.space.format_key, "1")
    reopened = open_saver()
    assert reopened.get_tuple({"configurable": {"thread_id": "t"}}) is not None
    assert raw(saver).get(saver.backend.space.format_key) == str(FORMAT_GENERATION).encode() == b"3"


@pytest.mark.providers("redis")
def test_p7_a_client_the_application_owns_is_used_and_left_open(provider: Any) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    with open_checkpointer("redis", settings=Settings(), client=client, key_prefix="tkp7") as saver:
        run_turns(build_agent(saver), "own-client", 1)
        assert saver.backend.engine._client is None
    assert client.ping()
    for key in client.scan_iter(match="tkp7:*"):
        client.delete(key)
    client.close()


def test_key_prefixes_keep_stores_apart(open_saver: Opener) -> None:
    first = open_saver()
    second = open_saver(key_prefix=first.backend.space.prefix + "x")
    run_turns(build_agent(first), "same-id", 1)
    assert second.get_tuple({"configurable": {"thread_id": "same-id"}}) is None


async def test_more_concurrent_calls_than_the_client_has_connections_wait_for_one(
    open_saver: Opener, provider: Any
) -> None:
    """An event loop's client opens at most 100 connections (on a cluster, to each node);
    calls past them wait for one instead of failing with "Too many connections" (redis-py's
    own pool, and its cluster client, refuse them)."""
    import asyncio

    from threadkeep.backends.redis import engine

    saver = open_saver(settings=Settings(retry_attempts=1))  # a refused call would fail
    config = {"configurable": {"thread_id": "busy"}}
    await build_agent(saver).ainvoke(turn_input(0), config)
    reads = await asyncio.gather(*(saver.aget_tuple(config) for _ in range(3 * engine._ASYNC_CONNECTIONS)))
    assert all(len(read.checkpoint["channel_values"]["messages"]) == MESSAGES_PER_TURN for read in reads)


def _fill_keyspace(saver: Any, keys: int = 3000) -> None:
    """Keys that match no pattern of the store, so a scan of it takes several SCAN pages
    (each looks at about 1,000 keys); they expire on their own."""
    pipe = raw(saver).pipeline(transaction=False)
    for i in range(keys):
        pipe.set(f"{{tkfill}}:{i}", b"", ex=60)
    pipe.execute()


def test_a_scan_asks_for_no_page_once_the_store_is_closed(open_saver: Opener, monkeypatch: Any) -> None:
    """``list(None)`` scans the keyspace a SCAN page at a time. Once ``close()`` lands
    between two pages, no further page is asked for: the closed client would connect again."""
    saver = open_saver()
    run_turns(build_agent(saver), "scanned", 1)
    _fill_keyspace(saver)
    client, engine, after_close = raw(saver), saver.backend.engine, []
    scan = client.scan

    def closing_scan(*args: Any, **kwargs: Any) -> Any:
        if engine._closed:
            after_close.append(kwargs)
        reply = scan(*args, **kwargs)
        saver.close()  # lands between this page and the next
        return reply

    monkeypatch.setattr(client, "scan", closing_scan)
    with pytest.raises(StorageError, match="closed"):
        list(saver.list(None))
    assert after_close == []


async def test_an_async_scan_asks_for_no_page_once_the_store_is_closed(
    open_saver: Opener, monkeypatch: Any
) -> None:
    saver = open_saver()
    await build_agent(saver).ainvoke(turn_input(0), {"configurable": {"thread_id": "scanned"}})
    _fill_keyspace(saver)
    client, engine, after_close = saver.backend.engine._async(), saver.backend.engine, []
    scan = client.scan

    async def closing_scan(*args: Any, **kwargs: Any) -> Any:
        if engine._closed:
            after_close.append(kwargs)
        reply = await scan(*args, **kwargs)
        await saver.aclose()  # lands between this page and the next
        return reply

    monkeypatch.setattr(client, "scan", closing_scan)
    with pytest.raises(StorageError, match="closed"):
        [found async for found in saver.alist(None)]
    assert after_close == []


def _config(thread_id: str, user_id: str | None = None) -> Any:
    configurable = {"thread_id": thread_id} | ({"user_id": user_id} if user_id else {})
    return {"configurable": configurable}


def test_a_checkpoint_whose_values_redis_evicted_is_refused_not_read_partial(open_saver: Opener) -> None:
    """The thread's hash of channel values is removed, as an eviction removes one key of
    many: a read says what was lost, instead of a state without those channels."""
    saver = open_saver()
    run_turns(build_agent(saver), "evicted", 1)
    keys = thread_keys(saver, "evicted")
    assert raw(saver).delete(keys[4]) == 1  # KEYS[5]: the channel values
    with pytest.raises(CheckpointSerializationError, match=r"lost the values of .*messages.*noeviction"):
        saver.get_tuple(_config("evicted"))
    with pytest.raises(CheckpointSerializationError, match="lost the values of"):
        list(saver.list(_config("evicted")))


# The keys of a thread (see lua/_prelude.lua) an eviction may take alone, and what the
# thread then lost.
_LOSSES = [
    pytest.param(0, "its record", id="record"),
    pytest.param(1, "part of its checkpoints", id="checkpoint-records"),
    pytest.param(2, "part of its checkpoints", id="heads"),
    pytest.param(3, "part of its checkpoints", id="order"),
    pytest.param(5, "part of its pending writes", id="writes"),
    pytest.param(6, "part of its pending writes", id="write-index"),
]


@pytest.mark.parametrize(("key", "lost"), _LOSSES)
def test_a_thread_redis_evicted_part_of_is_refused_until_an_operator_deletes_it(
    open_saver: Opener, key: int, lost: str
) -> None:
    """One key of a thread removed, as an eviction removes one key of many: its owner's and an
    operator's reads and every write say what the thread lost (another user sees nothing,
    and no user reads a thread whose owner is lost), nothing is written (a write would build
    on what is left, or give the checkpoints left to its writer, maybe another user), and an
    operator can delete what is left."""
    from langgraph.checkpoint.base import empty_checkpoint

    from threadkeep import operator_scope, user_scope

    saver = open_saver()
    build_agent(saver).invoke(turn_input(0), _config("partial", "alice"))
    head = saver.get_tuple(_config("partial", "alice"))
    assert head is not None

    def at_head(user: str) -> Any:
        return {"configurable": {**head.config["configurable"], "user_id": user}}

    saver.put_writes(at_head("alice"), [("pending", 1)], "task")  # pending writes to lose
    keys = thread_keys(saver, "partial")
    assert raw(saver).delete(keys[key]) == 1
    left = {name: raw(saver).dump(name) for name in keys}
    with operator_scope():
        with pytest.raises(CheckpointSerializationError, match=rf"lost {re.escape(lost)}.*noeviction"):
            saver.get_tuple(_config("partial"))
        with pytest.raises(CheckpointSerializationError, match=f"lost {re.escape(lost)}"):
            list(saver.list(_config("partial")))
    if key == 0:  # whose it was is lost: no user reads it
        assert saver.get_tuple(_config("partial", "alice")) is None
    else:
        with pytest.raises(CheckpointSerializationError, match=f"lost {re.escape(lost)}"):
            saver.get_tuple(_config("partial", "alice"))
    assert saver.get_tuple(_config("partial", "mallory")) is None  # never another user's
    assert list(saver.list(_config("partial", "mallory"))) == []
    with user_scope("mallory"):  # another user's damaged thread does not break a list of all
        assert list(saver.list(None)) == []
    for user in ("alice", "mallory"):
        with pytest.raises(StorageError, match=rf"lost {re.escape(lost)}.*noeviction"):
            saver.put(_config("partial", user), empty_checkpoint(), {}, {})
        with pytest.raises(StorageError, match=f"lost {re.escape(lost)}"):
            saver.put_writes(at_head(user), [("x", 1)], "task")
    assert {name: raw(saver).dump(name) for name in keys} == left  # nothing written
    with operator_scope():
        saver.delete_thread("partial")
    assert raw(saver).exists(*keys) == 0
    build_agent(saver).invoke(turn_input(0), _config("partial", "mallory"))  # a new thread now


@pytest.mark.providers("redis")
def test_eviction_under_maxmemory_never_yields_a_partial_state(provider: Any) -> None:
    """A real Redis at its maxmemory with volatile-lru evicts keys of the threads (they all
    carry a TTL, SPEC R2). Every read afterwards is the whole state, nothing, or an error;
    never a state missing channels or messages."""
    import redis

    from tests.servers import RedisServer

    server = RedisServer("--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru").start()
    try:
        with open_checkpointer("redis", server.url, settings=Settings()) as saver:
            graph = build_agent(saver)
            threads = [f"e{i}" for i in range(12)]
            for thread_id in threads:
                run_turns(graph, thread_id, 2)
            filler = redis.Redis.from_url(server.url)
            for i in range(180):  # past maxmemory: some of the threads' keys go, not all
                filler.set(f"filler:{i}", b"x" * 16_384, ex=3600)
            assert int(filler.info("stats")["evicted_keys"]) > 0
            outcomes = {"whole": 0, "none": 0, "refused": 0}
            for thread_id in threads:
                try:
                    state = saver.get_tuple(_config(thread_id))
                except ThreadkeepError:
                    outcomes["refused"] += 1
                    continue
                if state is None:
                    outcomes["none"] += 1
                    continue
                assert len(state.checkpoint["channel_values"]["messages"]) == 2 * MESSAGES_PER_TURN
                outcomes["whole"] += 1
            assert outcomes["whole"] < len(threads), outcomes  # the eviction reached the threads
            filler.close()
    finally:
        server.close()


@pytest.mark.providers("redis")
def test_a_connection_dropped_without_a_word_is_given_up_and_the_call_retried(provider: Any) -> None:
    """A load balancer or NAT that drops a connection silently leaves it open and mute. A
    command on it waits for its reply no longer than COMMAND_TIMEOUT_SECONDS; the call then
    goes on a new connection, instead of waiting for the kernel's TCP timeout (minutes)."""
    import threading
    import uuid

    import redis

    from tests.servers import TcpProxy

    port = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy(port).accept()
    prefix = f"tkmute{uuid.uuid4().hex[:8]}"
    settings = Settings(command_timeout_seconds=1, retry_backoff_seconds=0.1)
    try:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        with open_checkpointer("redis", url, settings=settings, key_prefix=prefix) as saver:
            graph = build_agent(saver)
            run_turns(graph, "mute", 1)
            proxy.stall()
            finished = threading.Event()

            def next_turn() -> None:
                run_turns(graph, "mute", 1, first=1)
                finished.set()

            threading.Thread(target=next_turn, daemon=True).start()
            assert finished.wait(60), "a mute connection held the call"
            state = saver.get_tuple(_config("mute"))
            assert state is not None
            assert len(state.checkpoint["channel_values"]["messages"]) == 2 * MESSAGES_PER_TURN
    finally:
        proxy.close()
        cleaner = redis.Redis.from_url(REDIS_URL)
        for key in cleaner.scan_iter(match=f"{prefix}:*"):
            cleaner.delete(key)
        cleaner.close()


@pytest.mark.providers("redis")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_step_whose_reply_never_came_is_not_said_to_be_unstored(provider: Any, api: str) -> None:
    """A put's script runs on the server, and its reply is lost on the way, at every try:
    the call fails with StorageError, and since the step was in fact stored, the error must
    not say that nothing of it was; a read that fails the same way says nothing of steps."""
    import asyncio
    import uuid

    from tests.providers import track_redis_prefix
    from tests.servers import TcpProxy
    from threadkeep import StorageError

    port = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy(port).accept()
    prefix = track_redis_prefix(f"tklost{uuid.uuid4().hex[:8]}")  # dropped at session end
    settings = Settings(command_timeout_seconds=1, retry_backoff_seconds=0.05, retry_attempts=2)
    metadata: Any = {"source": "input", "step": -1}
    checkpoint = _checkpoint()
    try:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        with open_checkpointer("redis", url, settings=settings, key_prefix=prefix) as saver:
            # Scripts go as EVALSHA, loaded on NOSCRIPT, on connections that said hello: the
            # server must know put's script, and the client hold a connection, first.
            saver.put(_config("warm"), _checkpoint(), metadata, {})

            async def put_then_read() -> Any:
                await saver.aput(_config("warm"), _checkpoint(), metadata, {})  # this loop's client
                proxy.mute_replies()
                with pytest.raises(StorageError, match="may have run it or still run it") as put:
                    await saver.aput(_config("lost"), checkpoint, metadata, {})
                with pytest.raises(StorageError, match="unreachable after 2 attempts") as read:
                    await saver.aget_tuple(_config("lost"))
                return put, read

            if api == "async":
                put, read = asyncio.run(put_then_read())
            else:
                proxy.mute_replies()
                with pytest.raises(StorageError, match="may have run it or still run it") as put:
                    saver.put(_config("lost"), checkpoint, metadata, {})
                with pytest.raises(StorageError, match="unreachable after 2 attempts") as read:
                    saver.get_tuple(_config("lost"))
            assert "nothing of this step was stored" not in str(put.value)
            assert "this step" not in str(read.value)
            assert "may have run" not in str(read.value)
        with open_checkpointer("redis", REDIS_URL, settings=Settings(), key_prefix=prefix) as direct:
            stored = direct.get_tuple(_config("lost"))
            assert stored is not None  # the script did run
            assert stored.checkpoint["id"] == checkpoint["id"]
    finally:
        proxy.close()


def _long_history(saver: Any, thread_id: str, count: int) -> list[Any]:
    """A checkpoint whose message list holds ``count`` messages, put in one step."""
    from langchain_core.messages import AIMessage, HumanMessage

    messages: list[Any] = [
        HumanMessage(f"q{i}", id=f"h{i}") if i % 2 else AIMessage(f"a{i}", id=f"a{i}") for i in range(count)
    ]
    checkpoint = _checkpoint()
    checkpoint["channel_values"] = {"messages": messages}
    checkpoint["channel_versions"] = {"messages": saver.get_next_version(None, None)}
    saver.put(_config(thread_id), checkpoint, {"source": "input", "step": -1}, checkpoint["channel_versions"])
    return messages


def test_a_list_longer_than_one_hmget_reads_back_whole_in_order(open_saver: Opener) -> None:
    """load.lua walks the links, then fetches the messages in HMGETs of at most 1,000."""
    messages = _long_history(open_saver(), "long", 2_345)
    fresh = open_saver().get_tuple(_config("long"))  # holds no list: every message is sent
    assert fresh.checkpoint["channel_values"]["messages"] == messages


def _nodes(saver: Any, messages: list[Any]) -> tuple[bytes, ...]:
    """The link nodes of ``messages`` as a list, by position (0 is the oldest)."""
    from threadkeep.core.messages import MessageChain

    return MessageChain("messages", "1", messages, saver.serde).nodes


def test_a_list_missing_a_link_is_refused_not_read_short(open_saver: Opener) -> None:
    saver = open_saver()
    messages = _long_history(saver, "broken", 40)
    client, keys = raw(saver), thread_keys(saver, "broken")
    assert client.hdel(keys[8], _nodes(saver, messages)[35]) == 1  # KEYS[9]: the links
    with pytest.raises(CheckpointSerializationError, match="message history is incomplete"):
        open_saver().get_tuple(_config("broken"))


def test_a_list_is_read_a_page_at_a_time_where_its_links_have_pages(open_saver: Opener) -> None:
    """The link closing every 32nd message carries a page of the 32 digests before it: a
    reader steps over the page. A list stored without pages (before they were written) is
    read a link at a time."""
    saver = open_saver()
    client = raw(saver)
    paged = _long_history(saver, "paged", 70)
    nodes, links = _nodes(saver, paged), thread_keys(saver, "paged")[8]
    assert client.hdel(links, *nodes[:64]) == 64  # only the pages lead past them now
    assert open_saver().get_tuple(_config("paged")).checkpoint["channel_values"]["messages"] == paged
    unpaged = _long_history(saver, "unpaged", 70)
    links = thread_keys(saver, "unpaged")[8]
    assert client.hdel(links, *[node + b"p" for node in _nodes(saver, unpaged)]) == 2
    assert open_saver().get_tuple(_config("unpaged")).checkpoint["channel_values"]["messages"] == unpaged


def test_a_list_whose_page_names_its_messages_out_of_order_is_refused(open_saver: Opener) -> None:
    """A page is read instead of the links it covers: one that names the right messages in
    the wrong order (a store damaged by hand, a bug) must not be read as the list. The
    reader checks that the digests lead to the list's tail."""
    saver = open_saver()
    messages = _long_history(saver, "misordered", 40)
    client, links = raw(saver), thread_keys(saver, "misordered")[8]
    field = _nodes(saver, messages)[31] + b"p"
    page = client.hget(links, field)
    swapped = page[16:32] + page[:16] + page[32:]  # the first two messages swapped
    client.hset(links, field, swapped)
    with pytest.raises(CheckpointSerializationError, match="links do not lead to the list's tail"):
        open_saver().get_tuple(_config("misordered"))


def test_w4_only_a_lost_reply_counts_as_a_script_that_may_have_run() -> None:
    """What the final error says of a step follows redis-py's errors: a reply lost to a
    timeout or a closed connection may hide a script that ran; a connection that never
    opened, none free to take, or a server still loading ran nothing."""
    from redis.exceptions import BusyLoadingError, MaxConnectionsError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from threadkeep.backends.redis.engine import _may_have_run

    assert _may_have_run(RedisTimeoutError("Timeout reading from socket"))
    assert _may_have_run(RedisConnectionError("Connection closed by server."))
    assert _may_have_run(RedisConnectionError("Error while reading from socket: (104, 'reset')"))
    assert not _may_have_run(RedisTimeoutError("Timeout connecting to server"))
    assert not _may_have_run(RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."))
    assert not _may_have_run(MaxConnectionsError("No connection available."))
    assert not _may_have_run(BusyLoadingError("Redis is loading the dataset in memory"))
    assert not _may_have_run(ValueError("not a connection error"))


def _connections_accepted(node: Any) -> int:
    """How many connections a Redis server (a tests.servers.RedisServer) has accepted, this
    question's own included: the ones its kernel queued before it are accepted first."""
    stats = dict(line.split(":", 1) for line in node.cli("info", "stats").splitlines() if ":" in line)
    return int(stats["total_connections_received"])


@pytest.mark.providers("redis-cluster")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_stalled_cluster_node_costs_the_settings_tries_only(provider: Any, api: str) -> None:
    """A cluster node that stops answering (SIGSTOP: its connections stay open, mute) fails
    a call after threadkeep's own tries, each bounded by COMMAND_TIMEOUT_SECONDS: redis-py's
    cluster client does not try each of them again itself. Counted by the connections the
    node accepts once resumed (the kernel queued every one the client made meanwhile): at
    most two per try, its command's and one for a layout read before it (a new client's
    first, or the async client's after a failed try, either of which may ask that node),
    where redis-py's own tries made 21 to 23 (and took 22 s)."""
    import asyncio
    import os
    import signal
    from functools import partial

    from tests.servers import RedisCluster

    # Failover would start after the node timeout: far longer than the test.
    cluster = RedisCluster(node_timeout_ms=60_000).start()
    settings = Settings(command_timeout_seconds=1, retry_attempts=2, retry_backoff_seconds=0)
    stopped = None
    try:
        with open_checkpointer("redis", cluster.url, settings=settings, key_prefix="tkstall") as saver:
            saver.put(_config("stall"), _checkpoint(), {"source": "input", "step": -1}, {})
            client = raw(saver)
            port = client.get_node_from_key(thread_keys(saver, "stall")[0]).port
            node = next(node for node in cluster.nodes if node.port == port)
            stopped = node.process
            assert stopped is not None
            accepted = _connections_accepted(node)
            os.kill(stopped.pid, signal.SIGSTOP)
            read = partial(saver.get_tuple, _config("stall"))
            if api == "async":
                read = partial(asyncio.run, saver.aget_tuple(_config("stall")))
            with pytest.raises(StorageError, match="unreachable after 2 attempts"):
                read()
            os.kill(stopped.pid, signal.SIGCONT)
            stopped = None
            # the second count's own connection is one of them
            assert 0 < _connections_accepted(node) - accepted - 1 <= 2 * 2
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        cluster.close()


def _replicated(primary: Any) -> bool:
    """Whether every replica of ``primary`` (a cluster node) has all it wrote."""
    info = dict(line.split(":", 1) for line in primary.cli("info", "replication").splitlines() if ":" in line)
    replicas = [value for key, value in info.items() if re.fullmatch(r"slave\d+", key)]
    offset = info.get("master_repl_offset")
    return bool(replicas) and all(f"offset={offset}," in replica for replica in replicas)


@pytest.mark.slow
@pytest.mark.providers("redis-cluster")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_turn_outlasts_its_primarys_failover(provider: Any, api: str) -> None:
    """The primary holding a thread, the very node the store's URL names, is killed between
    two turns of a run; a replica takes its place after the node timeout (5 s) and an
    election. The next turn's calls are retried as the settings say (tries 4 s, then 8 s,
    after the first, within a step deadline of 30 s), and the run ends with every
    checkpoint and message of both turns.

    The try 4 s in comes before the failover: a sync retry must read the layout again
    before the try 12 s in (redis-py's sync client last read it when the 4 s try failed).
    On the async API each turn runs on an event loop of its own, whose client must start
    from the nodes the first loop's client found: the URL's node is the one down."""
    import asyncio
    import itertools

    import redis

    from tests.servers import RedisCluster

    cluster = RedisCluster(replicas=1, node_timeout_ms=5000).start()
    settings = Settings(retry_attempts=3, retry_backoff_seconds=4, step_deadline_seconds=30)
    try:
        with open_checkpointer("redis", cluster.url, settings=settings, key_prefix="tkfailover") as saver:
            # a thread whose slot the URL's node serves
            layout = redis.cluster.RedisCluster.from_url(cluster.url)
            url_port = cluster.nodes[0].port
            thread = next(
                name
                for name in (f"failover-{n}" for n in itertools.count())
                if layout.get_node_from_key(thread_keys(saver, name)[0]).port == url_port
            )
            layout.close()
            graph = build_agent(saver)

            def turn(number: int) -> None:
                if api == "sync":
                    run_turns(graph, thread, 1, first=number)
                else:
                    asyncio.run(graph.ainvoke(turn_input(number), _config(thread)))

            turn(0)
            deadline = time.monotonic() + 30
            while not _replicated(cluster.nodes[0]):  # what the primary acknowledged is on its replica
                assert time.monotonic() < deadline, "the replica never caught up"
                time.sleep(0.05)
            cluster.nodes[0].stop()
            turn(1)
            state = saver.get_tuple(_config(thread))
            assert state is not None
            assert len(state.checkpoint["channel_values"]["messages"]) == 2 * MESSAGES_PER_TURN
            assert len(list(saver.list(_config(thread)))) == 2 * (MESSAGES_PER_TURN + 1)
    finally:
        cluster.close()


def _reads(client: Any) -> int:
    """How many times the server has read from its clients' sockets (INFO stats); the INFO
    command that asks is one of them."""
    return int(client.info("stats")["total_reads_processed"])


@pytest.mark.providers("redis")
def test_sv1_a_page_reads_its_rows_in_one_round_trip_and_a_put_lists_its_thread_in_its_own(
    provider: Any,
) -> None:
    """On a server of its own, whose socket reads are the saver's only: a page of 50 threads
    costs a handful of reads (the index's page, then every row's thread together), not one
    per row; and a put writes the listing's index in the round trip of its script, fewer
    than two reads a put."""
    import redis

    from tests.servers import RedisServer
    from threadkeep import operator_scope
    from threadkeep.threads import ThreadQuery

    server = RedisServer().start()
    try:
        observer = redis.Redis.from_url(server.url)
        with open_checkpointer("redis", server.url, settings=Settings()) as saver:
            metadata: Any = {"source": "input", "step": -1}
            saver.put(_config("warm"), _checkpoint(), metadata, {})  # scripts loaded, connection open
            puts = 60
            before = _reads(observer)
            for n in range(puts):
                saver.put(_config(f"listed-{n:02}"), _checkpoint(), metadata, {})
            put_reads = _reads(observer) - before - 1
            assert puts <= put_reads < 2 * puts, put_reads

            with operator_scope():
                saver.threads(ThreadQuery(limit=50))  # warm
                calls_before = observer.info("commandstats")["cmdstat_evalsha"]["calls"]
                before = _reads(observer)
                page = saver.threads(ThreadQuery(limit=50))
                page_reads = _reads(observer) - before - 1
                calls = observer.info("commandstats")["cmdstat_evalsha"]["calls"] - calls_before
            assert len(page.threads) == 50
            assert page.threads[0].thread_id == f"listed-{puts - 1:02}"
            assert calls == 52  # the index's page and the 51 rows it read (one tells a next page)
            assert page_reads <= 10, page_reads  # was 52: a round trip per row
        observer.close()
    finally:
        server.close()


def test_sv1_a_refused_put_leaves_the_listing_index_as_it_was(open_saver: Opener) -> None:
    """A put lists its thread in the round trip of its script, before the script's answer
    is known: one refused (another user's thread, a head moved meanwhile) gives the indexes
    back what they held, so the thread keeps its place and the refused writer's index does
    not list it."""
    from threadkeep import StaleStateError, StorageForbiddenError

    saver = open_saver()
    space = saver.backend.space
    metadata: Any = {"source": "input", "step": -1}
    stored = saver.put(_config("kept", "alice"), _checkpoint(), metadata, {})
    first = {"configurable": {**stored["configurable"], "user_id": "alice"}}
    saver.put(first, _checkpoint(), metadata, {})  # the head moves past `first`
    client = raw(saver)
    placed = client.zscore(space.listing_key, "kept")
    assert client.zscore(space.owner_listing_key("alice"), "kept") == placed
    time.sleep(0.01)  # a later write time than the one the index holds
    with pytest.raises(StorageForbiddenError):
        saver.put(_config("kept", "mallory"), _checkpoint(), metadata, {})
    with pytest.raises(StaleStateError):
        saver.put(first, _checkpoint(), metadata, {})  # from a parent that is no longer the head
    assert client.zscore(space.listing_key, "kept") == placed
    assert client.zscore(space.owner_listing_key("alice"), "kept") == placed
    assert client.zscore(space.owner_listing_key("mallory"), "kept") is None


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _indexed(saver: Any, *owners: str) -> dict[str, set[str]]:
    """What the listing's indexes hold: every thread's ("*"), and each of ``owners``'."""
    client, space = raw(saver), saver.backend.space
    keys = {"*": space.listing_key} | {owner: space.owner_listing_key(owner) for owner in owners}
    return {name: {member.decode() for member in client.zrange(key, 0, -1)} for name, key in keys.items()}


def test_r2_the_listing_index_lives_no_longer_than_its_threads(open_saver: Opener) -> None:
    """The index keys carry the waiting horizon as their TTL, re-armed by each write, and a
    write drops the entries written longer ago than that horizon: an index whose threads all
    expired expires too, and one still written to holds no entry older than its threads."""
    clock = _Clock(time.time())
    saver = open_saver(clock=clock)
    horizon = saver.backend.ttl_ms
    client, space = raw(saver), saver.backend.space
    metadata: Any = {"source": "input", "step": -1}
    saver.put(_config("old", "alice"), _checkpoint(), metadata, {})
    for key in (space.listing_key, space.owner_listing_key("alice")):
        assert 0 < client.pttl(key) <= horizon
        client.pexpire(key, 1_000)  # as if most of the horizon had passed
    clock.now += horizon / 1000 + 1  # "old" expired on its TTL meanwhile
    client.delete(*thread_keys(saver, "old"))
    saver.put(_config("new", "alice"), _checkpoint(), metadata, {})
    for key in (space.listing_key, space.owner_listing_key("alice")):
        assert client.pttl(key) > horizon - 60_000  # re-armed
    assert _indexed(saver, "alice") == {"*": {"new"}, "alice": {"new"}}


def test_sv1_threads_gone_leave_both_indexes(open_saver: Opener) -> None:
    """A thread whose keys are gone leaves every thread's index and its owner's: an
    operator's listing drops it from every thread's, its owner's listing from both, an
    operator's delete from both."""
    from threadkeep import operator_scope, user_scope
    from threadkeep.threads import ThreadQuery

    saver = open_saver()
    metadata: Any = {"source": "input", "step": -1}
    for thread_id in ("kept", "expired", "deleted"):
        saver.put(_config(thread_id, "alice"), _checkpoint(), metadata, {})
    raw(saver).delete(*thread_keys(saver, "expired"))  # as its TTL does
    with operator_scope():
        saver.delete_thread("deleted")
        assert _indexed(saver, "alice") == {"*": {"kept", "expired"}, "alice": {"kept", "expired"}}
        assert [thread.thread_id for thread in saver.threads(ThreadQuery()).threads] == ["kept"]
    assert _indexed(saver, "alice")["*"] == {"kept"}
    with user_scope("alice"):
        assert [thread.thread_id for thread in saver.threads(ThreadQuery()).threads] == ["kept"]
    assert _indexed(saver, "alice") == {"*": {"kept"}, "alice": {"kept"}}


def test_sv1_a_page_over_threads_gone_reads_a_bounded_number_of_them(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries of threads gone, newer than every live thread: a page reads at most
    SCAN_BOUND of them and ends short, with a cursor that goes on; the pages after it find
    the live threads, and the index is left without the entries read."""
    from threadkeep import operator_scope
    from threadkeep.core.listing import SCAN_BOUND
    from threadkeep.threads import ThreadQuery

    saver = open_saver()
    metadata: Any = {"source": "input", "step": -1}
    for thread_id in ("first", "second"):
        saver.put(_config(thread_id, "alice"), _checkpoint(), metadata, {})
    client, space = raw(saver), saver.backend.space
    newest = time.time() + 100
    gone = 2 * SCAN_BOUND + 500
    client.zadd(space.listing_key, {f"gone-{n:05}": newest + n for n in range(gone)})

    engine = saver.backend.engine
    original = engine._execute
    summaries: list[int] = []

    def execute(client: Any, request: Any) -> Any:
        sent = getattr(request, "requests", (request,))
        summaries.append(sum(getattr(one, "name", None) == "summary" for one in sent))
        return original(client, request)

    monkeypatch.setattr(engine, "_execute", execute)
    pages = []
    with operator_scope():
        query = ThreadQuery(limit=10)
        while True:
            summaries.clear()
            page = saver.threads(query)
            assert sum(summaries) <= SCAN_BOUND + 1
            pages.append([thread.thread_id for thread in page.threads])
            if page.next_cursor is None:
                break
            query = ThreadQuery(limit=10, cursor=page.next_cursor)
    assert pages == [[], [], ["second", "first"]]
    assert _indexed(saver)["*"] == {"first", "second"}


def test_sv1_a_thread_handed_to_another_owner_stays_listed(open_saver: Opener) -> None:
    """assign_owner moves the thread from its owner's index to the new owner's; an entry
    the old owner's index still holds (as an index written before this held) leaves that
    index only when the old owner lists: the operator and the new owner still see it."""
    from threadkeep import operator_scope, user_scope
    from threadkeep.threads import ThreadQuery

    saver = open_saver()
    metadata: Any = {"source": "input", "step": -1}
    saver.put(_config("handed", "alice"), _checkpoint(), metadata, {})
    saver.put(_config("stale", "alice"), _checkpoint(), metadata, {})
    with operator_scope():
        before = saver.assign_owner(["handed", "stale"], "bob", force=True)
    assert before == {"handed": "alice", "stale": "alice"}
    assert _indexed(saver, "alice", "bob") == {
        "*": {"handed", "stale"},
        "alice": set(),
        "bob": {"handed", "stale"},
    }
    client, space = raw(saver), saver.backend.space
    client.zadd(space.owner_listing_key("alice"), {"stale": time.time()})  # left behind
    with user_scope("alice"):
        assert saver.threads(ThreadQuery()).threads == []
    assert _indexed(saver, "alice", "bob") == {
        "*": {"handed", "stale"},
        "alice": set(),
        "bob": {"handed", "stale"},
    }
    with operator_scope():
        assert {thread.thread_id for thread in saver.threads(ThreadQuery()).threads} == {"handed", "stale"}
    with user_scope("bob"):
        assert {thread.thread_id for thread in saver.threads(ThreadQuery()).threads} == {"handed", "stale"}

"""Turns (SPEC TM1-TM4): rollback and retry, purge, isolation and resume, on every provider,
through the sync and the async API, with LangGraph's ToolNode, ``@tool`` functions and a
scripted ``BaseChatModel``."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from tests.providers import (
    REDIS_URL,
    Opener,
    ProviderCase,
    postgres_schema,
    track_redis_prefix,
)
from tests.turn_agents import ScriptedChatModel, agent_graph, answer, call, calls
from threadkeep import (
    NoResumableTurnError,
    Settings,
    ToolCallError,
    TurnFailedError,
    TurnManager,
    user_scope,
)

APIS = ["sync", "async"]


class Flaky:
    """A tool's behaviour: fail the first ``failures`` calls, then succeed; counts its runs."""

    def __init__(self, failures: int, error: str = "card declined") -> None:
        self.failures = failures
        self.error = error
        self.runs: list[dict[str, Any]] = []

    def __call__(self, **args: Any) -> str:
        self.runs.append(args)
        if len(self.runs) <= self.failures:
            raise ValueError(self.error)
        return f"charged {args['amount']}"


def charge_tool(behaviour: Flaky) -> Any:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card ``amount`` cents."""
        return behaviour(amount=amount)

    return charge


@tool
def lookup(query: str) -> str:
    """Look ``query`` up."""
    return f"found {query}"


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(resume_state_path=str(tmp_path / "resumable.json"), **values)


def run(manager: TurnManager, api: str, user: str, message: Any, **options: Any) -> Any:
    if api == "sync":
        return manager.run_turn(user, message, **options)
    return asyncio.run(manager.arun_turn(user, message))


def resume(manager: TurnManager, api: str, user: str) -> Any:
    if api == "sync":
        return manager.resume_last_turn(user)
    return asyncio.run(manager.aresume_last_turn(user))


def checkpoints(saver: Any, thread_id: str, user: str) -> int:
    with user_scope(user):
        return len(list(saver.list({"configurable": {"thread_id": thread_id}})))


def call_ids(messages: list[Any]) -> set[str]:
    return {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}


# TM2: rollback and retry -----------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_tm2_a_raising_tool_rolls_back_tells_the_model_and_retries(
    open_saver: Opener, tmp_path: Path, api: str
) -> None:
    card = Flaky(failures=1)
    model = ScriptedChatModel(
        script=[
            calls(call("charge", "first", amount=500)),
            calls(call("charge", "second", amount=400)),
            answer("charged 400 after the first try failed"),
        ]
    )
    saver = open_saver()
    manager = TurnManager(agent_graph(model, [charge_tool(card)]), saver, settings=settings(tmp_path))

    result = run(manager, api, "alice", "pay my bill")

    assert result.response == "charged 400 after the first try failed"
    assert result.attempts == 2
    assert [failure.calls[0]["id"] for failure in result.failures] == ["first"]
    assert isinstance(result.failures[0].error, ValueError)
    # the model's second decision was made without the failed call, and told what failed
    retry_prompt = model.prompts[1]
    assert "first" not in call_ids(retry_prompt)
    note = retry_prompt[-1]
    assert isinstance(note, HumanMessage)
    assert "charge(amount=500)" in note.text
    assert "card declined" in note.text
    assert [type(m).__name__ for m in result.messages] == [
        "HumanMessage",
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert card.runs == [{"amount": 500}, {"amount": 400}]


@pytest.mark.parametrize("api", APIS)
def test_tm2_an_error_result_in_parallel_calls_rolls_back_the_whole_message(
    open_saver: Opener, tmp_path: Path, api: str
) -> None:
    """ToolNode turning errors into results (handle_tool_errors=True): the error result and
    the call are rolled back together with the parallel call that succeeded, and the model
    is told that one succeeded and what it returned."""
    card = Flaky(failures=1)
    model = ScriptedChatModel(
        script=[
            calls(call("lookup", "look", query="plan"), call("charge", "pay", amount=500)),
            calls(call("charge", "pay-again", amount=500)),
            answer("done"),
        ]
    )
    graph = agent_graph(model, [lookup, charge_tool(card)], handle_tool_errors=True)
    manager = TurnManager(graph, open_saver(), settings=settings(tmp_path))

    result = run(manager, api, "alice", "pay")

    assert result.response == "done"
    (failure,) = result.failures
    assert [c["id"] for c in failure.calls] == ["pay"]
    assert isinstance(failure.error, ToolCallError)
    assert failure.error.code == "TOOL_RESULT_001"
    note = model.prompts[1][-1].text
    assert "charge(amount=500)" in note
    assert "card declined" in note
    assert 'lookup(query="plan") succeeded and returned: found plan' in note
    assert not {"look", "pay"} & call_ids(result.messages)
    assert not [m for m in result.messages if isinstance(m, ToolMessage) and m.status == "error"]


@pytest.mark.parametrize("api", APIS)
def test_tm2_after_max_retries_the_caller_gets_turn_failed_with_the_cause(
    open_saver: Opener, tmp_path: Path, api: str
) -> None:
    card = Flaky(failures=10)
    model = ScriptedChatModel(script=[calls(call("charge", amount=500))])
    saver = open_saver()
    manager = TurnManager(agent_graph(model, [charge_tool(card)]), saver, settings=settings(tmp_path))

    with pytest.raises(TurnFailedError) as raised:
        run(manager, api, "alice", "pay")

    error = raised.value
    assert error.code == "TURN_001"
    assert isinstance(error.__cause__, ValueError)
    assert "card declined" in str(error.__cause__)
    assert len(error.failures) == 3  # the first try and max_retries=2 retries
    assert all(isinstance(f.error, ValueError) for f in error.failures)
    assert len(card.runs) == 3
    assert error.context["resumable"] is False
    assert checkpoints(saver, error.context["thread_id"], "alice") == 0  # resume off: purged
    assert not (tmp_path / "resumable.json").exists()  # resume off: the file is not written


@pytest.mark.parametrize("api", APIS)
def test_tm2_with_no_rollback_point_the_turn_restarts_on_its_thread(
    open_saver: Opener, tmp_path: Path, api: str
) -> None:
    card = Flaky(failures=1)
    model = ScriptedChatModel(
        script=[
            calls(call("charge", "first", amount=5)),
            calls(call("charge", "second", amount=6)),
            answer("ok"),
        ]
    )
    manager = TurnManager(
        agent_graph(model, [charge_tool(card)]), open_saver(), rollback_steps=10, settings=settings(tmp_path)
    )

    result = run(manager, api, "alice", "pay")

    assert result.response == "ok"
    assert result.attempts == 2
    first, note = result.messages[:2]
    assert first.text == "pay"
    assert "charge(amount=5)" in note.text
    assert "first" not in call_ids(result.messages)


@pytest.mark.parametrize("api", APIS)
def test_tm2_plain_tool_functions_in_a_node_of_ones_own(open_saver: Opener, tmp_path: Path, api: str) -> None:
    """No ToolNode: a node calls ``@tool`` functions itself; a raising one rolls back alike."""
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    card = Flaky(failures=1)
    tools = {"charge": charge_tool(card), "lookup": lookup}
    model = ScriptedChatModel(
        script=[
            calls(call("lookup", "look", query="x"), call("charge", "pay", amount=5)),
            calls(call("charge", "pay-2", amount=5)),
            answer("ok"),
        ]
    )

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def run_tools(state: MessagesState) -> dict[str, Any]:
        return {"messages": [tools[c["name"]].invoke(c) for c in state["messages"][-1].tool_calls]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", run_tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    manager = TurnManager(builder, open_saver(), settings=settings(tmp_path))

    result = run(manager, api, "alice", "pay")

    assert result.response == "ok"
    assert [c["id"] for c in result.failures[0].calls] == ["look", "pay"]
    assert 'One of the tool calls lookup(query="x"), charge(amount=5) failed' in model.prompts[1][-1].text
    assert call_ids(result.messages) == {"pay-2"}


def test_tm2_a_failure_in_a_later_round_trip_keeps_the_earlier_ones(
    open_saver: Opener, tmp_path: Path
) -> None:
    card = Flaky(failures=1)
    model = ScriptedChatModel(
        script=[
            calls(call("lookup", "look", query="bill")),
            calls(call("charge", "pay", amount=5)),
            calls(call("charge", "pay-2", amount=5)),
            answer("ok"),
        ]
    )
    manager = TurnManager(
        agent_graph(model, [lookup, charge_tool(card)]), open_saver(), settings=settings(tmp_path)
    )

    result = manager.run_turn("alice", "pay")

    assert call_ids(result.messages) == {"look", "pay-2"}
    assert len(model.prompts) == 4  # the lookup's decision was not made again


def test_tm4_a_turn_past_its_timeout_fails_and_is_kept(open_saver: Opener, tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[calls(call("lookup", query="x")), answer("done")])
    manager = TurnManager(
        agent_graph(model, [lookup]), open_saver(), settings=settings(tmp_path, resume_enabled=True)
    )

    with pytest.raises(TurnFailedError, match="timed out") as raised:
        manager.run_turn("alice", "hi", timeout=0)  # past it after the first step

    assert isinstance(raised.value.__cause__, TimeoutError)
    assert manager.has_resumable_turn("alice")
    assert manager.resume_last_turn("alice").response == "done"


def test_tm4_an_async_turn_cancelled_by_asyncio_timeout_is_kept(open_saver: Opener, tmp_path: Path) -> None:
    model = ScriptedChatModel(script=[calls(call("lookup", query="x")), answer("done")])
    manager = TurnManager(
        agent_graph(model, [lookup]), open_saver(), settings=settings(tmp_path, resume_enabled=True)
    )

    async def bounded() -> None:
        async with asyncio.timeout(0):
            await manager.arun_turn("alice", "hi")

    with pytest.raises(TimeoutError):
        asyncio.run(bounded())
    entry = json.loads((tmp_path / "resumable.json").read_text())["turns"]["alice"]
    assert entry["status"] == "failed"
    assert entry["error"] == "cancelled"
    assert asyncio.run(manager.aresume_last_turn("alice")).response == "done"


# TM1, TM3: threads, purge, isolation -------------------------------------------------------


def test_tm3_a_completed_turn_is_purged_by_default(open_saver: Opener, tmp_path: Path) -> None:
    saver = open_saver()
    model = ScriptedChatModel(script=[calls(call("lookup", query="x")), answer("done")])
    manager = TurnManager(agent_graph(model, [lookup]), saver, settings=settings(tmp_path))

    result = manager.run_turn("alice", "hi")

    assert result.response == "done"
    assert not result.kept
    assert checkpoints(saver, result.thread_id, "alice") == 0


def test_tm3_keep_history_keeps_a_completed_turn_marked_finished(open_saver: Opener, tmp_path: Path) -> None:
    saver = open_saver()
    model = ScriptedChatModel(script=[calls(call("lookup", query="x")), answer("done")])
    manager = TurnManager(agent_graph(model, [lookup]), saver, keep_history=True, settings=settings(tmp_path))

    result = manager.run_turn("alice", "hi")

    assert result.kept
    assert checkpoints(saver, result.thread_id, "alice") >= 4  # one per step, and the input
    with user_scope("alice"):
        found = saver.thread_retention(result.thread_id)
    assert found is not None
    assert found[1] is not None


def test_tm1_each_turn_has_a_fresh_thread_of_its_user(open_saver: Opener, tmp_path: Path) -> None:
    saver = open_saver()
    model = ScriptedChatModel(script=[answer("hello")])
    manager = TurnManager(agent_graph(model, [lookup]), saver, keep_history=True, settings=settings(tmp_path))

    first = manager.run_turn("alice", "one")
    second = manager.run_turn("alice", "two")
    other = manager.run_turn("bob", "three")

    assert len({first.thread_id, second.thread_id, other.thread_id}) == 3
    assert [m.text for m in second.messages] == ["two", "hello"]  # nothing of the first turn
    assert checkpoints(saver, first.thread_id, "bob") == 0  # bob cannot read alice's turn
    assert checkpoints(saver, other.thread_id, "alice") == 0
    assert checkpoints(saver, first.thread_id, "alice") > 0


# TM4: resume ----------------------------------------------------------------------------------


def pay_until_paid(messages: list[Any]) -> AIMessage:
    """Calls ``charge`` until a charge's result is in the conversation, then answers."""
    if isinstance(messages[-1], ToolMessage):
        return answer("paid")
    return calls(call("charge", amount=5))


def failing_then_fixed(
    tmp_path: Path, open_saver: Opener, failures: int = 3, **options: Any
) -> tuple[TurnManager, Flaky, Any]:
    card = Flaky(failures)  # 3: more than max_retries=2 allows: the turn fails, then it works
    model = ScriptedChatModel(script=[pay_until_paid])
    saver = open_saver()
    manager = TurnManager(
        agent_graph(model, [charge_tool(card)]),
        saver,
        settings=settings(tmp_path, resume_enabled=True),
        **options,
    )
    return manager, card, saver


@pytest.mark.parametrize("api", APIS)
def test_tm4_a_failed_turn_is_kept_and_resumed(open_saver: Opener, tmp_path: Path, api: str) -> None:
    manager, card, saver = failing_then_fixed(tmp_path, open_saver)
    with pytest.raises(TurnFailedError) as raised:
        run(manager, api, "alice", "pay")
    thread = raised.value.context["thread_id"]
    assert raised.value.context["resumable"] is True
    assert checkpoints(saver, thread, "alice") > 0
    assert manager.has_resumable_turn("alice")
    assert not manager.has_resumable_turn("bob")

    result = resume(manager, api, "alice")

    assert result.response == "paid"
    assert result.resumed
    assert not result.restarted
    assert result.thread_id == thread
    assert len(card.runs) == 4
    assert not manager.has_resumable_turn("alice")
    assert checkpoints(saver, thread, "alice") == 0  # completed: purged


def test_tm4_pointer_file_is_json_with_a_wall_clock_stamp_and_expires(
    open_saver: Opener, tmp_path: Path
) -> None:
    now = [1_000_000.0]
    manager, _, _ = failing_then_fixed(tmp_path, lambda: open_saver(clock=lambda: now[0]))
    with pytest.raises(TurnFailedError):
        manager.run_turn("alice", "pay")
    document = json.loads((tmp_path / "resumable.json").read_text())
    entry = document["turns"]["alice"]
    assert entry["status"] == "failed"
    assert entry["stamp"] == now[0]
    assert not list(tmp_path.glob("resumable.json.*.tmp"))  # written through a replaced temporary

    now[0] += 3599
    assert manager.has_resumable_turn("alice")
    now[0] += 2  # past the default time to live, 3600 s
    assert not manager.has_resumable_turn("alice")
    with pytest.raises(NoResumableTurnError):
        manager.resume_last_turn("alice")


def test_tm4_clear_resumable_drops_one_or_all_and_deletes_the_kept_threads(
    open_saver: Opener, tmp_path: Path
) -> None:
    manager, _, saver = failing_then_fixed(tmp_path, open_saver, failures=100)
    threads = {}
    for user in ("alice", "bob", "carol"):
        with pytest.raises(TurnFailedError) as raised:
            manager.run_turn(user, "pay")
        threads[user] = raised.value.context["thread_id"]

    assert manager.clear_resumable("alice") == ["alice"]
    assert not manager.has_resumable_turn("alice")
    assert manager.has_resumable_turn("bob")
    assert checkpoints(saver, threads["alice"], "alice") == 0
    assert sorted(manager.clear_resumable()) == ["bob", "carol"]
    assert checkpoints(saver, threads["bob"], "bob") == 0
    assert not manager.has_resumable_turn("carol")


def test_tm4_disabled_resume_ignores_the_file(open_saver: Opener, tmp_path: Path) -> None:
    manager, _, saver = failing_then_fixed(tmp_path, open_saver)
    with pytest.raises(TurnFailedError):
        manager.run_turn("alice", "pay")
    off = TurnManager(manager.graph, saver, settings=settings(tmp_path, resume_enabled=False))
    assert not off.has_resumable_turn("alice")
    with pytest.raises(NoResumableTurnError, match="resume is off"):
        off.resume_last_turn("alice")


def test_tm4_a_new_manager_resumes_from_the_file(open_saver: Opener, tmp_path: Path, provider: Any) -> None:
    """A fresh manager (as after a restart) finds the turn in the file; on memory, whose
    checkpoints do not outlive the store, the turn restarts from its message and says so."""
    manager, _card, _ = failing_then_fixed(tmp_path, open_saver)
    with pytest.raises(TurnFailedError):
        manager.run_turn("alice", "pay")
    fresh_saver = open_saver(fresh=provider.name == "memory")
    again = TurnManager(manager.graph.builder, fresh_saver, settings=settings(tmp_path, resume_enabled=True))

    assert again.has_resumable_turn("alice")
    result = again.resume_last_turn("alice")

    assert result.response == "paid"
    assert result.restarted is (provider.name == "memory")
    if result.restarted:
        assert result.messages[0].text == "pay"


def test_tm4_end_turn_without_a_turn_in_progress_is_none(open_saver: Opener, tmp_path: Path) -> None:
    manager = TurnManager(agent_graph(ScriptedChatModel(script=[answer("x")]), [lookup]), open_saver())
    assert manager.end_turn("alice", keep_for_resume=True) is None


# TM4 across a real process restart -------------------------------------------------------------


def worker_options(provider: ProviderCase, tmp_path: Path) -> dict[str, Any]:
    """How a worker process opens the same store as the test (``tests.turn_workers``)."""
    unique = uuid.uuid4().hex
    base: dict[str, Any] = {
        "provider": provider.name,
        "store": {},
        "state_path": str(tmp_path / "resumable.json"),
        "marker": str(tmp_path / "marker"),
        "runs": str(tmp_path / "runs"),
        "user": "alice",
    }
    if provider.name == "memory":
        return {**base, "conn": None}
    if provider.name == "sqlite":
        return {**base, "conn": str(tmp_path / "store.sqlite")}
    if provider.name == "postgres":
        return {**base, "conn": postgres_schema(unique)}
    if provider.name == "redis":
        return {
            **base,
            "conn": REDIS_URL,
            "store": {"key_prefix": track_redis_prefix(f"tktest{unique[:12]}")},
        }
    assert provider.name == "tiered"
    prefix = track_redis_prefix(f"tktestc{unique[:12]}")
    return {
        **base,
        "conn": postgres_schema(unique),
        "cache_url": REDIS_URL,
        "store": {"cache_prefix": prefix},
    }


def start_worker(job: str, options: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.turn_workers", job, json.dumps(options)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: str, process: subprocess.Popen[str], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not Path(path).exists():
        if process.poll() is not None:
            raise AssertionError(f"the worker exited ({process.returncode}): {process.stderr.read()}")  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"the worker did not reach {path}"
        time.sleep(0.02)


def runs(path: str) -> list[tuple[str, int]]:
    return [(tool, int(pid)) for tool, pid in (line.split() for line in Path(path).read_text().splitlines())]


@pytest.mark.providers("memory", "sqlite", "postgres", "redis", "tiered")
@pytest.mark.parametrize("api", APIS)
def test_tm4_a_turn_killed_mid_step_resumes_in_a_new_process(
    provider: ProviderCase, tmp_path: Path, api: str
) -> None:
    """SIGKILL while the turn's second tool runs; a new process resumes the turn from the
    store: the completed step (lookup) does not run again, the cut one (slow) does. On
    memory the store died with the process: the turn restarts from its message, and says so."""
    options = {**worker_options(provider, tmp_path), "api": api}
    first = start_worker("run", options)
    try:
        wait_for(options["marker"], first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    entry = json.loads(Path(options["state_path"]).read_text())["turns"]["alice"]
    assert entry["status"] == "running"  # written as the turn started; the crash left it

    second = start_worker("resume", options)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err

    result = json.loads(out.strip().splitlines()[-1])
    restarted = provider.name == "memory"  # its checkpoints died with the first process
    assert result == {
        "response": "found invoice 7 / charged 500",
        "resumed": True,
        "restarted": restarted,
        "thread_id": entry["thread_id"],
    }
    ran = runs(options["runs"])
    again = ["lookup", "slow"] if restarted else ["slow"]
    assert [tool for tool, _ in ran] == ["lookup", "slow", *again]
    assert {pid for _, pid in ran[:2]} == {first.pid}
    assert {pid for _, pid in ran[2:]} == {second.pid}
    if restarted:
        assert "restarting it from its message" in err
    assert json.loads(Path(options["state_path"]).read_text())["turns"] == {}


class PaymentProcessor:
    """A fake payment processor on localhost: counts every charge request per idempotency
    key, and answers a repeated key with the first receipt (as real processors do)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.receipts: dict[str, str] = {}
        processor = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                key = self.headers["Idempotency-Key"]
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                processor.requests[key] = processor.requests.get(key, 0) + 1
                receipt = processor.receipts.setdefault(key, f"receipt-{len(processor.receipts) + 1}")
                text = f"{receipt} for {body['amount']}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/charges"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
@pytest.mark.parametrize("api", APIS)
def test_tm5_a_charge_survives_sigkill_and_resume_once(
    provider: ProviderCase, tmp_path: Path, api: str
) -> None:
    """The worker is SIGKILLed after the processor charged the card and the ledger recorded
    it, before the step's checkpoint; a new worker resumes the turn: the processor saw one
    charge, and the answer carries the recorded receipt."""
    processor = PaymentProcessor()
    try:
        options = {**worker_options(provider, tmp_path), "processor": processor.url, "api": api}
        first = start_worker("run", options)
        try:
            wait_for(options["marker"], first)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
        assert list(processor.requests.values()) == [1]
        if provider.name == "tiered":
            forget_cache(options)  # the cache is lost too: the turn resumes from Postgres

        second = start_worker("resume", options)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
    finally:
        processor.close()

    result = json.loads(out.strip().splitlines()[-1])
    assert result["response"] == "found invoice 7 / charged 500: receipt-1 for 500"
    assert list(processor.requests.values()) == [1]  # exactly one charge, under one key
    ran = [tool for tool, _ in runs(options["runs"])]
    assert ran == ["lookup", "slow", "charge_card", "slow"]  # the charge did not run again


def forget_cache(options: dict[str, Any]) -> None:
    """Delete every key of the tiered store's Redis cache (its prefix)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{options['store']['cache_prefix']}*", count=1000):
        client.delete(key)

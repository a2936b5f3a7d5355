"""Replay-safe tools (SPEC TM5) on the real savers' ledger: ToolNode with parallel calls, plain
calls inside a node, the functional API's ``@task``, sync and async."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from tests.providers import Opener
from tests.turn_agents import call, calls
from threadkeep import ToolCallError, current_idempotency_key, replay_safe
from threadkeep.turns import ledger_scope

APIS = ["sync", "async"]


class Processor:
    """A fake payment processor: counts the charges it took, per idempotency key."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int]] = []

    def charge(self, amount: int) -> str:
        key = current_idempotency_key()
        self.charges.append((key, amount))
        return f"charged {amount} ({key})"


class Once:
    """Raises the first ``times`` calls (a worker dying after a side effect, in-process)."""

    def __init__(self, times: int = 1) -> None:
        self.left = times

    def __call__(self) -> None:
        if self.left:
            self.left -= 1
            raise RuntimeError("worker lost")


def config(user: str = "alice") -> Any:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:10]}", "user_id": user}}


def invoke(graph: Any, api: str, value: Any, cfg: Any) -> Any:
    if api == "sync":
        return graph.invoke(value, cfg)
    return asyncio.run(graph.ainvoke(value, cfg))


def tool_graph(saver: Any, tools: list[Any], message: AIMessage, **compile_options: Any) -> Any:
    """``issue`` (adds ``message`` once) then ``tools`` (ToolNode), then the end."""

    def issue(state: MessagesState) -> dict[str, Any]:
        return {"messages": [message]}

    builder = StateGraph(MessagesState)
    builder.add_node("issue", issue)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "issue")
    builder.add_edge("issue", "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=saver, **compile_options)


@pytest.mark.parametrize("api", APIS)
def test_tm5_toolnode_parallel_calls_replay_the_succeeded_one(open_saver: Opener, api: str) -> None:
    """Two calls in one assistant message; the step dies after ``charge`` took effect
    (``flaky`` raises); run again, ``charge`` returns its recorded result without running."""
    saver, processor, dies = open_saver(), Processor(), Once()

    @tool
    def charge(amount: int) -> str:
        """Charge ``amount``."""
        return processor.charge(amount)

    @tool
    def flaky(note: str) -> str:
        """Fails once."""
        dies()
        return f"noted {note}"

    message = calls(call("charge", "pay", amount=500), call("flaky", "note", note="x"))
    graph = tool_graph(saver, [replay_safe(charge), replay_safe(flaky)], message)
    cfg = config()

    with ledger_scope(saver):
        with pytest.raises(RuntimeError, match="worker lost"):
            invoke(graph, api, {"messages": [HumanMessage("pay")]}, cfg)
        with pytest.raises(ToolCallError) as failed:  # flaky's failure is recorded as such
            invoke(graph, api, None, cfg)
    assert failed.value.code == "TOOL_001"
    assert len(processor.charges) == 1

    ledger = {entry.call_id: entry for entry in saver.tool_calls(cfg)}
    assert ledger["pay"].status == "succeeded"
    assert isinstance(ledger["pay"].result, ToolMessage)
    assert ledger["pay"].result.content == f"charged 500 ({processor.charges[0][0]})"
    assert ledger["pay"].key == processor.charges[0][0]
    assert ledger["note"].status == "failed"
    assert "worker lost" in ledger["note"].error


@pytest.mark.parametrize("api", APIS)
def test_tm5_a_replayed_call_returns_the_recorded_result(open_saver: Opener, api: str) -> None:
    saver, processor = open_saver(), Processor()

    @tool
    def charge(amount: int) -> str:
        """Charge ``amount``."""
        return processor.charge(amount)

    message = calls(call("charge", "pay", amount=500))
    graph = tool_graph(saver, [replay_safe(charge)], message)
    cfg = config()
    with ledger_scope(saver):
        invoke(graph, api, {"messages": [HumanMessage("pay")]}, cfg)
        # the tools step again, from the checkpoint that issued the call (what a resume after a
        # crash before the step's checkpoint runs)
        issued = next(s for s in graph.get_state_history(cfg) if s.next == ("tools",))
        again = {"configurable": {**issued.config["configurable"], "user_id": "alice"}}
        state = invoke(graph, api, None, again)
    (result,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert len(processor.charges) == 1
    assert result.content == f"charged 500 ({processor.charges[0][0]})"


@pytest.mark.parametrize("idempotent", [False, True])
def test_tm5_a_call_started_and_never_finished_is_of_unknown_outcome(
    open_saver: Opener, idempotent: bool
) -> None:
    saver, processor = open_saver(), Processor()

    @tool
    def charge(amount: int) -> str:
        """Charge ``amount``."""
        return processor.charge(amount)

    message = calls(call("charge", "pay", amount=500))
    graph = tool_graph(
        saver, [replay_safe(charge, idempotent=idempotent)], message, interrupt_before=["tools"]
    )
    cfg = config()
    graph.invoke({"messages": [HumanMessage("pay")]}, cfg)
    issued = graph.get_state(cfg).values["messages"][-1]
    # a worker began the call and died before it ended
    begun = saver.begin_tool_call(cfg, issued.id, "pay", "charge")

    with ledger_scope(saver):
        if not idempotent:
            with pytest.raises(ToolCallError) as raised:
                graph.invoke(None, cfg)
            assert raised.value.code == "TOOL_UNKNOWN_001"
            assert raised.value.context["key"] == begun.key
            assert processor.charges == []
            return
        graph.invoke(None, cfg)
    assert processor.charges == [(begun.key, 500)]
    (entry,) = saver.tool_calls(cfg)
    assert entry.status == "succeeded"


@pytest.mark.parametrize("api", APIS)
def test_tm5_plain_calls_inside_a_node_run_once(open_saver: Opener, api: str) -> None:
    saver, processor, dies = open_saver(), Processor(), Once()

    if api == "sync":
        charge = replay_safe(processor.charge)

        def pay(state: MessagesState) -> dict[str, Any]:
            first, second = charge(500), charge(700)
            dies()  # the worker dies after both charges took effect
            return {"messages": [AIMessage(content=f"{first}; {second}")]}

    else:

        async def acharge(amount: int) -> str:
            return processor.charge(amount)

        charge = replay_safe(acharge)

        async def pay(state: MessagesState) -> dict[str, Any]:  # type: ignore[misc]
            first, second = await charge(500), await charge(700)
            dies()
            return {"messages": [AIMessage(content=f"{first}; {second}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("pay", pay)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    graph = builder.compile(checkpointer=saver)
    cfg = config()
    with ledger_scope(saver):
        with pytest.raises(RuntimeError):
            invoke(graph, api, {"messages": [HumanMessage("pay")]}, cfg)
        state = invoke(graph, api, None, cfg)
    assert [amount for _, amount in processor.charges] == [500, 700]
    assert state["messages"][-1].content == "; ".join(f"charged {a} ({k})" for k, a in processor.charges)
    assert len({key for key, _ in processor.charges}) == 2


@pytest.mark.parametrize("api", APIS)
def test_tm5_a_functional_task_replays_its_call(open_saver: Opener, api: str) -> None:
    saver, processor, dies = open_saver(), Processor(), Once()
    charge = replay_safe(processor.charge)

    @task
    def pay(amount: int) -> str:
        receipt = charge(amount)
        dies()  # the task dies after the charge took effect
        return receipt

    @entrypoint(checkpointer=saver)
    def workflow(amount: int) -> str:
        return pay(amount).result()

    cfg = config()
    with ledger_scope(saver):
        with pytest.raises(RuntimeError):
            invoke(workflow, api, 500, cfg)
        receipt = invoke(workflow, api, None, cfg)
    assert len(processor.charges) == 1
    assert receipt == f"charged 500 ({processor.charges[0][0]})"


def test_tm5_another_users_thread_is_not_replayed_into(open_saver: Opener) -> None:
    """The ledger is the thread's: a call made on alice's thread is not visible to bob."""
    saver, processor = open_saver(), Processor()
    charge = replay_safe(processor.charge)

    def pay(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=charge(500))]}

    builder = StateGraph(MessagesState)
    builder.add_node("pay", pay)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    graph = builder.compile(checkpointer=saver)
    cfg = config("alice")
    with ledger_scope(saver):
        graph.invoke({"messages": [HumanMessage("pay")]}, cfg)
    assert len(saver.tool_calls(cfg)) == 1
    bob = {"configurable": {**cfg["configurable"], "user_id": "bob"}}
    assert saver.tool_calls(bob) == []


@pytest.mark.parametrize("api", APIS)
def test_tm5_in_a_turn_the_ledger_goes_with_the_purged_thread(
    open_saver: Opener, tmp_path: Any, api: str
) -> None:
    """A TurnManager turn records its replay-safe calls in the turn's saver without a
    ledger_scope of its own, and its purge deletes them with the thread."""
    from langgraph.config import get_config

    from tests.turn_agents import ScriptedChatModel, agent_graph, answer
    from threadkeep import Settings, TurnManager

    saver, processor = open_saver(), Processor()
    begun: list[Any] = []

    @tool
    def charge(amount: int) -> str:
        """Charge ``amount``."""
        configurable = get_config()["configurable"]
        own = {"configurable": {"thread_id": configurable["thread_id"], "user_id": configurable["user_id"]}}
        begun.extend(saver.tool_calls(own))
        return processor.charge(amount)

    model = ScriptedChatModel(script=[calls(call("charge", "pay", amount=5)), answer("paid")])
    settings = Settings(resume_state_path=str(tmp_path / "r.json"))
    manager = TurnManager(agent_graph(model, [replay_safe(charge)]), saver, settings=settings)

    if api == "sync":
        result = manager.run_turn("alice", "pay")
    else:
        result = asyncio.run(manager.arun_turn("alice", "pay"))

    assert result.response == "paid"
    (entry,) = begun  # begun in the ledger before it ran
    assert (entry.call_id, entry.status, entry.key) == ("pay", "started", processor.charges[0][0])
    assert saver.tool_calls({"configurable": {"thread_id": result.thread_id, "user_id": "alice"}}) == []


def test_tm5_a_begin_racing_the_threads_first_put_reads_its_entry() -> None:
    """The thread's row is committed between a begin's insert (which found no thread) and its
    read (which finds the thread, without the entry): the begin runs again and returns the
    entry, instead of failing on an entry of NULLs (seen on Postgres with durability async)."""
    from threadkeep.backends.postgres import queries
    from threadkeep.backends.sql.ledger import begin_tool_call
    from threadkeep.core.ledger import prepare_begin
    from threadkeep.core.program import drive

    step = prepare_begin(config(), "m", "c", "charge", isolate=True, now=1.0)
    empty = ("alice", None, None, None, None, None, None, None, None, None)
    stored = ("alice", "charge", step.key, step.claim, "started", None, None, None, 1.0, None)
    replies = iter([[None, [empty]], [None, [stored]]])

    entry = drive(begin_tool_call(queries, step), lambda request: next(replies))

    assert (entry.claim, entry.status) == (step.claim, "started")

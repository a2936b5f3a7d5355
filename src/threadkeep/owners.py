"""Owners and parks (SPEC RT4, RT5): who marks a thread finished, and when a run may wait.

Whoever mints a thread id owns the thread and marks it finished at its end; whoever starts a
run on a thread first takes it out of the finished set. The shipped owners:

- :func:`run_agent` / :func:`arun_agent`: one run on a thread. A thread it mints is marked
  finished when the run ends without a park (an error ends it too); a thread the caller
  supplies is never marked.
- :class:`RunGroup`: a flow-like run that owns a session thread and the child threads named
  by a template containing ``{run_id}``. Its terminal (success, error, stop, abort) marks
  them all finished; a pause marks nothing; a run starting on the session takes them out.
- A conversation is never marked: it leaves on the waiting horizon, or by
  ``threadkeep conversations delete-thread``.

:func:`ask` parks a run on a question until a deadline, on LangGraph's ``interrupt``.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.types import interrupt

from threadkeep.core.program import drive, drive_async
from threadkeep.core.retention import ThreadRetention
from threadkeep.errors import ConfigurationError, ParkRefusedError
from threadkeep.saver import ThreadkeepSaver

__all__ = ["RunGroup", "RunOutcome", "arun_agent", "ask", "run_agent"]

logger = logging.getLogger("threadkeep.owners")

Terminal = Literal["success", "error", "stop", "abort"]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What :func:`run_agent` did: the thread, the graph's result, and whether it parked."""

    thread_id: str
    result: Any
    parked: bool
    marked_finished: bool


def _saver_of(graph: Any) -> ThreadkeepSaver:
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, ThreadkeepSaver):
        raise ConfigurationError(
            "run_agent needs a graph compiled with a threadkeep checkpointer "
            "(builder.compile(checkpointer=threadkeep.open_checkpointer()))",
            context={"checkpointer": type(saver).__name__},
        )
    return saver


def _config(thread_id: str, config: RunnableConfig | None) -> RunnableConfig:
    merged: dict[str, Any] = dict(config or {})
    merged["configurable"] = {**merged.get("configurable", {}), "thread_id": thread_id}
    return merged  # type: ignore[return-value]


# A run_agent call is a program (see threadkeep.core.program) of these four steps, written
# once; run_agent answers them with the sync API and arun_agent with the async one.
_START, _INVOKE, _STATE, _MARK = "start", "invoke", "state", "mark"


class _OwnedRun:
    """One :func:`run_agent` call: its thread, and the steps it takes."""

    def __init__(self, graph: Any, thread_id: str | None, config: RunnableConfig | None) -> None:
        self.graph = graph
        self.saver = _saver_of(graph)
        self.minted = thread_id is None
        self.thread = thread_id or uuid.uuid4().hex
        self.config = _config(self.thread, config)

    def program(self) -> Generator[str, Any, RunOutcome]:
        yield _START
        try:
            result = yield _INVOKE
        except Exception as error:
            if self.minted:  # the run ended: the thread it minted is finished
                try:
                    yield _MARK
                except Exception as mark_error:  # the run's own error stays the one raised
                    logger.error(
                        "could not mark thread %s finished after its run failed: %s", self.thread, mark_error
                    )
                    error.add_note(f"threadkeep could not mark thread {self.thread!r} finished: {mark_error}")
                else:
                    error.add_note(f"threadkeep marked thread {self.thread!r} finished (run_agent minted it)")
            raise
        parked = bool((yield _STATE).interrupts)
        outcome = RunOutcome(self.thread, result, parked, marked_finished=self.minted and not parked)
        if outcome.marked_finished:
            yield _MARK
        return outcome


def run_agent(
    graph: Any,
    input: Any,
    *,
    thread_id: str | None = None,
    config: RunnableConfig | None = None,
    retention: ThreadRetention | None = None,
    **invoke_options: Any,
) -> RunOutcome:
    """Run ``graph`` once on a thread it owns (a new one) or the caller's (SPEC RT4).

    Args:
        graph: A compiled graph whose checkpointer is a threadkeep saver.
        input: The run's input (``None`` or a ``Command`` to resume).
        thread_id: The caller's thread (never marked finished); default: mint one.
        config: More config for ``invoke`` (its ``thread_id`` is replaced).
        retention: The thread's declared retention (see :func:`threadkeep.declare_retention`).
        **invoke_options: Passed to ``graph.invoke`` (``durability``, ...).
    """
    run = _OwnedRun(graph, thread_id, config)
    steps: dict[str, Callable[[], Any]] = {
        _START: lambda: run.saver.start_threads([run.thread], retention=retention, config=run.config),
        _INVOKE: lambda: graph.invoke(input, run.config, **invoke_options),
        _STATE: lambda: graph.get_state(run.config),
        _MARK: lambda: run.saver.mark_finished([run.thread], config=run.config),
    }
    return drive(run.program(), lambda step: steps[step]())


async def arun_agent(
    graph: Any,
    input: Any,
    *,
    thread_id: str | None = None,
    config: RunnableConfig | None = None,
    retention: ThreadRetention | None = None,
    **invoke_options: Any,
) -> RunOutcome:
    """Async :func:`run_agent` (``graph.ainvoke``)."""
    run = _OwnedRun(graph, thread_id, config)
    steps: dict[str, Callable[[], Awaitable[Any]]] = {
        _START: lambda: run.saver.astart_threads([run.thread], retention=retention, config=run.config),
        _INVOKE: lambda: graph.ainvoke(input, run.config, **invoke_options),
        _STATE: lambda: graph.aget_state(run.config),
        _MARK: lambda: run.saver.amark_finished([run.thread], config=run.config),
    }
    return await drive_async(run.program(), lambda step: steps[step]())


class RunGroup:
    """A flow-like run owning a session thread and its runs' child threads (SPEC RT4).

    Args:
        saver: The store.
        session_thread: The session's thread id.
        child_template: How a run's child thread is named; must contain ``{run_id}`` (and
            may contain ``{session}``).
        retention: The declared retention of every thread of the group.
        run_ids: Runs of the group started before (a group rebuilt after a pause).
        config: Whose threads they are (``configurable.user_id``), as in the runs' config.

    Use :meth:`start` before any run on the session, then :meth:`end` at the group's
    terminal, or nothing at a pause; or the :meth:`running` context manager.
    """

    def __init__(
        self,
        saver: ThreadkeepSaver,
        session_thread: str,
        *,
        child_template: str = "{session}:{run_id}",
        retention: ThreadRetention | None = None,
        run_ids: tuple[str, ...] = (),
        config: RunnableConfig | None = None,
    ) -> None:
        if "{run_id}" not in child_template:
            raise ConfigurationError(
                f"child_template {child_template!r} must contain {{run_id}}",
                context={"child_template": child_template},
            )
        self.saver = saver
        self.session_thread = session_thread
        self.child_template = child_template
        self.retention = retention
        self.run_ids: list[str] = list(run_ids)
        self.config = config
        self._paused = False

    def child(self, run_id: str) -> str:
        """The child thread of run ``run_id`` (the group owns it from now on)."""
        if run_id not in self.run_ids:
            self.run_ids.append(run_id)
        return self.child_template.format(session=self.session_thread, run_id=run_id)

    @property
    def threads(self) -> list[str]:
        """The session thread and every child thread of the group."""
        return [self.session_thread, *(self.child(run_id) for run_id in list(self.run_ids))]

    def start(self) -> None:
        """A run starts on the session: every thread of the group leaves the finished set."""
        self.saver.start_threads(self.threads, retention=self.retention, config=self.config)

    def end(self, outcome: Terminal) -> dict[str, float]:
        """The group reached a terminal: mark all its threads finished (their due times)."""
        if outcome not in ("success", "error", "stop", "abort"):
            raise ConfigurationError(
                f"RunGroup.end({outcome!r}): a terminal is success, error, stop or abort "
                "(a pause is not a terminal: call nothing)",
                context={"outcome": outcome},
            )
        logger.info(
            "run group %s ended (%s): marking %d threads finished",
            self.session_thread,
            outcome,
            len(self.threads),
        )
        return self.saver.mark_finished(self.threads, config=self.config)

    @contextmanager
    def running(self) -> Iterator[RunGroup]:
        """Start the group; at exit, end it with ``error`` on an exception, else ``success``,
        unless :meth:`pause` was called inside."""
        self._paused = False
        self.start()
        try:
            yield self
        except BaseException as error:
            try:
                self.end("error")
            except Exception as mark_error:  # the flow's own error is the one raised
                logger.error(
                    "run group %s: could not mark its threads finished: %s", self.session_thread, mark_error
                )
                error.add_note(
                    f"threadkeep could not mark run group {self.session_thread!r} finished: {mark_error}"
                )
            raise
        if not self._paused:
            self.end("success")

    def pause(self) -> None:
        """Inside :meth:`running`: the group pauses; nothing is marked at exit."""
        self._paused = True


# --- parks (SPEC RT5) ---------------------------------------------------------------------------


def ask(question: Any, *, deadline: dt.datetime | float | None) -> Any:
    """Park the run on ``question`` until it is answered or ``deadline`` passes (SPEC RT5).

    Call it inside a graph node, like LangGraph's ``interrupt``: the first call records a
    live park and interrupts the run; when the run is resumed with
    ``Command(resume=answer)``, it clears the park and returns the answer. A live park keeps
    the sweep from deleting the thread.

    Args:
        question: What the run waits on (any value the codec stores).
        deadline: A timezone-aware datetime, or epoch seconds.

    Raises:
        ParkRefusedError: before anything is parked, when the deadline is missing, naive or
            past the thread's waiting horizon, or the store cannot hold a parked run.
        StorageForbiddenError: the thread belongs to another user.
    """
    from langgraph.config import get_config

    config = get_config()
    configurable = config.get("configurable", {})
    saver = configurable.get("__pregel_checkpointer")
    if deadline is None:
        raise ParkRefusedError(
            "ask() needs a deadline (deadline=datetime or epoch seconds): a parked run without one "
            "would hold its thread forever",
        )
    if not isinstance(saver, ThreadkeepSaver):
        raise ParkRefusedError(
            "ask() parks runs on a threadkeep checkpointer; this graph has "
            f"{type(saver).__name__}. Compile it with threadkeep.open_checkpointer()",
            context={"checkpointer": type(saver).__name__},
        )
    if not saver.facts.holds_parked_runs:
        raise ParkRefusedError(
            f"the {saver.facts.name} provider cannot hold a parked run (another worker could not "
            "resume it); use postgres, redis or tiered",
            context={"provider": saver.facts.name},
        )
    thread_id = str(configurable["thread_id"])
    due = _epoch(deadline)
    found = saver.thread_retention(thread_id, config=config)
    declared = found[0] if found and found[0].waiting_minutes else saver.declared or ThreadRetention()
    waiting = declared.waiting(saver.retention)
    horizon = saver.clock() + waiting * 60
    if due > horizon:
        raise ParkRefusedError(
            f"ask() deadline {_iso(due)} is past thread {thread_id!r}'s waiting horizon {_iso(horizon)} "
            f"({waiting} minutes from now): the thread could expire before the answer; "
            "choose an earlier deadline",
            context={"thread_id": thread_id, "deadline": due, "horizon": horizon, "waiting_minutes": waiting},
        )
    park_id = f"{configurable.get('checkpoint_ns', '')}|{configurable.get('__pregel_task_id', '')}"
    saver.record_park(thread_id, park_id, due, config=config)
    answer = interrupt(question)
    saver.clear_park(thread_id, park_id, config=config)
    return answer


def _epoch(deadline: dt.datetime | float) -> float:
    if isinstance(deadline, dt.datetime):
        if deadline.tzinfo is None:
            raise ParkRefusedError(
                f"ask() deadline {deadline.isoformat()} has no time zone; give an aware datetime",
                context={"deadline": deadline.isoformat()},
            )
        return deadline.timestamp()
    if isinstance(deadline, bool) or not isinstance(deadline, int | float):
        raise ParkRefusedError(
            f"ask() deadline {deadline!r} must be an aware datetime or epoch seconds",
            context={"deadline": repr(deadline)},
        )
    return float(deadline)


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")

"""Turns (SPEC TM1-TM4): each user message runs on a thread of its own, with rollback and
retry when a tool call fails, and resume after a failure or a crash.

A turn is a program (see :mod:`threadkeep.core.program`) of the requests below, written
once: :meth:`TurnManager.run_turn` answers them with the graph's and the saver's sync API,
:meth:`TurnManager.arun_turn` with the async one. Its decisions are in
:mod:`threadkeep.turns.plan`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import StateGraph

from threadkeep.core.identity import user_scope
from threadkeep.core.ids import checked_id
from threadkeep.core.program import drive, drive_async
from threadkeep.errors import (
    ConfigurationError,
    NoResumableTurnError,
    StorageError,
    ToolCallError,
    TurnFailedError,
)
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings
from threadkeep.turns.plan import (
    ToolFailure,
    describe_call,
    failed_results,
    failure_note,
    input_messages,
    response_text,
    rollback_target,
    tool_results,
    unanswered_calls,
)
from threadkeep.turns.pointers import Pointer, PointerFile
from threadkeep.turns.replay import ledger_scope

__all__ = ["TurnManager", "TurnResult"]

logger = logging.getLogger("threadkeep.turns")

Durability = Literal["sync", "async", "exit"]


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What a turn answered, and how it got there.

    Attributes:
        user_id: Whose turn it was.
        thread_id: The turn's thread (purged unless ``kept``).
        response: The text of the turn's last assistant message.
        messages: The turn's messages at its end.
        values: The graph's whole state at its end.
        attempts: Runs it took: 1, plus one per rollback or retry.
        failures: What failed on the way (each rolled back or retried), oldest first.
        resumed: The turn was continued by :meth:`TurnManager.resume_last_turn`.
        restarted: A resumed turn whose checkpoints were gone (the ``memory`` provider after
            a restart, or swept): it ran again from its message.
        kept: Its checkpoints were kept (``keep_history``, or it waits on an interrupt).
        interrupted: It stopped on an interrupt (``interrupt``/``threadkeep.ask``) and waits.
    """

    user_id: str
    thread_id: str
    response: str
    messages: list[BaseMessage]
    values: dict[str, Any]
    attempts: int
    failures: tuple[ToolFailure, ...]
    resumed: bool = False
    restarted: bool = False
    kept: bool = False
    interrupted: bool = False


# The requests a turn program makes ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Run:
    """Run the graph from ``input`` (``None``: continue from the checkpoint ``config`` names)
    until it ends, raises, or a step returns an error result; reply: a :class:`_Outcome`."""

    input: Any
    config: RunnableConfig
    deadline: float | None


@dataclass(frozen=True, slots=True)
class _Outcome:
    error: BaseException | None = None
    failed: tuple[ToolMessage, ...] = ()  # the error results of the step that stopped the run
    results: tuple[ToolMessage, ...] = ()  # every tool result of that step
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class _History:
    """The thread's state snapshots, newest first."""

    config: RunnableConfig


@dataclass(frozen=True, slots=True)
class _State:
    """The thread's newest state snapshot."""

    config: RunnableConfig


@dataclass(frozen=True, slots=True)
class _Update:
    """Fork the thread at ``config`` with ``values`` added; reply: the new checkpoint's config."""

    config: RunnableConfig
    values: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Purge:
    """Delete the thread: its checkpoints, writes (and, on a ledger-keeping store, its ledger)."""

    thread_id: str


@dataclass(frozen=True, slots=True)
class _Finish:
    """Mark the thread finished (retention's finished horizon applies)."""

    thread_id: str


@dataclass(frozen=True, slots=True)
class _Point:
    """Write the user's pointer entry (``pointer``), or drop it (``None``) if it names ``thread_id``."""

    user_id: str
    thread_id: str
    pointer: Pointer | None


@dataclass
class _Turn:
    """One turn: whose, on which thread, from which input."""

    user_id: str
    thread_id: str
    input: Any
    resumed: bool = False
    restarted: bool = False

    @property
    def config(self) -> RunnableConfig:
        return {"configurable": {"thread_id": self.thread_id, "user_id": self.user_id}}


class TurnManager:
    """Runs each user message as a turn of ``graph`` on a thread of its own (SPEC TM1-TM4).

    A turn's thread is fresh and owned by its user: every call the manager makes acts for
    that user (``configurable.user_id`` and :func:`threadkeep.user_scope`), so with user
    isolation on (the default) one user's turn can neither read nor write another's. A
    checkpoint is stored after each step (``durability="sync"``).

    When a tool call fails (the tool raises, or returns an error result), the turn rolls back
    ``rollback_steps`` checkpoints (the failed result, then the call) to the last clean
    decision point, adds a message telling the model what failed, and runs again from there;
    with no such point it restarts on its thread. After ``max_retries`` rollbacks the next
    failure raises :class:`~threadkeep.TurnFailedError`. A failure elsewhere (the model's
    call) is retried from where it happened, counted the same way.

    A completed turn's checkpoints are purged by default: its answer has been returned, and
    nothing reads a finished turn's steps again, so keeping them would only grow the store
    (by every step of every turn) and keep a user's data longer than needed. Pass
    ``keep_history=True`` to keep them (marked finished: the retention's finished horizon
    removes them).

    With resume on (``LLM_PROVIDER_CHECKPOINT_RESUME_ENABLED``, or ``resume=True``), a turn
    that fails, times out or is cut off by a crash is kept and named in the resume state
    file; :meth:`resume_last_turn` continues it. Off, a failed turn is purged.

    Args:
        graph: A ``StateGraph`` (compiled here with ``checkpointer``) or a compiled graph
            whose checkpointer is ``checkpointer``.
        checkpointer: The threadkeep saver (``None``: the compiled graph's).
        max_retries: Rollbacks or retries a turn may take before it fails.
        rollback_steps: Checkpoints a tool failure rolls back (2: the failed result and the
            call; 1: only the result, running the call again as it was).
        messages_key: The state key holding the messages.
        keep_history: Keep a completed turn's checkpoints instead of purging them.
        durability: LangGraph's durability for the turn's runs.
        settings: Where the resume settings come from (default: the environment).
        resume: Resume on or off (default: the settings').
        failure_message: Builds the message that tells the model what failed (default: a
            human message with :func:`threadkeep.turns.plan.failure_note`'s text).
    """

    def __init__(
        self,
        graph: Any,
        checkpointer: ThreadkeepSaver | None = None,
        *,
        max_retries: int = 2,
        rollback_steps: int = 2,
        messages_key: str = "messages",
        keep_history: bool = False,
        durability: Durability = "sync",
        settings: Settings | None = None,
        resume: bool | None = None,
        failure_message: Callable[[ToolFailure], BaseMessage] | None = None,
    ) -> None:
        if isinstance(graph, StateGraph):
            if checkpointer is None:
                raise ConfigurationError(
                    "TurnManager(StateGraph, None): pass the checkpointer to compile it with"
                )
            graph = graph.compile(checkpointer=checkpointer)
        saver: object = checkpointer if checkpointer is not None else getattr(graph, "checkpointer", None)
        if getattr(graph, "checkpointer", None) is not saver:  # before isinstance narrows saver
            raise ConfigurationError(
                "TurnManager: the graph was compiled with another checkpointer than the one passed; "
                "compile it with builder.compile(checkpointer=saver), or pass the StateGraph builder",
            )
        if not isinstance(saver, ThreadkeepSaver):
            raise ConfigurationError(
                "TurnManager needs a threadkeep checkpointer (threadkeep.open_checkpointer()); got "
                f"{type(saver).__name__}",
                context={"checkpointer": type(saver).__name__},
            )
        for name, value, least in (("max_retries", max_retries, 0), ("rollback_steps", rollback_steps, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigurationError(f"TurnManager {name}={value!r}: a whole number, at least {least}")
        settings = settings or Settings.from_env()
        self.graph = graph
        self.saver: ThreadkeepSaver = saver
        self.max_retries = max_retries
        self.rollback_steps = rollback_steps
        self.messages_key = messages_key
        self.keep_history = keep_history
        self.durability = durability
        self.resume_enabled = settings.resume_enabled if resume is None else resume
        self.pointers = PointerFile(
            Path(settings.resume_state_path), settings.resume_ttl, clock=self.saver.clock
        )
        self.failure_message = failure_message or _default_message
        self._active: dict[str, _Turn] = {}
        self._guard = threading.Lock()

    # the turn program ---------------------------------------------------------------------

    def _program(self, turn: _Turn, deadline: float | None) -> Generator[Any, Any, TurnResult]:
        """Run ``turn`` to its end: the rollbacks and retries, then its end (SPEC TM2, TM3)."""
        failures: list[ToolFailure] = []
        config = turn.config
        if turn.resumed and not turn.restarted:
            run = _Run(None, config, deadline)
        else:
            run = _Run(self._graph_input(turn.input), config, deadline)
        if self.resume_enabled:
            yield _Point(turn.user_id, turn.thread_id, self._pointer(turn, "running"))
        while True:
            try:
                outcome = yield run
            except Exception as error:
                outcome = _Outcome(error=error)
            if outcome.error is None and not outcome.failed and not outcome.timed_out:
                break
            if outcome.timed_out or isinstance(outcome.error, StorageError):
                yield from self._end_failed(turn, failures, outcome, attempts=len(failures) + 1)
            failure = yield from self._failure(turn, outcome, attempt=len(failures) + 1)
            failures.append(failure)
            if len(failures) > self.max_retries:
                yield from self._end_failed(turn, failures, outcome, attempts=len(failures))
            run = yield from self._recover(turn, failure)
            logger.info(
                "turn %s of user %s: attempt %d failed (%s); %s",
                turn.thread_id,
                turn.user_id,
                failure.attempt,
                failure.error,
                "retrying" if run.input is None else "restarting it on its thread",
            )
        state = yield _State(config)
        return (yield from self._end_done(turn, state, failures))

    def _failure(self, turn: _Turn, outcome: _Outcome, attempt: int) -> Generator[Any, Any, ToolFailure]:
        """What failed: the calls of the error results, or those the failed step left unanswered."""
        if outcome.failed:
            state = yield _State(turn.config)
            messages = state.values.get(self.messages_key) or []
            failed_ids = {message.tool_call_id for message in outcome.failed}
            issuing = _issuing(messages, failed_ids)
            calls = (
                tuple(call for call in issuing.tool_calls if call.get("id") in failed_ids) if issuing else ()
            )
            others = {m.tool_call_id: str(m.content) for m in outcome.results if m.status != "error"}
            succeeded = tuple(
                (call, others[str(call.get("id"))])
                for call in (issuing.tool_calls if issuing else [])
                if call.get("id") in others
            )
            text = "; ".join(f"{m.name or 'tool'} returned an error: {m.content}" for m in outcome.failed)
            error = ToolCallError(
                text,
                code="TOOL_RESULT_001",
                context={"thread_id": turn.thread_id, "calls": [describe_call(c) for c in calls]},
            )
            return ToolFailure(attempt, calls or tuple(_as_calls(outcome.failed)), error, succeeded)
        assert outcome.error is not None
        state = yield _State(turn.config)
        calls = tuple(unanswered_calls(state.values.get(self.messages_key) or []))
        # A step that failed with tool calls pending is the tools' step; any other is not.
        return ToolFailure(attempt, calls if state.next else (), outcome.error)

    def _recover(self, turn: _Turn, failure: ToolFailure) -> Generator[Any, Any, _Run]:
        """Where the next attempt starts: the rollback target with a note for the model, the
        failed step again (not a tool's failure), or the turn's start on its thread."""
        if not failure.tool_failure:
            state = yield _State(turn.config)
            if not state.values:  # it failed before its first checkpoint: start it again
                return _Run(self._graph_input(turn.input), turn.config, None)
            return _Run(None, turn.config, None)  # LangGraph runs the failed step again
        history = yield _History(turn.config)
        call_ids = {str(call.get("id")) for call in failure.calls}
        target = rollback_target(history, call_ids, self.rollback_steps, self.messages_key)
        if target is None:
            yield _Purge(turn.thread_id)
            note = self.failure_message(failure)
            restart = self._restart_input(turn, note)
            return _Run(restart, turn.config, None)
        if self.rollback_steps <= 1:
            return _Run(None, _with_user(target.config, turn.user_id), None)
        forked = yield _Update(
            _with_user(target.config, turn.user_id), {self.messages_key: [self.failure_message(failure)]}
        )
        return _Run(None, _with_user(forked, turn.user_id), None)

    def _graph_input(self, message: Any) -> Any:
        """The graph's input for a turn's message: a mapping as it is, else its messages."""
        messages = input_messages(message, self.messages_key)
        return dict(message) if messages is None else {self.messages_key: messages}

    def _restart_input(self, turn: _Turn, note: BaseMessage) -> Any:
        values = self._graph_input(turn.input)
        values[self.messages_key] = [*(values.get(self.messages_key) or []), note]
        return values

    def _end_failed(
        self, turn: _Turn, failures: list[ToolFailure], outcome: _Outcome, attempts: int
    ) -> Generator[Any, Any, None]:
        """Keep the turn for resume (resume on) or purge it, and raise TurnFailedError."""
        if outcome.timed_out:
            what = "timed out"
            cause: BaseException = TimeoutError(f"turn {turn.thread_id!r} ran past its deadline")
        else:
            assert outcome.error is not None or failures
            cause = outcome.error if outcome.error is not None else failures[-1].error
            what = f"failed {attempts} time(s)" if failures else "failed"
        kept = self.resume_enabled
        if kept:
            yield _Point(turn.user_id, turn.thread_id, self._pointer(turn, "failed", error=f"{cause}"))
        else:
            yield from self._purge_failed(turn)
        self._forget(turn)
        last = failures[-1].error if failures else cause
        raise TurnFailedError(
            f"turn on thread {turn.thread_id!r} of user {turn.user_id!r} {what}; the last error: {last}. "
            + (
                "It is kept: resume it with resume_last_turn(user)."
                if kept
                else "Its checkpoints were purged (resume is off)."
            ),
            failures=tuple(failures),
            context={
                "user_id": turn.user_id,
                "thread_id": turn.thread_id,
                "attempts": attempts,
                "resumable": kept,
            },
        ) from cause

    def _end_cancelled(self, turn: _Turn) -> Generator[Any, Any, None]:
        if self.resume_enabled:
            yield _Point(turn.user_id, turn.thread_id, self._pointer(turn, "failed", error="cancelled"))
        else:
            yield from self._purge_failed(turn)
        self._forget(turn)

    def _purge_failed(self, turn: _Turn) -> Generator[Any, Any, None]:
        """Purge a turn that failed; a store that fails the purge too (the turn's own failure
        may be the store's) leaves the thread to retention, and the turn's error is raised."""
        try:
            yield _Purge(turn.thread_id)
        except Exception as error:
            logger.warning("turn %s of user %s: could not purge it: %s", turn.thread_id, turn.user_id, error)

    def _end_done(
        self, turn: _Turn, state: Any, failures: list[ToolFailure]
    ) -> Generator[Any, Any, TurnResult]:
        """Purge the completed turn (or keep it), and drop its resume entry."""
        values = dict(state.values or {})
        messages = list(values.get(self.messages_key) or [])
        interrupted = bool(state.next)
        kept = self.keep_history or interrupted
        if not kept:
            yield _Purge(turn.thread_id)
        elif not interrupted:
            yield _Finish(turn.thread_id)
        if self.resume_enabled:
            yield _Point(turn.user_id, turn.thread_id, None)
        self._forget(turn)
        return TurnResult(
            user_id=turn.user_id,
            thread_id=turn.thread_id,
            response=response_text(messages),
            messages=messages,
            values=values,
            attempts=len(failures) + 1,
            failures=tuple(failures),
            resumed=turn.resumed,
            restarted=turn.restarted,
            kept=kept,
            interrupted=interrupted,
        )

    def _pointer(
        self, turn: _Turn, status: Literal["running", "failed"], error: str | None = None
    ) -> Pointer:
        kind, data = Pointer.encode_input(self.saver.serde.dumps_typed(turn.input))
        return Pointer(turn.user_id, turn.thread_id, status, self.saver.clock(), kind, data, error)

    # turns ----------------------------------------------------------------------------------

    def _new_turn(self, user_id: str, message: Any) -> _Turn:
        user_id = checked_id(str(user_id), "user_id")
        if not user_id:
            raise ConfigurationError("a turn needs a user: user_id is empty")
        turn = _Turn(user_id, f"turn-{uuid.uuid4().hex}", message)
        with self._guard:
            self._active[user_id] = turn
        return turn

    def _forget(self, turn: _Turn) -> None:
        with self._guard:
            if self._active.get(turn.user_id) is turn:
                del self._active[turn.user_id]

    def _resumable(self, user_id: str) -> _Turn:
        if not self.resume_enabled:
            raise NoResumableTurnError(
                "resume is off (LLM_PROVIDER_CHECKPOINT_RESUME_ENABLED=false): no turn is kept",
                context={"user_id": user_id},
            )
        pointer = self.pointers.get(user_id)
        if pointer is None:
            raise NoResumableTurnError(
                f"user {user_id!r} has no resumable turn (none kept, or older than {self.pointers.ttl:g} s)",
                context={"user_id": user_id},
            )
        turn = _Turn(
            user_id, pointer.thread_id, self.saver.serde.loads_typed(pointer.typed_input()), resumed=True
        )
        with self._guard:
            self._active[user_id] = turn
        return turn

    def _found(self, turn: _Turn, state: Any) -> None:
        """A resumed turn whose thread holds nothing restarts from its message, and says so."""
        if not state.values:
            turn.restarted = True
            logger.warning(
                "turn %s of user %s: its checkpoints are gone (the %s provider %s); restarting it "
                "from its message",
                turn.thread_id,
                turn.user_id,
                self.saver.facts.name,
                "keeps none past a restart"
                if not self.saver.facts.survives_restart
                else "no longer holds them",
            )

    def run_turn(self, user_id: str, message: Any, *, timeout: float | None = None) -> TurnResult:
        """Run one turn for ``user_id`` on a fresh thread and return its result.

        Args:
            user_id: The user; the turn's thread is theirs alone.
            message: A string (one human message), a message, a list of messages, or a
                mapping of the graph's input state.
            timeout: Seconds the turn may take, checked after each step: past it the turn
                ends as failed (kept for resume, or purged).

        Raises:
            TurnFailedError: a tool call failed more than ``max_retries`` times, or the turn
                timed out; ``__cause__`` is the last error.
            StorageForbiddenError, StorageError: from the store.
        """
        turn = self._new_turn(user_id, message)
        return self._drive(turn, timeout)

    async def arun_turn(self, user_id: str, message: Any) -> TurnResult:
        """Async :meth:`run_turn`. Bound it with ``asyncio.timeout``: a turn cancelled there is
        kept for resume (resume on) or purged, then the cancellation goes on."""
        turn = self._new_turn(user_id, message)
        return await self._adrive(turn)

    def has_resumable_turn(self, user_id: str) -> bool:
        """Whether ``user_id`` has a kept turn to resume: resume on, and an entry in the resume
        state file younger than its time to live."""
        return self.resume_enabled and self.pointers.get(checked_id(str(user_id), "user_id")) is not None

    def resume_last_turn(self, user_id: str, *, timeout: float | None = None) -> TurnResult:
        """Continue ``user_id``'s kept turn from its newest checkpoint (steps already stored are
        not run again) and return its result. If its checkpoints are gone (``memory`` after a
        restart), the turn runs again from its message: ``result.restarted`` says so, and a
        warning is logged.

        Raises:
            NoResumableTurnError: resume is off, or the user has no (unexpired) kept turn.
            TurnFailedError: as :meth:`run_turn`.
        """
        turn = self._resumable(checked_id(str(user_id), "user_id"))
        with user_scope(turn.user_id):
            self._found(turn, self.graph.get_state(turn.config))
        return self._drive(turn, timeout)

    async def aresume_last_turn(self, user_id: str) -> TurnResult:
        """Async :meth:`resume_last_turn`."""
        turn = self._resumable(checked_id(str(user_id), "user_id"))
        with user_scope(turn.user_id):
            self._found(turn, await self.graph.aget_state(turn.config))
        return await self._adrive(turn)

    def clear_resumable(self, user_id: str | None = None) -> list[str]:
        """Drop ``user_id``'s pending resume (``None``: every user's) and delete the kept
        turns' threads. Returns the users whose entry was dropped."""
        dropped = self.pointers.drop(None if user_id is None else checked_id(str(user_id), "user_id"))
        for pointer in dropped:
            with user_scope(pointer.user_id):
                self.saver.delete_thread(pointer.thread_id)
        return [pointer.user_id for pointer in dropped]

    def end_turn(self, user_id: str, *, keep_for_resume: bool = False) -> str | None:
        """End ``user_id``'s turn in progress from outside it (a caller that gave up on it):
        keep it for :meth:`resume_last_turn` (``keep_for_resume``, resume on) or purge it.
        Returns its thread id, or ``None`` if the user has no turn in progress here."""
        with self._guard:
            turn = self._active.pop(checked_id(str(user_id), "user_id"), None)
        if turn is None:
            return None
        if keep_for_resume and self.resume_enabled:
            self.pointers.put(self._pointer(turn, "failed", error="ended by end_turn"))
        else:
            with user_scope(turn.user_id):
                self.saver.delete_thread(turn.thread_id)
            if self.resume_enabled:
                self.pointers.drop(turn.user_id, turn.thread_id)
        return turn.thread_id

    # the drivers ------------------------------------------------------------------------------

    def _drive(self, turn: _Turn, timeout: float | None) -> TurnResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        with user_scope(turn.user_id), ledger_scope(self.saver):
            return drive(self._program(turn, deadline), self._execute)

    async def _adrive(self, turn: _Turn) -> TurnResult:
        with user_scope(turn.user_id), ledger_scope(self.saver):
            try:
                return await drive_async(self._program(turn, None), self._aexecute)
            except asyncio.CancelledError:  # cancelled (asyncio.timeout): end the turn, go on
                await drive_async(self._end_cancelled(turn), self._aexecute)
                raise

    def _execute(self, request: Any) -> Any:
        graph, saver = self.graph, self.saver
        if isinstance(request, _Run):
            return self._stream(request)
        if isinstance(request, _History):
            return list(graph.get_state_history(request.config))
        if isinstance(request, _State):
            return graph.get_state(request.config)
        if isinstance(request, _Update):
            return graph.update_state(request.config, request.values)
        if isinstance(request, _Purge):
            return saver.delete_thread(request.thread_id)
        if isinstance(request, _Finish):
            return saver.mark_finished([request.thread_id])
        return self._point(request)

    async def _aexecute(self, request: Any) -> Any:
        graph, saver = self.graph, self.saver
        if isinstance(request, _Run):
            return await self._astream(request)
        if isinstance(request, _History):
            return [snapshot async for snapshot in graph.aget_state_history(request.config)]
        if isinstance(request, _State):
            return await graph.aget_state(request.config)
        if isinstance(request, _Update):
            return await graph.aupdate_state(request.config, request.values)
        if isinstance(request, _Purge):
            return await saver.adelete_thread(request.thread_id)
        if isinstance(request, _Finish):
            return await saver.amark_finished([request.thread_id])
        return await asyncio.to_thread(self._point, request)

    def _point(self, request: _Point) -> None:
        if request.pointer is not None:
            self.pointers.put(request.pointer)
        else:
            self.pointers.drop(request.user_id, request.thread_id)

    def _chunks(self, run: _Run, chunks: Iterator[Any]) -> _Outcome | None:
        """Watch a run's steps: stop at the first error result, or past the deadline."""
        for chunk in chunks:
            failed = failed_results(chunk, self.messages_key)
            if failed:
                return _Outcome(failed=tuple(failed), results=tuple(tool_results(chunk, self.messages_key)))
            if run.deadline is not None and time.monotonic() > run.deadline:
                return _Outcome(timed_out=True)
        return None

    def _stream(self, run: _Run) -> _Outcome:
        chunks = self.graph.stream(run.input, run.config, stream_mode="updates", durability=self.durability)
        try:
            return self._chunks(run, chunks) or _Outcome()
        finally:
            chunks.close()

    async def _astream(self, run: _Run) -> _Outcome:
        chunks = self.graph.astream(run.input, run.config, stream_mode="updates", durability=self.durability)
        try:
            async for chunk in chunks:
                outcome = self._chunks(run, iter((chunk,)))
                if outcome is not None:
                    return outcome
        finally:
            await chunks.aclose()
        return _Outcome()


def _with_user(config: RunnableConfig, user_id: str) -> RunnableConfig:
    return {**config, "configurable": {**(config.get("configurable") or {}), "user_id": user_id}}


def _issuing(messages: Sequence[Any], call_ids: set[str]) -> AIMessage | None:
    for message in reversed(messages):
        if isinstance(message, AIMessage) and {c.get("id") for c in message.tool_calls} & call_ids:
            return message
    return None


def _as_calls(results: Sequence[ToolMessage]) -> list[Any]:
    return [
        {"name": m.name or "tool", "args": {}, "id": m.tool_call_id, "type": "tool_call"} for m in results
    ]


def _default_message(failure: ToolFailure) -> BaseMessage:
    return HumanMessage(content=failure_note(failure))

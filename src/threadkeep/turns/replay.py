"""Replay-safe tools (SPEC TM5): a tool call whose side effect happened runs once, whatever
is replayed after a crash.

:func:`replay_safe` wraps a tool (a LangChain ``BaseTool``, such as an ``@tool`` function,
run by LangGraph's ``ToolNode``) or a plain function (called inside a node, or inside a
functional API ``@task``), sync or async. Each call is recorded in the thread's tool-call
ledger through the saver's API (``begin_tool_call`` / ``end_tool_call``): begun before it
runs, ended with its result or its error. Run again for the same call (a resumed turn, a
task run again after a crash):

- a call that succeeded returns its recorded result without running;
- a call that failed raises :class:`~threadkeep.ToolCallError` (``TOOL_001``) with the
  recorded error, without running;
- a call that started and never ended (the process died in between) raises
  ``ToolCallError`` (``TOOL_UNKNOWN_001``): its side effect may or may not have happened.
  A tool declared ``idempotent=True`` runs again instead.

The one call logic below is a program (see :mod:`threadkeep.core.program`) that the sync
and the async wrappers drive.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast, overload

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.prebuilt import InjectedState
from langgraph.runtime import get_runtime
from pydantic import BaseModel, create_model

from threadkeep.core.identity import AUTH_USER_KEY
from threadkeep.core.program import drive, drive_async
from threadkeep.errors import ConfigurationError, ToolCallError
from threadkeep.saver import ThreadkeepSaver

__all__ = ["ReplaySafeTool", "current_idempotency_key", "ledger_scope", "replay_safe"]

F = TypeVar("F", bound=Callable[..., Any])

# The argument ToolNode injects the state's messages into (see ReplaySafeTool).
_MESSAGES_ARG = "threadkeep_messages"
_saver: ContextVar[ThreadkeepSaver | None] = ContextVar("threadkeep_ledger_saver", default=None)
_key: ContextVar[str | None] = ContextVar("threadkeep_idempotency_key", default=None)
# Per task attempt: how many calls of each (name, arguments) it has made so far.
_counts: ContextVar[tuple[str, int, dict[str, int]] | None] = ContextVar(
    "threadkeep_call_counts", default=None
)


@contextmanager
def ledger_scope(saver: ThreadkeepSaver) -> Iterator[None]:
    """Replay-safe calls made inside record to ``saver``'s ledger (a
    :class:`~threadkeep.TurnManager` opens one around each turn)."""
    token = _saver.set(saver)
    try:
        yield
    finally:
        _saver.reset(token)


def current_idempotency_key() -> str:
    """The idempotency key of the replay-safe call running now: hand it to an external API
    (a payment processor's ``Idempotency-Key``), which then acts at most once per call
    however often it is sent. It is stable: the same call gets the same key after a crash.

    Raises:
        ConfigurationError: called outside a replay-safe call.
    """
    key = _key.get()
    if key is None:
        raise ConfigurationError("current_idempotency_key() is only known inside a replay_safe tool's call")
    return key


@dataclass(frozen=True, slots=True)
class _Site:
    """Where a call is recorded: the thread's config, the message and the call's ids."""

    saver: ThreadkeepSaver
    config: RunnableConfig
    message_id: str
    call_id: str
    tool: str


# The requests of the call program.
@dataclass(frozen=True, slots=True)
class _Begin:
    site: _Site


@dataclass(frozen=True, slots=True)
class _Run:
    key: str


@dataclass(frozen=True, slots=True)
class _End:
    site: _Site
    result: Any
    error: str | None


def _call(site: _Site, idempotent: bool) -> Generator[Any, Any, Any]:
    """One replay-safe call: begin it, then run it and record how it ended, or replay it."""
    entry = yield _Begin(site)
    context = {
        "tool": site.tool,
        "thread_id": entry.thread_id,
        "message_id": site.message_id,
        "call_id": site.call_id,
        "key": entry.key,
    }
    if entry.status == "succeeded" and not entry.fresh:
        return entry.result
    if entry.status == "failed":
        raise ToolCallError(
            f"tool call {site.tool} ({site.call_id}) failed before and is not run again: {entry.error}",
            context=context,
        )
    if not entry.fresh and not idempotent:
        raise ToolCallError(
            f"tool call {site.tool} ({site.call_id}) started before and never finished: whether it "
            "took effect is unknown, so it is not run again. Check its effect (idempotency key "
            f"{entry.key}) before calling it anew",
            code="TOOL_UNKNOWN_001",
            context=context,
        )
    try:
        result = yield _Run(entry.key)
    except Exception as error:
        yield _End(site, None, f"{type(error).__name__}: {error}")
        raise
    yield _End(site, result, None)
    return result


def _answer(site_run: Callable[[], Any]) -> Callable[[Any], Any]:
    def execute(request: Any) -> Any:
        if isinstance(request, _Begin):
            site = request.site
            return site.saver.begin_tool_call(site.config, site.message_id, site.call_id, site.tool)
        if isinstance(request, _End):
            site = request.site
            if request.error is not None:
                return site.saver.end_tool_call(
                    site.config, site.message_id, site.call_id, error=request.error
                )
            return site.saver.end_tool_call(site.config, site.message_id, site.call_id, result=request.result)
        token = _key.set(request.key)
        try:
            return site_run()
        finally:
            _key.reset(token)

    return execute


def _aanswer(site_run: Callable[[], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
    async def execute(request: Any) -> Any:
        if isinstance(request, _Begin):
            site = request.site
            return await site.saver.abegin_tool_call(site.config, site.message_id, site.call_id, site.tool)
        if isinstance(request, _End):
            site = request.site
            if request.error is not None:
                return await site.saver.aend_tool_call(
                    site.config, site.message_id, site.call_id, error=request.error
                )
            return await site.saver.aend_tool_call(
                site.config, site.message_id, site.call_id, result=request.result
            )
        token = _key.set(request.key)
        try:
            return await site_run()
        finally:
            _key.reset(token)

    return execute


def _site(
    tool: str,
    call_id: str | None,
    arguments: Any,
    saver: ThreadkeepSaver | None,
    message_id: str | None = None,
) -> _Site:
    """Where the call running now is recorded.

    The thread and its user come from the run's config. A call from ``ToolNode`` is keyed by
    the id of the assistant message that issued it (``message_id``) and its tool-call id.
    Otherwise the message is the checkpoint the running step started from (a step run again
    after a crash starts from the same checkpoint), and a call without a tool-call id (a
    plain call in a node or a task) is named by its task, its tool, its arguments and how
    many identical calls the task attempt made before it.
    """
    saver = saver or _saver.get()
    if saver is None:
        raise ConfigurationError(
            f"replay_safe tool {tool!r} has no ledger: run it in a TurnManager turn, inside "
            "threadkeep.turns.ledger_scope(saver), or give it the saver (replay_safe(..., saver=saver))"
        )
    try:
        config = get_config()
        info = get_runtime().execution_info
    except RuntimeError as error:
        raise ConfigurationError(
            f"replay_safe tool {tool!r} was called outside a LangGraph run: the ledger is kept per "
            "thread, so call it inside a node, a task or a tool of a graph with a checkpointer"
        ) from error
    if info is None or not info.thread_id:
        raise ConfigurationError(
            f"replay_safe tool {tool!r} runs in a graph without a thread (no checkpointer)"
        )
    configurable = config.get("configurable") or {}
    thread: dict[str, Any] = {"thread_id": info.thread_id}
    for name in ("user_id", AUTH_USER_KEY):
        if configurable.get(name) not in (None, ""):
            thread[name] = configurable[name]
    if call_id is None:
        call_id = _plain_call_id(tool, arguments, info.task_id, info.node_attempt)
    return _Site(saver, {"configurable": thread}, message_id or info.checkpoint_id, call_id, tool)


def _plain_call_id(tool: str, arguments: Any, task_id: str, attempt: int) -> str:
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True, default=repr).encode()).hexdigest()[:16]
    counts = _counts.get()
    if counts is None or counts[:2] != (task_id, attempt):
        counts = (task_id, attempt, {})
        _counts.set(counts)
    seen = counts[2].get(f"{tool}:{digest}", 0)
    counts[2][f"{tool}:{digest}"] = seen + 1
    return f"{task_id}:{tool}:{digest}:{seen}"


# ToolNode asks for a tool's input schema several times per call: each extension is built once.
_EXTENDED: dict[tuple[type[BaseModel], str], type[BaseModel]] = {}


def _with_messages(base: type[BaseModel], messages_key: str) -> type[BaseModel]:
    """``base`` with the injected messages argument (``base`` itself if pydantic refuses)."""
    found = _EXTENDED.get((base, messages_key))
    if found is None:
        try:
            found = create_model(  # type: ignore[call-overload]
                base.__name__,
                __base__=base,
                **{_MESSAGES_ARG: (Annotated[Any, InjectedState(messages_key)], None)},
            )
        except Exception:  # a schema pydantic cannot extend: the message is the checkpoint's
            found = base
        _EXTENDED[(base, messages_key)] = found
    return found


def _tool_call_id(value: Any) -> str | None:
    """The id of a ``ToolCall`` input (what ``ToolNode`` hands a tool), else ``None``."""
    if isinstance(value, Mapping) and value.get("type") == "tool_call" and value.get("id"):
        return str(value["id"])
    return None


def _arguments(value: Any) -> Any:
    return value.get("args") if isinstance(value, Mapping) and "args" in value else value


class ReplaySafeTool(BaseTool):
    """A LangChain tool whose calls are recorded in the thread's ledger (see the module).

    Build it with :func:`replay_safe`. It has the wrapped tool's name, description and
    arguments; a call from ``ToolNode`` is keyed by its tool-call id.
    """

    inner: BaseTool
    idempotent: bool = False
    saver: Any = None
    messages_key: str = "messages"

    def get_input_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        """The wrapped tool's input, and the state's messages, which ``ToolNode`` injects
        (``InjectedState``): the call's assistant message is found there. The model does not
        see it (``tool_call_schema`` is the wrapped tool's)."""
        base = self.inner.get_input_schema(config)
        if not issubclass(base, BaseModel):  # a pydantic.v1 schema: the message is the checkpoint's
            return cast(type[BaseModel], base)
        return _with_messages(base, self.messages_key)

    def _prepared(self, input: Any) -> tuple[Any, str | None, str | None]:
        """The input without the injected messages; the call's id and its message's id."""
        call_id = _tool_call_id(input)
        if call_id is None or not isinstance(input.get("args"), Mapping):
            return input, call_id, None
        args = dict(input["args"])
        messages = args.pop(_MESSAGES_ARG, None) or []
        message_id = next(
            (
                m.id
                for m in reversed(messages)
                if isinstance(m, AIMessage) and m.id and any(c.get("id") == call_id for c in m.tool_calls)
            ),
            None,
        )
        return {**input, "args": args}, call_id, message_id

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        input, call_id, message_id = self._prepared(input)
        site = _site(self.name, call_id, _arguments(input), self.saver, message_id)
        run = functools.partial(self.inner.invoke, input, config, **kwargs)
        return drive(_call(site, self.idempotent), _answer(run))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        input, call_id, message_id = self._prepared(input)
        site = _site(self.name, call_id, _arguments(input), self.saver, message_id)
        run = functools.partial(self.inner.ainvoke, input, config, **kwargs)
        return await drive_async(_call(site, self.idempotent), _aanswer(run))

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke is overridden
        raise NotImplementedError("ReplaySafeTool runs through invoke")


@overload
def replay_safe(
    tool: BaseTool,
    *,
    idempotent: bool = ...,
    saver: ThreadkeepSaver | None = ...,
    messages_key: str = ...,
) -> ReplaySafeTool: ...


@overload
def replay_safe(
    tool: F, *, idempotent: bool = ..., saver: ThreadkeepSaver | None = ..., messages_key: str = ...
) -> F: ...


@overload
def replay_safe(
    tool: None = None,
    *,
    idempotent: bool = ...,
    saver: ThreadkeepSaver | None = ...,
    messages_key: str = ...,
) -> Callable[[F], F]: ...


def replay_safe(
    tool: Any = None,
    *,
    idempotent: bool = False,
    saver: ThreadkeepSaver | None = None,
    messages_key: str = "messages",
) -> Any:
    """Make ``tool``'s calls replay-safe: recorded in the thread's ledger, run at most once.

    Args:
        tool: A LangChain tool (``@tool``, ``StructuredTool``: run by ``ToolNode``), or a
            plain function or coroutine function (called in a node, or in a ``@task``).
            Without it, a decorator: ``@replay_safe(idempotent=True)``.
        idempotent: The tool is safe to run twice: a call that started and never finished
            runs again instead of raising ``TOOL_UNKNOWN_001``.
        saver: The saver whose ledger records the calls; default: the turn's
            (:class:`~threadkeep.TurnManager`) or the enclosing :func:`ledger_scope`'s.
        messages_key: The state key of the messages (``ToolNode``'s ``messages_key``),
            where a tool finds the assistant message that issued its call.

    Returns:
        A :class:`ReplaySafeTool` for a tool; a function of the same signature otherwise.
        Inside a call, :func:`current_idempotency_key` is the call's idempotency key.
    """
    if tool is None:
        return lambda wrapped: replay_safe(
            wrapped, idempotent=idempotent, saver=saver, messages_key=messages_key
        )
    if isinstance(tool, BaseTool):
        return ReplaySafeTool(
            name=tool.name,
            description=tool.description,
            args_schema=tool.args_schema,
            return_direct=tool.return_direct,
            response_format=tool.response_format,
            inner=tool,
            idempotent=idempotent,
            saver=saver,
            messages_key=messages_key,
        )
    name = getattr(tool, "__name__", type(tool).__name__)
    if inspect.iscoroutinefunction(tool):

        @functools.wraps(tool)
        async def acall(*args: Any, **kwargs: Any) -> Any:
            site = _site(name, None, [args, kwargs], saver)
            return await drive_async(_call(site, idempotent), _aanswer(lambda: tool(*args, **kwargs)))

        return acall

    @functools.wraps(tool)
    def call(*args: Any, **kwargs: Any) -> Any:
        site = _site(name, None, [args, kwargs], saver)
        return drive(_call(site, idempotent), _answer(lambda: tool(*args, **kwargs)))

    return cast(Any, call)

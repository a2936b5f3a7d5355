"""``threadkeep``: the command line. A thin adapter: every command calls a library function.

Exit codes (also in ``threadkeep --help`` and the README):

- 0 success;
- 1 a threadkeep error the message explains (a refused setting, another user's thread, ...);
- 2 bad usage or invalid input: an unknown option, a bad value, cursor, time or id;
- 3 the store needs a reset before this version can use it;
- 4 no such thread (or checkpoint);
- 5 the store is unavailable: unreachable past the retries, or its server refused the login.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from threadkeep.errors import (
    CheckpointStoreFormatError,
    MissingExtraError,
    StorageError,
    ThreadkeepError,
    ThreadNotFoundError,
)
from threadkeep.threads import MAX_PAGE, STATUSES, Cursor, ThreadQuery, ThreadStatus

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from threadkeep.saver import ThreadkeepSaver

EXIT_ERROR = 1
EXIT_USAGE = 2  # click's own code for bad usage
EXIT_NEEDS_RESET = 3
EXIT_NOT_FOUND = 4
EXIT_UNAVAILABLE = 5

EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 an error the message explains (a missing extra too); 2 bad usage or "
    "invalid input (an option, setting, filter, cursor, time or id); 3 the store needs a reset; "
    "4 no such thread or checkpoint; 5 the store is unavailable."
)


class _Group(click.Group):
    """Turns threadkeep errors into one line on stderr and a meaningful exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CheckpointStoreFormatError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_NEEDS_RESET)
        except ThreadNotFoundError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_NOT_FOUND)
        except StorageError as error:
            click.echo(f"error: {error}", err=True)
            # A conflict or another user's thread is an answer of the store, not its absence.
            sys.exit(EXIT_UNAVAILABLE if error.kind == "unavailable" else EXIT_ERROR)
        except MissingExtraError as error:  # the install, not the input: the message names it
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_ERROR)
        except ThreadkeepError as error:
            click.echo(f"error: {error}", err=True)
            # Invalid input of any kind (a setting, a filter, a cursor, a retention): usage.
            sys.exit(EXIT_USAGE if error.kind == "invalid" else EXIT_ERROR)


@click.group(cls=_Group, epilog=EXIT_CODES_HELP)
@click.version_option(package_name="threadkeep")
def main() -> None:
    """Durable, retention-managed memory for LangGraph agents."""


@main.command()
@click.option("--turns", default=8, show_default=True, type=click.IntRange(1, 500))
def demo(turns: int) -> None:
    """Run a scripted tool-calling agent on the configured store and show what it stored."""
    from threadkeep.demo import run_demo, run_turns_demo

    click.echo(f"Running {turns} turns of a scripted tool-calling agent (no network) ...")
    report = run_demo(turns)
    click.echo(f"\nstore: {report.provider} at {report.location}")
    click.echo(f"thread: {report.thread_id}, {len(report.history)} checkpoints, newest first\n")
    click.echo(f"  {'step':>4}  {'source':<7} {'msgs':>4}  last message")
    for row in report.history:
        click.echo(f"  {row.step:>4}  {row.source:<7} {row.messages:>4}  {row.last}")
    click.echo("\nstorage for this conversation (bytes of stored values):")
    click.echo(f"  threadkeep ({report.provider}):  {report.threadkeep_bytes:>12,}")
    if report.langgraph_bytes is None:
        click.echo("  (to compare with LangGraph's SqliteSaver: pip install langgraph-checkpoint-sqlite)")
    else:
        ratio = report.langgraph_bytes / max(report.threadkeep_bytes, 1)
        click.echo(f"  LangGraph SqliteSaver:   {report.langgraph_bytes:>12,}  ({ratio:.1f}x more)")
    click.echo("\nturns (docs/turns.md): a tool that fails once, and a turn cut off after its payment:")
    for line in run_turns_demo().lines:
        click.echo(f"  {line}")


@main.group()
def store() -> None:
    """Inspect or reset the configured checkpoint store."""


def _print_status(status: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(status.to_dict(), indent=2))
        return
    click.echo(f"provider: {status.provider}")
    click.echo(f"location: {status.location}")
    click.echo(f"status:   {status.detail}")
    if status.stats:
        for key, value in status.stats.items():
            click.echo(f"  {key:>15}: {value:,}")


@store.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def store_check(as_json: bool) -> None:
    """Check that this version can use the store (exit 3 if it needs a reset)."""
    from threadkeep.store import check_store

    status = check_store()
    _print_status(status, as_json)
    if not status.ready:
        sys.exit(EXIT_NEEDS_RESET)


@store.command("reset")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def store_reset(yes: bool, as_json: bool) -> None:
    """Delete every thread in the store so this version can start on it."""
    from threadkeep.settings import Settings
    from threadkeep.store import reset_store

    settings = Settings.from_env()
    if not yes:
        click.confirm(
            f"Delete every checkpoint in the {settings.provider} store? This cannot be undone",
            abort=True,
        )
    _print_status(reset_store(settings), as_json)


@main.group()
def checkpoints() -> None:
    """Retention of the configured store's checkpoint threads."""


@checkpoints.command("sweep")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON for scripts.")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--list",
    "list_ids",
    is_flag=True,
    help="Also print the ids: of the threads spared and, on a dry run, of those that would go.",
)
def checkpoints_sweep(as_json: bool, dry_run: bool, list_ids: bool) -> None:
    """Delete the threads past their retention that nothing claims as live."""
    from threadkeep.sweep import DOOMED_LISTED, PAGE_SIZE, SweepResult, sweep_checkpoints

    bar: Any = None

    def progress(result: SweepResult, total: int) -> None:
        # A bar on stderr (so --json stays clean) once a sweep spans more than one page.
        nonlocal bar
        done = result.swept_count + len(result.spared)
        if bar is None and total > PAGE_SIZE:
            bar = click.progressbar(length=total, label="sweeping", file=sys.stderr).__enter__()
        if bar is not None:
            bar.update(done - bar.pos)

    result = sweep_checkpoints(dry_run=dry_run, progress=progress)
    if bar is not None:
        bar.__exit__(None, None, None)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"checkpoint sweep of the {result.provider} store{' (dry run: nothing deleted)' if dry_run else ''}"
    )
    click.echo(f"  retention: waiting {result.waiting_minutes} min, finished {result.finished_minutes} min")
    click.echo(
        f"  {verb} {result.swept_count} thread(s): {result.finished_swept} finished, "
        f"{result.waiting_swept} waiting"
    )
    if list_ids:
        for row in result.doomed:
            click.echo(f"    {row['thread_id']}  ({row['horizon']})")
        if dry_run and result.swept_count > len(result.doomed):
            click.echo(
                f"    ... and {result.swept_count - len(result.doomed):,} more "
                f"(a dry run lists the first {DOOMED_LISTED:,})"
            )
    counts = result.spared_summary()
    click.echo(f"  spared {len(result.spared)} thread(s) still in use{': ' + counts if counts else ''}")
    if list_ids:
        for spared in result.spared:
            click.echo(f"    {spared.thread_id}  ({spared.horizon} horizon, claimed by {spared.owner})")
    for note in result.skipped:
        click.echo(f"  skipped: {note}")
    if not list_ids and (result.spared or result.doomed):
        click.echo("  (--list prints the threads' ids)")


@main.group()
def conversations() -> None:
    """Conversations: threads no owner marks finished."""


@conversations.command("delete-thread")
@click.argument("thread_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def conversations_delete_thread(thread_id: str, as_json: bool) -> None:
    """Delete THREAD_ID and everything it holds, whoever owns it (exit 4 if there is none)."""
    from threadkeep.core.identity import operator_scope
    from threadkeep.providers import open_checkpointer

    with open_checkpointer() as saver, operator_scope():
        found = bool(saver.delete_threads(saver.threads_named([thread_id])))
    if as_json:
        click.echo(json.dumps({"thread_id": thread_id, "deleted": found}))
    else:
        click.echo(f"deleted thread {thread_id!r}" if found else f"no thread {thread_id!r} in the store")
    if not found:
        sys.exit(EXIT_NOT_FOUND)


@main.group(epilog=EXIT_CODES_HELP)
def threads() -> None:
    """Threads of the configured store, whoever owns them (operator commands): list them,
    show one's conversation, history and the diff of two checkpoints, hand them to users."""


@threads.command("assign-owner")
@click.argument("thread_ids", metavar="THREAD...", nargs=-1, required=True)
@click.option("--user", required=True, help="The user to hand the threads to.")
@click.option("--force", is_flag=True, help="Also take threads another user owns (not only anonymous ones).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def threads_assign_owner(thread_ids: tuple[str, ...], user: str, force: bool, as_json: bool) -> None:
    """Hand THREAD... to --user: threads written before user ids were passed belong to the
    anonymous owner (see docs/isolation.md). Exit 4 if a thread is not in the store (the
    others are handed over)."""
    from threadkeep.core.identity import operator_scope
    from threadkeep.providers import open_checkpointer

    with open_checkpointer() as saver, operator_scope():
        before = saver.assign_owner(thread_ids, user, force=force)
    missing = [thread_id for thread_id, owner in before.items() if owner is None]
    if as_json:
        click.echo(json.dumps({"user": user, "owners_before": before, "missing": missing}, indent=2))
    else:
        for thread_id, owner in before.items():
            if owner is None:
                click.echo(f"{thread_id}: no such thread in the store")
            elif owner == user:
                click.echo(f"{thread_id}: already owned by {user!r}")
            else:
                click.echo(f"{thread_id}: {owner!r} -> {user!r}")
    if missing:
        sys.exit(EXIT_NOT_FOUND)


# --- threads list | show | history | diff (SPEC SV3) --------------------------------------------
# Their --json output is the listing's ThreadPage.to_dict() and threadkeep.views' dicts, the
# same the HTTP API serves; the tables below are drawn from those dicts only.

_PREVIEW = 60
_CONTENT = 300
_SPANS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _store_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options every thread command shares: which store, acting as whom, and --json."""
    from threadkeep.settings import PROVIDERS

    options = (
        click.option(
            "--provider",
            type=click.Choice(PROVIDERS),
            default=None,
            help="Read this provider's store for this command (default: LLM_PROVIDER_CHECKPOINT).",
        ),
        click.option(
            "--conn",
            default=None,
            metavar="CONN",
            help="Its connection string, a path for sqlite (default: LLM_PROVIDER_CHECKPOINT_CONN_STRING).",
        ),
        click.option(
            "--user",
            default=None,
            metavar="USER",
            help="Act as USER: see only USER's threads (default: the operator, every thread).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts (docs/operations.md)."),
    )
    for option in reversed(options):
        command = option(command)
    return command


@contextmanager
def _opened(provider: str | None, conn: str | None, user: str | None) -> Iterator[ThreadkeepSaver]:
    """The configured store (or the one --provider/--conn name), read as --user or the operator."""
    from threadkeep.core.identity import operator_scope, user_scope
    from threadkeep.providers import open_checkpointer

    with open_checkpointer(provider, conn) as saver, user_scope(user) if user else operator_scope():
        yield saver


def _config(thread_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
    """The root namespace of ``thread_id`` (a subgraph's checkpoints are not the thread's history)."""
    from threadkeep.window import root_config

    return root_config(thread_id, checkpoint_id)


def _when(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``--since`` / ``--before``: an ISO date or time (local unless it names an offset) or a
    span ago (``30m``, ``2h``, ``7d``), as epoch seconds."""
    if value is None:
        return None
    span = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", value.strip())
    if span:
        return time.time() - float(span[1]) * _SPANS[span[2]]
    try:
        when = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a date or time (2026-12-06, 2026-12-06T14:30, local time unless "
            "it names an offset) nor a span ago (30m, 2h, 7d)"
        ) from None
    return (when if when.tzinfo else when.astimezone()).timestamp()


def _metadata(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    """``--metadata key=value`` pairs; a value is read as JSON when it is JSON (``step=3``,
    ``done=true``), else as text."""
    pairs: dict[str, Any] = {}
    for item in values:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (for example source=loop or step=3)")
        try:
            pairs[key] = json.loads(text)
        except ValueError:
            pairs[key] = text
    return pairs


def _cursor(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    from threadkeep.threads import Cursor

    if value is None:
        return None
    try:
        return Cursor.decode(value)
    except ThreadkeepError as error:
        raise click.BadParameter(error.message) from None


def _local(when: float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """Epoch seconds as local time (the TZ environment variable's zone)."""
    return "-" if when is None else dt.datetime.fromtimestamp(when).astimezone().strftime(fmt)


def _span(seconds: float) -> str:
    """A duration to the nearest unit: ``40 s``, ``25 min``, ``3 h``, ``6 d 4 h``."""
    if seconds < 59.5:
        return f"{round(seconds)} s"
    if (minutes := round(seconds / 60)) < 60:
        return f"{minutes} min"
    if (hours := round(seconds / 3600)) < 48:
        return f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _relative(when: float, now: float) -> str:
    return f"in {_span(when - now)}" if when >= now else f"{_span(now - when)} ago"


def _due(when: float | None, now: float) -> str:
    """A due time: relative within two days (``in 3 h``, ``5 min ago``), else local time."""
    if when is None:
        return "-"
    return _local(when, "%Y-%m-%d %H:%M") if abs(when - now) >= 2 * 86400 else _relative(when, now)


def _zone() -> str:
    return dt.datetime.now().astimezone().strftime("%Z (UTC%z)")


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _call_text(call: Mapping[str, Any]) -> str:
    args = call.get("args")
    shown = (
        ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in args.items())
        if isinstance(args, Mapping)
        else json.dumps(args, ensure_ascii=False)
    )
    return f"{call.get('name') or '?'}({shown})"


def _message_line(message: Mapping[str, Any], width: int = _PREVIEW) -> str:
    """One line for a message view: ``ai [calls lookup]: text`` or ``tool lookup: text``."""
    head = message["type"] + (f" {message['name']}" if message["name"] else "")
    calls = ", ".join(str(call.get("name") or "?") for call in message["tool_calls"])
    return _cut(f"{head}{f' [calls {calls}]' if calls else ''}: {message['content']}", width)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell; the last one is left ragged."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers) - 1)]
    lines = []
    for row in [headers, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return lines


def _last_message(saver: ThreadkeepSaver, thread_id: str) -> str:
    """The preview of a thread's last message (or, with none, of its pending interrupt)."""
    from threadkeep.views import state_view

    found = saver.get_tuple(_config(thread_id))
    if found is None:
        return ""
    state = state_view(found)
    if state["messages"]:
        return _message_line(state["messages"][-1])
    if state["interrupts"]:
        return _cut(f"interrupt: {json.dumps(state['interrupts'][0]['value'], ensure_ascii=False)}", _PREVIEW)
    return ""


@threads.command("list", epilog=EXIT_CODES_HELP)
@click.option("--status", type=click.Choice(STATUSES), help="Only threads of this status.")
@click.option(
    "--since",
    callback=_when,
    metavar="WHEN",
    help="Only threads written at or after WHEN (2h, 7d, 2026-12-06T14:30).",
)
@click.option("--before", callback=_when, metavar="WHEN", help="Only threads last written before WHEN.")
@click.option(
    "--metadata",
    multiple=True,
    callback=_metadata,
    metavar="KEY=VALUE",
    help="Only threads whose newest checkpoint's metadata holds KEY=VALUE (repeatable; JSON or text).",
)
@click.option(
    "--limit", type=click.IntRange(1, MAX_PAGE), default=50, show_default=True, help="Threads per page."
)
@click.option(
    "--cursor",
    callback=_cursor,
    metavar="CURSOR",
    help="The next page: the cursor the previous page printed.",
)
@_store_options
def threads_list(
    *,
    status: ThreadStatus | None,
    since: float | None,
    before: float | None,
    metadata: dict[str, Any],
    limit: int,
    cursor: Cursor | None,
    provider: str | None,
    conn: str | None,
    user: str | None,
    as_json: bool,
) -> None:
    """List threads, newest write first, a page at a time: id, owner, status, last write and
    due time in local time, and a preview of the last message. --user USER lists USER's
    threads only."""
    query = ThreadQuery(
        owner=user,
        status=status,
        written_after=since,
        written_before=before,
        metadata=metadata or None,
        limit=limit,
        cursor=cursor,
    )
    with _opened(provider, conn, user) as saver:
        page = saver.threads(query)
        if as_json:
            click.echo(json.dumps(page.to_dict(), indent=2))
            return
        previews = {row.thread_id: _last_message(saver, row.thread_id) for row in page.threads}
    now = time.time()
    rows = []
    for row in page.threads:
        due = _due(row.due, now)
        if row.parked_until is not None:
            due += f" (parked: {_due(row.parked_until, now)})"
        rows.append(
            [row.thread_id, row.owner, row.status, _local(row.written_at), due, previews[row.thread_id]]
        )
    if rows:
        for line in _table(["THREAD", "OWNER", "STATUS", "LAST WRITE", "DUE", "LAST MESSAGE"], rows):
            click.echo(line)
        click.echo(f"\n{len(rows)} thread(s); times in {_zone()}")
    else:
        # A page filtered by metadata may end empty after reading its bound, with a cursor.
        click.echo("no threads on this page" if page.next_cursor else "no threads")
    if page.next_cursor is not None:
        click.echo(f"more: the same command with --cursor {page.next_cursor.encode()}")


@threads.command("show", epilog=EXIT_CODES_HELP)
@click.argument("thread_id")
@click.option(
    "--full", is_flag=True, help=f"Print every message whole (default: cut at {_CONTENT} characters)."
)
@_store_options
def threads_show(
    *, thread_id: str, full: bool, provider: str | None, conn: str | None, user: str | None, as_json: bool
) -> None:
    """Show THREAD_ID: its conversation (messages with their role, tool calls and results),
    status, due time and parks, and its newest checkpoint (exit 4 if there is no such thread)."""
    from threadkeep.views import state_view
    from threadkeep.window import retention_of

    with _opened(provider, conn, user) as saver:
        found = saver.get_tuple(_config(thread_id))
        if found is None:
            raise ThreadNotFoundError(thread_id)
        kept = retention_of(saver, thread_id)
        now = saver.clock()
    state = state_view(found)
    if as_json:
        click.echo(json.dumps({"state": state, "retention": kept}, indent=2))
        return
    horizons = kept["horizons"]
    click.echo(f"thread {thread_id}")
    click.echo(f"  status      {kept['status']}")
    due = "-" if kept["due"] is None else f"{_local(kept['due'])} ({_relative(kept['due'], now)})"
    click.echo(f"  due         {due}")
    waiting, finished = horizons["waiting_minutes"], horizons["finished_minutes"]
    click.echo(f"  horizons    waiting {waiting} min, finished {finished} min")
    click.echo(f"  parks       {'a live park' if 'park' in kept['spared_by'] else 'none live'}")
    spared = {"park": "its live park", "interrupt": "its pending interrupt"}
    reasons = " and ".join(spared.get(reason, reason) for reason in kept["spared_by"])
    click.echo(f"  spared by   {reasons or 'nothing: the sweep deletes it once due'}")
    click.echo(f"  last write  {_local(state['created_at'])}")
    click.echo(f"  checkpoint  {state['checkpoint_id']} (step {state['step']}, {state['source']})")
    click.echo(f"  next        {', '.join(state['next']) or '- (the run ended)'}")
    for interrupt in state["interrupts"]:
        click.echo(f"  interrupt   {_cut(json.dumps(interrupt['value'], ensure_ascii=False), 200)}")
    for name, value in state["values"].items():
        click.echo(f"  {name:<11} {_cut(json.dumps(value, ensure_ascii=False), 200)}")
    click.echo(f"  times in    {_zone()}")
    messages = state["messages"]
    click.echo(f"\nconversation: {len(messages)} message(s)")
    calls = {call["id"]: call["name"] for message in messages for call in message["tool_calls"]}
    for number, message in enumerate(messages, 1):
        click.echo(f"\n[{number}] {_role(message, calls)}")
        _print_content(message["content"], None if full else _CONTENT)
        for call in message["tool_calls"]:
            click.echo(f"    -> {_call_text(call)}  [{call['id']}]")


def _role(message: Mapping[str, Any], calls: Mapping[str, str | None]) -> str:
    """A message's heading: its role, and for a tool result the call it answers."""
    if message["type"] != "tool":
        return str(message["type"]) + (f" ({message['name']})" if message["name"] else "")
    tool = message["name"] or calls.get(message["tool_call_id"]) or "?"
    failed = " (error)" if message["status"] == "error" else ""
    return f"tool {tool} <- [{message['tool_call_id']}]{failed}"


def _print_content(text: str, width: int | None) -> None:
    if width is not None and len(text) > width:
        text = f"{text[:width]} …[+{len(text) - width} chars: --full]"
    for line in text.splitlines():
        click.echo(textwrap.fill(line, 100, initial_indent="    ", subsequent_indent="    ") or "    ")


@threads.command("history", epilog=EXIT_CODES_HELP)
@click.argument("thread_id")
@click.option(
    "--limit", type=click.IntRange(1, MAX_PAGE), default=20, show_default=True, help="Checkpoints per page."
)
@click.option(
    "--cursor", metavar="CHECKPOINT_ID", help="The next page: the cursor the previous page printed."
)
@_store_options
def threads_history(
    *,
    thread_id: str,
    limit: int,
    cursor: str | None,
    provider: str | None,
    conn: str | None,
    user: str | None,
    as_json: bool,
) -> None:
    """THREAD_ID's checkpoints, newest first, a page at a time: step, source, time and the
    writes made from each (exit 4 if there is no such thread)."""
    from threadkeep.window import history_page

    with _opened(provider, conn, user) as saver:
        page = history_page(saver, thread_id, limit=limit, cursor=cursor)
    rows, next_cursor = page["checkpoints"], page["next_cursor"]
    if as_json:
        click.echo(json.dumps(page, indent=2))
        return
    table = []
    for row in rows:
        writes = [f"{write['channel']}: {write['preview']}" for write in row["writes"]] or ["-"]
        table.append(
            [
                str(row["step"]),
                str(row["source"]),
                _local(row["created_at"]),
                row["checkpoint_id"],
                _cut(writes[0], 70),
            ]
        )
        table.extend(["", "", "", "", _cut(write, 70)] for write in writes[1:])
    for line in _table(["STEP", "SOURCE", "TIME", "CHECKPOINT", "WRITES"], table):
        click.echo(line)
    click.echo(f"\n{len(rows)} checkpoint(s), newest first; times in {_zone()}")
    if next_cursor is not None:
        click.echo(f"more: the same command with --cursor {next_cursor}")


@threads.command("diff", epilog=EXIT_CODES_HELP)
@click.argument("thread_id")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@_store_options
def threads_diff(
    *, thread_id: str, a: str, b: str, provider: str | None, conn: str | None, user: str | None, as_json: bool
) -> None:
    """What changed in THREAD_ID from checkpoint A to checkpoint B: channels added, removed
    and changed, and the messages added, removed and changed (exit 4 if either is missing)."""
    from threadkeep.views import diff_view, history_view

    with _opened(provider, conn, user) as saver:
        if saver.get_tuple(_config(thread_id)) is None:
            raise ThreadNotFoundError(thread_id)
        older, newer = saver.get_tuple(_config(thread_id, a)), saver.get_tuple(_config(thread_id, b))
        for name, found in ((a, older), (b, newer)):
            if found is None:
                raise ThreadNotFoundError(thread_id, name)
    assert older is not None
    assert newer is not None
    diff = diff_view(older, newer)
    if as_json:
        click.echo(json.dumps(diff, indent=2))
        return
    click.echo(f"thread {thread_id}")
    for label, item in (("from", older), ("to", newer)):
        row = history_view(item)
        click.echo(
            f"  {label:<4} {row['checkpoint_id']}  step {row['step']}, {row['source']}, "
            f"{_local(row['created_at'])}"
        )
    if not diff["channels"]:
        click.echo("\nno channel changed")
        return
    for kind in ("added", "removed", "changed"):
        if diff[kind]:
            click.echo(f"  {kind:<8} {', '.join(diff[kind])}")
    for name, change in diff["channels"].items():
        click.echo(f"\n{name} ({change['change']})")
        if "messages_added" in change:
            for message in change["messages_added"]:
                click.echo(f"  + {_message_line(message, 100)}")
            for message in change["messages_removed"]:
                click.echo(f"  - {_message_line(message, 100)}")
            for pair in change["messages_changed"]:
                click.echo(f"  ~ {_message_line(pair['before'], 100)}")
                click.echo(f"    -> {_message_line(pair['after'], 100)}")
        else:
            click.echo(f"  before: {change['before'] if change['before'] is not None else '-'}")
            click.echo(f"  after:  {change['after'] if change['after'] is not None else '-'}")


@main.command("import")
@click.argument("source")
@click.option("--user", default=None, help="Owner of the imported threads (default: the anonymous owner).")
@click.option("--verify", is_flag=True, help="Then compare every imported thread with the source.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON for scripts.")
def import_(source: str, user: str | None, verify: bool, as_json: bool) -> None:
    """Copy every thread of LangGraph's SqliteSaver file or PostgresSaver database SOURCE (a
    path or a postgresql:// DSN) into the configured store, keeping their ids. Re-running
    skips what the store holds, so an interrupted import resumes. Exit 1 if a thread was
    refused or --verify found a difference."""
    from threadkeep.migrate import import_threads, open_langgraph_saver, source_thread_ids, verify_threads
    from threadkeep.providers import open_checkpointer

    with open_langgraph_saver(source) as origin, open_checkpointer() as saver:
        ids = source_thread_ids(origin)
        with click.progressbar(length=len(ids), label="importing threads", file=sys.stderr) as bar:
            summary = import_threads(
                origin, saver, user=user, thread_ids=ids, progress=lambda done, total, thread: bar.update(1)
            )
        mismatches = verify_threads(origin, saver, user=user, thread_ids=ids) if verify else None
    result = summary.to_dict()
    if mismatches is not None:
        result["verified"] = not mismatches
        result["mismatches"] = [str(mismatch) for mismatch in mismatches]
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(
            f"threads: {summary.threads:,} in the source, {summary.threads_copied:,} copied into the store"
        )
        click.echo(f"  checkpoints copied: {summary.checkpoints:,}")
        click.echo(f"  pending writes copied: {summary.writes:,}")
        for reason, count in (+summary.skipped).items():
            click.echo(f"  skipped {count:,} {reason}")
        for thread_id, reason in summary.skipped_threads.items():
            click.echo(f"  skipped thread {thread_id!r}: {reason}")
        if mismatches is not None:
            click.echo(f"  verify: {'every thread matches the source' if not mismatches else 'differences:'}")
            for mismatch in mismatches:
                click.echo(f"    {mismatch}")
    if summary.skipped_threads or mismatches:
        sys.exit(EXIT_ERROR)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8420, show_default=True, type=click.IntRange(1, 65535))
def serve(host: str, port: int) -> None:
    """Serve /healthz, /metrics and the admin API (see threadkeep.server)."""
    from threadkeep.server import serve as run_server

    run_server(host, port)


if __name__ == "__main__":  # pragma: no cover
    main()

"""``threadkeep``: the command line. A thin adapter: every command calls a library function.

Exit codes: 0 success; 1 a threadkeep error (the message says what to do); 2 bad usage;
3 the store needs a reset before this version can use it; 4 no such thread.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from threadkeep.errors import CheckpointStoreFormatError, ThreadkeepError

EXIT_ERROR = 1
EXIT_NEEDS_RESET = 3
EXIT_NOT_FOUND = 4


class _Group(click.Group):
    """Turns threadkeep errors into one line on stderr and a meaningful exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CheckpointStoreFormatError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_NEEDS_RESET)
        except ThreadkeepError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(EXIT_ERROR)


@click.group(cls=_Group)
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


@main.group()
def threads() -> None:
    """Threads of the configured store, whoever owns them (operator commands)."""


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

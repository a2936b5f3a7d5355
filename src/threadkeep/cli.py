"""``threadkeep``: the command line. A thin adapter: every command calls a library function.

Exit codes: 0 success; 1 a threadkeep error (the message says what to do); 2 bad usage;
3 the store needs a reset before this version can use it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from threadkeep.errors import CheckpointStoreFormatError, ThreadkeepError

EXIT_ERROR = 1
EXIT_NEEDS_RESET = 3


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
    from threadkeep.demo import run_demo

    click.echo(f"Running {turns} turns of a scripted tool-calling agent (no network) ...")
    report = run_demo(turns)
    click.echo(f"\nstore: {report.provider} at {report.location}")
    click.echo(f"thread: {report.thread_id}, {len(report.history)} checkpoints, newest first\n")
    click.echo(f"  {'step':>4}  {'source':<7} {'msgs':>4}  last message")
    for row in report.history:
        click.echo(f"  {row.step:>4}  {row.source:<7} {row.messages:>4}  {row.last}")
    ratio = report.langgraph_bytes / max(report.threadkeep_bytes, 1)
    click.echo("\nstorage for this conversation (bytes of stored values):")
    click.echo(f"  threadkeep ({report.provider}):  {report.threadkeep_bytes:>12,}")
    click.echo(f"  LangGraph SqliteSaver:   {report.langgraph_bytes:>12,}  ({ratio:.1f}x more)")


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


if __name__ == "__main__":  # pragma: no cover
    main()

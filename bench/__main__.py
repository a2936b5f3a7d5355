"""``./dev bench SUITE [options]``: run a benchmark, or write the page and figures from its results.

Benchmarks (each prints its tables; ``--json PATH`` also writes the results, with the command
and the machine, ``bench.environment``):

- ``conversation [--runs N] [--turns 5,10,20,40]``: in-process stores;
- ``servers [--runs N] [--turns ...] [--conversations 32] [--conversation-turns 10,40] [--freeze-gc]``:
  Postgres and Redis (``--freeze-gc`` runs each throughput measurement after ``gc.freeze()``);
- ``tiered [--runs N] [--conversations 32] [--conversation-turns 10]`` (its one length);
- ``calls [--runs N] [--conversation-turns 10]`` (its one length);
- ``sweep [--runs N] [--threads 100000]``;
- ``startup [--runs N] [--conversation-turns 10]`` (its one length): opening a saver and its
  first load, each run in new processes (``--runs`` defaults to 15 here);
- ``ledger [--runs N] [--calls 300] [--ledger-turns 10] [--stores sqlite,postgres]``: what the
  tool-call ledger costs per tool call (``--runs`` defaults to 5 here).
- ``threads [--runs N] [--sizes 1000,10000,100000] [--stores sqlite,postgres,redis]``: a page
  of the thread listing from seeded stores of each size, on sqlite, postgres and redis
  (``--runs`` defaults to 15 here).
- ``resolver [--lookups 100000] [--lookup-threads 1000]``: the store reads the ownership
  resolver saves (exact counts, one run).

From the results files in ``--results`` (``bench/results``), without measuring anything:

- ``page [--check]``: rewrite the tables of docs/benchmarks.md (``--check``: exit 1 if stale);
- ``plot``: draw the figures into ``--images`` (``docs/img``), with matplotlib;
- ``env``: print this machine and the versions a run would record.

``--plot`` after any of them draws the figures too, once the run's results are written.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from bench import environment, figures, page
from bench.stored import RESULTS, RUN

MEASURING = (
    "conversation",
    "servers",
    "tiered",
    "sweep",
    "calls",
    "startup",
    "ledger",
    "threads",
    "resolver",
)
# Runs per measurement when --runs is not given.
RUNS = {"startup": 15, "ledger": 5, "threads": 15}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="./dev bench", description="threadkeep's benchmarks (docs/benchmarks.md)"
    )
    parser.add_argument(
        "suite", nargs="?", default="conversation", choices=[*MEASURING, "page", "plot", "env"]
    )
    parser.add_argument(
        "--runs", type=int, help="runs per measurement; the median is kept (default 3; startup: 15)"
    )
    parser.add_argument("--turns", default="5,10,20,40", help="conversation lengths K to measure")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument(
        "--conversations", type=int, default=32, help="servers, tiered: concurrent conversations"
    )
    parser.add_argument(
        "--conversation-turns", default="10,40", help="servers: lengths of the concurrent conversations"
    )
    parser.add_argument("--threads", type=int, default=100_000, help="sweep: expired threads to seed")
    parser.add_argument("--calls", type=int, default=300, help="ledger: tool calls in a row per run")
    parser.add_argument("--ledger-turns", type=int, default=10, help="ledger: turns of the agent per run")
    parser.add_argument(
        "--stores", help="ledger, threads: the stores to measure (ledger: sqlite,postgres; threads: all)"
    )
    parser.add_argument("--sizes", default="1000,10000,100000", help="threads: store sizes to seed")
    parser.add_argument("--lookups", type=int, default=100_000, help="resolver: owner lookups")
    parser.add_argument("--lookup-threads", type=int, default=1000, help="resolver: threads looked up")
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="servers: gc.freeze() before each throughput run, as an application may after it starts",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="page, plot: the results files' folder")
    parser.add_argument("--images", type=Path, default=figures.IMAGES, help="where --plot writes its PNGs")
    parser.add_argument("--plot", action="store_true", help="then draw the figures from --results")
    parser.add_argument("--check", action="store_true", help="page: exit 1 if docs/benchmarks.md is stale")
    args = parser.parse_args(argv)
    if args.runs is None:
        args.runs = RUNS.get(args.suite, 3)
    status = 0
    if args.suite == "page":
        status = page.main(check=args.check, folder=args.results)
    elif args.suite == "env":
        for key, value in environment.describe().items():
            print(f"{key:32}{value}")
    elif args.suite in MEASURING:
        results = measure(args)
        if args.json:
            run = {
                "command": "./dev bench " + shlex.join(_measuring(argv)),
                "args": _args(args),
                "environment": environment.describe(),
            }
            args.json.write_text(json.dumps({**results, RUN: run}, indent=2) + "\n")
    if args.plot or args.suite == "plot":
        for path in figures.draw(args.results, args.images):
            print(f"wrote {path}")
    return status


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark ``args.suite``; its results."""
    turns = tuple(int(k) for k in args.turns.split(","))
    lengths = tuple(int(n) for n in args.conversation_turns.split(","))
    if args.suite == "startup":
        from bench import startup

        return startup.main(runs=args.runs, turns=lengths[0])
    if args.suite == "ledger":
        from bench import ledger

        stores = tuple(name for name in (args.stores or "sqlite,postgres").split(",") if name)
        return ledger.main(runs=args.runs, calls=args.calls, turns=args.ledger_turns, stores=stores)
    if args.suite == "threads":
        from bench import threads

        sizes = tuple(int(n) for n in args.sizes.split(","))
        chosen = tuple(name for name in (args.stores or ",".join(threads.STORES)).split(",") if name)
        return threads.main(runs=args.runs, sizes=sizes, stores=chosen)
    if args.suite == "resolver":
        from bench import resolver

        return resolver.main(lookups=args.lookups, threads=args.lookup_threads)
    if args.suite == "calls":
        from bench import calls

        return calls.main(runs=args.runs, turns=lengths[0])
    if args.suite == "sweep":
        from bench import sweep

        return sweep.main(runs=args.runs, threads=args.threads)
    if args.suite == "tiered":
        from bench import tiered

        return tiered.main(runs=args.runs, conversations=args.conversations, turns=lengths[0])
    if args.suite == "servers":
        from bench import servers

        return servers.main(
            runs=args.runs,
            turns=turns,
            conversations=args.conversations,
            conversation_turns=lengths,
            freeze_gc=args.freeze_gc,
        )
    from bench import conversation

    return conversation.main(runs=args.runs, turns=turns)


def _measuring(argv: list[str]) -> list[str]:
    """``argv`` without the options that do not change what is measured (``--plot`` and its folders)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--results", "--images"):
            skip = True
        elif arg != "--plot" and not arg.startswith(("--results=", "--images=")):
            kept.append(arg)
    return kept


def _args(args: argparse.Namespace) -> dict[str, Any]:
    """The run's arguments, as they shape its results."""
    skip = {"json", "results", "images", "plot", "check"}
    return {key: value for key, value in vars(args).items() if key not in skip}


if __name__ == "__main__":
    sys.exit(main())

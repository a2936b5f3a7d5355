"""``./dev bench [conversation|servers|tiered|sweep|calls] [--runs N] [--turns 5,10,20,40] [--json PATH]``
(``servers`` also takes ``--conversations 32 --conversation-turns 10,40`` and ``--freeze-gc``,
which runs each throughput measurement after ``gc.freeze()``; ``tiered`` takes
``--conversations 32 --conversation-turns 10``, its one length; ``calls`` takes
``--conversation-turns 10``, its one length; ``sweep`` takes ``--threads 100000``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import calls, conversation, servers, sweep, tiered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev bench")
    parser.add_argument(
        "suite",
        nargs="?",
        default="conversation",
        choices=["conversation", "servers", "tiered", "sweep", "calls"],
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; the median is kept")
    parser.add_argument("--turns", default="5,10,20,40", help="conversation lengths K to measure")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--conversations", type=int, default=32, help="servers: concurrent conversations")
    parser.add_argument(
        "--conversation-turns", default="10,40", help="servers: lengths of the concurrent conversations"
    )
    parser.add_argument("--threads", type=int, default=100_000, help="sweep: expired threads to seed")
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="servers: gc.freeze() before each throughput run, as an application may after it starts",
    )
    args = parser.parse_args(argv)
    turns = tuple(int(k) for k in args.turns.split(","))
    if args.suite == "calls":
        results = calls.main(runs=args.runs, turns=int(args.conversation_turns.split(",")[0]))
    elif args.suite == "sweep":
        results = sweep.main(runs=args.runs, threads=args.threads)
    elif args.suite == "tiered":
        results = tiered.main(
            runs=args.runs, conversations=args.conversations, turns=int(args.conversation_turns.split(",")[0])
        )
    elif args.suite == "servers":
        results = servers.main(
            runs=args.runs,
            turns=turns,
            conversations=args.conversations,
            conversation_turns=tuple(int(n) for n in args.conversation_turns.split(",")),
            freeze_gc=args.freeze_gc,
        )
    else:
        results = conversation.main(runs=args.runs, turns=turns)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

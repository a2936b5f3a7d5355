"""Opening a saver in a new process, and its first load, next to LangGraph's ``AsyncPostgresSaver``.

    ./dev bench startup --runs 15

A fresh Postgres database holds one thread of ``--conversation-turns`` turns in each saver's
tables (threadkeep's ``postgres`` provider and LangGraph's ``AsyncPostgresSaver``), ANALYZEd
and flushed (``CHECKPOINT``): a database of its own, since the advisory lock threadkeep's open
takes is one per database, and other clients' opens in a shared one would be measured too.
Each run then starts one new Python process per saver (this interpreter, this ``sys.path``;
``bench.startup_child``), the savers taking turns to go first, which reports:

- ``import``: ``from threadkeep import aopen_checkpointer`` and ``import
  threadkeep.backends.postgres`` (which ``aopen_checkpointer`` imports on first use), against
  ``from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver``;
- ``open``: ``await aopen_checkpointer("postgres", conninfo)`` (the format gate on the loop's
  pool, whose connection the first read then uses), against
  ``await AsyncPostgresSaver.from_conn_string(conninfo).__aenter__()``;
- ``first_load``: the saver's first ``aget_tuple`` of the stored thread;
- ``open_first_load``: the two together, on one clock;
- ``second_load``: the same ``aget_tuple`` again, on the connection the first one used: the
  first load less what a new server process pays once (its catalog caches, its first plan).

A third saver, ``threadkeep-postgres-ungated``, is threadkeep's without the format gate (built
on the provider's ``admin`` open, as ``threadkeep store`` opens a store; its pool opens at the
first load): what the gate costs, and the least any open of threadkeep's would.

The medians over the runs are kept (milliseconds). One process per saver runs first, not
counted, so that compiled bytecode is written and the files are in the page cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
from typing import Any

from bench import page
from bench.servers import conversation, flush, fresh_database, open_store_in

SAVERS = ("threadkeep-postgres", "threadkeep-postgres-ungated", "langgraph-postgres")
MEASURES = {
    "import": "import",
    "open": "open",
    "first_load": "first load",
    "open_first_load": "open + first load",
    "second_load": "second load",
}
THREAD = "startup"


def main(runs: int = 15, turns: int = 10) -> dict[str, Any]:
    return asyncio.run(_main(runs, turns))


async def _main(runs: int, turns: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in SAVERS}
    async with fresh_database() as (schema, conninfo):
        for name in ("threadkeep-postgres", "langgraph-postgres"):  # the ungated saver shares the first's
            async with open_store_in(name, schema, conninfo) as store:
                await conversation(store.saver, THREAD, turns)
                await store.analyze()
        await flush()
        env = child_environment()
        for name in SAVERS:  # the warm-up, not counted
            await new_process(name, conninfo, env)
        for run in range(runs):
            for name in SAVERS[run % len(SAVERS) :] + SAVERS[: run % len(SAVERS)]:
                samples[name].append(await new_process(name, conninfo, env))
    results = {
        name: {key: statistics.median(s[key] for s in of) * 1000 for key in MEASURES}
        for name, of in samples.items()
    }
    report(results, samples, turns)
    return results


def child_environment() -> dict[str, str]:
    """This process's environment, with a ``PYTHONPATH`` by which a new process finds the
    modules this one finds, in the same order."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.abspath(entry) for entry in sys.path)}


async def new_process(name: str, conninfo: str, env: dict[str, str]) -> dict[str, float]:
    """One run of ``bench.startup_child`` in a new process: its figures, in seconds."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.startup_child",
        name,
        conninfo,
        THREAD,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"{name}: the new process failed ({child.returncode}):\n{err.decode()}")
    figures: dict[str, float] = json.loads(out)
    return figures


def report(results: dict[str, Any], samples: dict[str, list[dict[str, float]]], turns: int) -> None:
    ours, theirs = results["threadkeep-postgres"], results["langgraph-postgres"]
    runs = len(samples["threadkeep-postgres"])
    print(f"\nOpening a saver in a new process, then its first load of a {turns}-turn thread")
    print(f"(ms; median of {runs} processes each, min-max in brackets)")
    print(f"{'':20}{'threadkeep postgres':>28}{'without the gate':>28}{'AsyncPostgresSaver':>28}  threadkeep")
    for key, measure in MEASURES.items():
        cells = [f"{results[name][key]:.2f} ({_spread(samples[name], key)})".rjust(28) for name in SAVERS]
        print(f"{measure:20}{''.join(cells)}  {page.ratio(ours[key], theirs[key], 'time')}")


def _spread(samples: list[dict[str, float]], key: str) -> str:
    values = [sample[key] * 1000 for sample in samples]
    return f"{min(values):.2f}-{max(values):.2f}"

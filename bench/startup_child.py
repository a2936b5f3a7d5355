"""One run of the ``startup`` benchmark, in a process of its own (``bench.startup`` starts it).

    python -m bench.startup_child SAVER CONNINFO THREAD_ID

Imports the saver's modules, opens the saver on ``CONNINFO``, reads the newest checkpoint of
``THREAD_ID`` twice, and prints one JSON object: seconds taken by ``import``, ``open``,
``first_load``, ``open_first_load`` (the two together, on one clock) and ``second_load`` (the
same read again, on the connection the first one warmed). Only the
standard library is imported before the clock starts, asyncio included: the saver is opened
and read inside a running event loop, as an application would.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

Opened = tuple[Any, Callable[[], Awaitable[Any]]]  # the saver, and how to close it


async def threadkeep_postgres(conninfo: str) -> tuple[float, Opened]:
    """threadkeep's ``postgres`` provider: the import time, then the saver as
    ``aopen_checkpointer`` builds it in the running loop."""
    from threadkeep import aopen_checkpointer

    # aopen_checkpointer imports the provider's backend on first use: counted as an import.
    importlib.import_module("threadkeep.backends.postgres")
    imported = time.perf_counter()
    saver = await aopen_checkpointer("postgres", conninfo)
    return imported, (saver, saver.aclose)


async def threadkeep_postgres_ungated(conninfo: str) -> tuple[float, Opened]:
    """threadkeep's ``postgres`` provider without its format gate: the saver built on the
    store as ``threadkeep store`` opens it (the provider's ``admin`` open), to show what the
    gate costs. Its pool opens at the first load."""
    from threadkeep import Settings
    from threadkeep.providers import SaverOptions, facts_of, registration, saver_kwargs
    from threadkeep.saver import ThreadkeepSaver

    importlib.import_module("threadkeep.backends.postgres")
    imported = time.perf_counter()
    settings = Settings.from_env().with_values(provider="postgres", conn_string=conninfo)
    backend = registration("postgres").admin(settings)
    saver = ThreadkeepSaver(backend, facts_of("postgres"), **saver_kwargs(settings, SaverOptions()))
    return imported, (saver, saver.aclose)


async def langgraph_postgres(conninfo: str) -> tuple[float, Opened]:
    """LangGraph's ``AsyncPostgresSaver``, entered from ``from_conn_string``."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    imported = time.perf_counter()
    context = AsyncPostgresSaver.from_conn_string(conninfo)
    saver = await context.__aenter__()
    return imported, (saver, lambda: context.__aexit__(None, None, None))


SAVERS: dict[str, Callable[[str], Awaitable[tuple[float, Opened]]]] = {
    "threadkeep-postgres": threadkeep_postgres,
    "threadkeep-postgres-ungated": threadkeep_postgres_ungated,
    "langgraph-postgres": langgraph_postgres,
}


async def measure(name: str, conninfo: str, thread_id: str) -> dict[str, float]:
    start = time.perf_counter()
    imported, (saver, close) = await SAVERS[name](conninfo)
    opened = time.perf_counter()
    state = await saver.aget_tuple({"configurable": {"thread_id": thread_id}})
    loaded = time.perf_counter()
    again = await saver.aget_tuple({"configurable": {"thread_id": thread_id}})
    reloaded = time.perf_counter()
    await close()
    if state is None or again is None:
        raise SystemExit(f"{name}: no checkpoint of thread {thread_id!r} in the store")
    return {
        "import": imported - start,
        "open": opened - imported,
        "first_load": loaded - opened,
        "open_first_load": loaded - imported,
        "second_load": reloaded - loaded,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(*sys.argv[1:4]))))

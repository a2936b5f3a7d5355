"""A worker process for the turn crash tests: runs or resumes one user's turn on a store.

    python -m tests.turn_workers <job> <json options>

Jobs:
- ``run``: run a turn of :func:`crash_agent` for ``user``. Its ``slow`` tool writes the file
  ``marker`` and waits for ever (the test kills the process with SIGKILL there).
- ``resume``: resume the user's last turn (``slow`` now returns at once); print the result
  as JSON: ``response``, ``resumed``, ``restarted``, ``thread_id``.

Every tool run appends a line ``<tool> <pid>`` to the file ``runs``, so the test sees what
ran in which process. Options: ``provider``, ``conn``, ``store`` (more ``open_checkpointer``
options), ``cache_url``, ``state_path``, ``user``, ``marker``, ``runs``, ``ledger`` (wrap the
tools with ``threadkeep.replay_safe``), ``processor`` (the fake payment processor's URL),
``api`` (``sync`` or ``async``: the TurnManager API the worker calls).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from tests.turn_agents import ScriptedChatModel, agent_graph, answer, call, calls
from threadkeep import Settings, TurnManager, current_idempotency_key, open_checkpointer, replay_safe


def _log(options: dict[str, Any], line: str) -> None:
    with open(options["runs"], "a") as out:
        out.write(f"{line} {os.getpid()}\n")
        out.flush()
        os.fsync(out.fileno())


def crash_agent(options: dict[str, Any], *, block: bool) -> Any:
    """``lookup``, then ``slow`` (blocking when ``block``), then an answer quoting both."""

    @tool
    def lookup(query: str) -> str:
        """Look the query up."""
        _log(options, "lookup")
        return f"found {query}"

    @replay_safe
    def charge_card(amount: int) -> str:
        """Ask the payment processor to charge ``amount``, under the call's idempotency key."""
        _log(options, "charge_card")
        request = urllib.request.Request(
            options["processor"],
            data=json.dumps({"amount": amount}).encode(),
            headers={"Idempotency-Key": current_idempotency_key()},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            return str(reply.read().decode())

    @tool
    def slow(amount: int) -> str:
        """Charge ``amount``, slowly."""
        _log(options, "slow")
        receipt = charge_card(amount) if options.get("processor") else None
        if block:  # the charge returned (and is in the ledger); the step's checkpoint is not
            Path(options["marker"]).write_text("in slow")
            while True:
                time.sleep(60)
        return f"charged {amount}" + (f": {receipt}" if receipt else "")

    def decide(messages: list[Any]) -> AIMessage:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return calls(call("lookup", "look-1", query="invoice 7"))
        if len(results) == 1:
            return calls(call("slow", "pay-1", amount=500))
        return answer(" / ".join(str(m.content) for m in results))

    return agent_graph(ScriptedChatModel(script=[decide]), [lookup, slow])


def main(job: str, options: dict[str, Any]) -> int:
    settings = Settings(
        resume_enabled=True,
        resume_state_path=options["state_path"],
        **({"cache_url": options["cache_url"]} if options.get("cache_url") else {}),
    )
    with open_checkpointer(
        options["provider"], options["conn"], settings=settings, **options["store"]
    ) as saver:
        manager = TurnManager(crash_agent(options, block=job == "run"), saver, settings=settings)
        asynchronous = options.get("api") == "async"
        if job == "run":
            if asynchronous:
                asyncio.run(manager.arun_turn(options["user"], "pay invoice 7"))
            else:
                manager.run_turn(options["user"], "pay invoice 7")
            return 0
        if asynchronous:
            result = asyncio.run(manager.aresume_last_turn(options["user"]))
        else:
            result = manager.resume_last_turn(options["user"])
        print(
            json.dumps(
                {
                    "response": result.response,
                    "resumed": result.resumed,
                    "restarted": result.restarted,
                    "thread_id": result.thread_id,
                }
            )
        )
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))

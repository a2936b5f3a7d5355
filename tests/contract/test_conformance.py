"""SPEC P3: every provider passes every clause of langgraph-checkpoint-conformance 0.0.2."""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.conformance import checkpointer_test, validate

from tests.conftest import CONFORMANCE_REPORTS
from tests.providers import Opener, ProviderCase

ALL_CLAUSES = 81  # 58 base + 23 extended (delete_for_runs, copy_thread, prune)


async def test_p3_passes_every_conformance_clause(provider: ProviderCase, open_saver: Opener) -> None:
    @checkpointer_test(name=f"threadkeep-{provider.name}")
    async def registered() -> AsyncIterator[Any]:
        yield open_saver(fresh=True)

    report = await validate(registered)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report.print_report()
    results = report.to_dict()
    passed = sum(r.get("tests_passed", 0) for r in results["results"].values())
    CONFORMANCE_REPORTS.append(printed.getvalue() + f"    clauses passed: {passed}/{ALL_CLAUSES}\n")
    failures = [f for r in report.results.values() for f in r.failures]
    assert failures == []
    assert report.passed_all()
    assert passed == ALL_CLAUSES

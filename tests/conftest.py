"""Fixtures every test shares: a fresh store per provider, and the conformance reports."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.providers import (
    CASES,
    SCHEMAS,
    SHARED_STORE,
    Opener,
    ProviderCase,
    drop_postgres_schemas,
    drop_redis_prefixes,
    require,
)

CONFORMANCE_REPORTS: list[str] = []
_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember whether the test itself passed (the provider fixture reuses its store then)."""
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that takes ``provider`` (or a saver) on every provider, or on those its
    ``@pytest.mark.providers(...)`` names (for what is truly specific to some stores)."""
    if "provider" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("providers")
        names = list(marker.args) if marker else list(CASES)
        metafunc.parametrize("provider", [CASES[n] for n in names], ids=names, indirect=True)


_PROBED: dict[str, str | None] = {}


@pytest.fixture
def provider(request: pytest.FixtureRequest) -> ProviderCase:
    case: ProviderCase = request.param
    if case.name not in _PROBED:
        _PROBED[case.name] = case.probe()
    require(case, _PROBED[case.name])
    return case


@pytest.fixture
def open_saver(provider: ProviderCase, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Opener]:
    """Open savers on one fresh store of the provider; all are closed after the test.

    Every call opens a new saver instance on the same store (for providers that can share
    one); ``fresh=True`` opens a new, separate store.
    """
    opened: list[Any] = []
    closed = False
    try:
        store = provider.open(tmp_path, uuid.uuid4().hex)

        def open_(*, fresh: bool = False, **options: Any) -> Any:
            opener = provider.open(tmp_path, uuid.uuid4().hex) if fresh else store
            saver = opener(**options)
            opened.append(saver)
            return saver

        yield open_
        for saver in opened:
            saver.close()
        closed = True
    finally:
        # The Postgres schemas of a test that passed are emptied for others (tests/providers.py).
        SCHEMAS.give_back(reusable=closed and request.node.stash.get(_PASSED, False))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    drop_postgres_schemas()
    drop_redis_prefixes()


@pytest.fixture
def saver(open_saver: Opener) -> Any:
    """One saver on a fresh store of the provider under test."""
    return open_saver()


@pytest.fixture
def shares_store(provider: ProviderCase) -> bool:
    return provider.name in SHARED_STORE


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if CONFORMANCE_REPORTS:
        terminalreporter.section("langgraph-checkpoint-conformance 0.0.2")
        for report in CONFORMANCE_REPORTS:
            terminalreporter.write_line(report)

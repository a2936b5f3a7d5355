"""Fixtures the behaviour tests share: which API drives a graph, and its durability."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.graphs import Driver


@pytest.fixture(params=["sync", "async"])
def driver(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """Runs a graph through LangGraph's sync or async API."""
    driver = Driver(request.param)
    yield driver
    driver.close()


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    """``sync`` or ``async``, for tests that call the graph's API themselves."""
    return str(request.param)


@pytest.fixture(params=["sync", "async", "exit"])
def durability(request: pytest.FixtureRequest) -> str:
    """LangGraph's durability modes."""
    return str(request.param)

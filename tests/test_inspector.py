"""The inspector page (issue 38 item 6) in a real headless browser: Debian's ``chromium``
driven by Playwright for Python, against ``threadkeep serve``'s app run by uvicorn on a free
port, on sqlite and postgres.

The store is seeded by a small LangGraph agent that calls a tool. Three keys: ``alice`` and
``bob`` (users) and ``ops`` (admin). Every test saves a screenshot under
``test-artifacts/inspector/`` (CI keeps the folder as an artifact).

Without ``/usr/bin/chromium`` (``apt-get install chromium``) or Playwright the tests are skipped
locally and fail under ``CI=true``. ``THREADKEEP_DOCS_SCREENSHOT=1`` also rewrites
``docs/img/inspector.png`` from the conversation test.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tests.providers import Opener
from threadkeep import Settings
from threadkeep.metrics import Metrics
from threadkeep.server import create_app

pytestmark = pytest.mark.providers("sqlite", "postgres")

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "inspector"
CHROMIUM = Path("/usr/bin/chromium")
ALICE, BOB, ADMIN = "k-alice", "k-bob", "k-ops"
KEYS = f"{ALICE}:alice:user,{BOB}:bob:user,{ADMIN}:ops:admin"


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: the browser tests must run)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        _unavailable(f"no {CHROMIUM}: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        # Debian's browser; Playwright downloads none.
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


# --- the store: a small agent that calls a tool ------------------------------------------------


@tool
def weather(city: str) -> str:
    """The weather in ``city``."""
    return f"sunny in {city}"


def agent(state: MessagesState) -> dict[str, Any]:
    """A model stand-in: a question gets a tool call, a tool's result gets an answer."""
    messages = state["messages"]
    last, n = messages[-1], len(messages)
    if isinstance(last, HumanMessage):
        city = str(last.content).split()[-1]
        call = {"name": "weather", "args": {"city": city}, "id": f"call-{n}", "type": "tool_call"}
        return {"messages": [AIMessage("", id=f"ai-{n}", tool_calls=[call])]}
    return {"messages": [AIMessage(f"It is {last.content}.", id=f"ai-{n}")]}


def seed(opener: Opener) -> None:
    """alice: ``alice-trip`` (two questions, finished) and ``alice-lunch`` (waiting);
    bob: ``bob-secret``."""
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([weather]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    saver = opener()
    graph = builder.compile(checkpointer=saver)
    runs = [
        ("alice", "alice-trip", "travel", "weather in Paris"),
        ("alice", "alice-trip", "travel", "weather in Oslo"),
        ("alice", "alice-lunch", "food", "weather in Lyon"),
        ("bob", "bob-secret", "travel", "weather in Bergen"),
    ]
    for user, thread, topic, question in runs:
        config: Any = {"configurable": {"thread_id": thread, "user_id": user}, "metadata": {"topic": topic}}
        graph.invoke({"messages": [HumanMessage(question, id=f"h-{thread}-{question.split()[-1]}")]}, config)
    saver.mark_finished(["alice-trip"], config={"configurable": {"user_id": "alice"}})


@dataclass(frozen=True)
class Served:
    url: str


@pytest.fixture
def served(open_saver: Opener) -> Iterator[Served]:
    """``threadkeep serve``'s app on the seeded store, served by uvicorn on a free port."""
    import uvicorn

    seed(open_saver)
    app = create_app(Settings(api_keys=KEYS), saver=open_saver(), metrics=Metrics())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped before it served"
        assert time.monotonic() < deadline, "uvicorn did not start within 60 s"
        time.sleep(0.05)
    try:
        yield Served(f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture
def page(browser: Any, served: Served, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser tab on the page; every request it makes is recorded; a screenshot of
    where it ends is saved for the test."""
    context = browser.new_context(viewport={"width": 1200, "height": 900}, base_url=served.url)
    tab = context.new_page()
    tab.set_default_timeout(30_000)
    tab.requested = []  # every URL the page asked for
    tab.on("request", lambda r: tab.requested.append(r.url))
    tab.errors = []
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    try:
        yield tab
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]+", "-", request.node.name).strip("-")
        tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        context.close()


def sign_in(page: Any, key: str, where: str = "/") -> None:
    page.goto(where)
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Open").click()
    page.get_by_test_id("whoami").wait_for()


def listed(page: Any) -> list[str]:
    """The thread ids of the listing, once it has loaded."""
    page.get_by_test_id("threads-count").wait_for()
    return sorted(page.locator("tr[data-thread]").evaluate_all("rows => rows.map(r => r.dataset.thread)"))


# --- the tests ---------------------------------------------------------------------------------


def test_the_page_and_its_files_need_no_key_and_the_session_names_the_keys_user_and_role() -> None:
    from starlette.testclient import TestClient

    with TestClient(create_app(Settings(provider="memory", api_keys=KEYS), metrics=Metrics())) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert '<script src="/inspector/app.js"' in page.text
        for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
            served = http.get(f"/inspector/{name}")
            assert served.status_code == 200
            assert served.headers["content-type"].startswith(kind)
        assert http.get("/inspector/__init__.py").status_code == 404  # only the page's files
        assert "innerHTML" not in http.get("/inspector/app.js").text  # data reaches the page as text
        assert http.get("/inspector/session").status_code == 401
        wrong = http.get("/inspector/session", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong.json()["code"] == "AUTH_001"
        for key, expected in (
            (ALICE, {"user": "alice", "role": "user"}),
            (ADMIN, {"user": "ops", "role": "admin"}),
        ):
            assert (
                http.get("/inspector/session", headers={"Authorization": f"Bearer {key}"}).json() == expected
            )
        schema = http.get("/openapi.json").json()
        assert not [path for path in schema["paths"] if path == "/" or path.startswith("/inspector")]


def test_page_loads_lists_a_users_threads_and_loads_nothing_from_elsewhere(page: Any, served: Served) -> None:
    sign_in(page, ALICE)
    assert page.get_by_test_id("whoami").text_content() == "alice (user)"
    assert listed(page) == ["alice-lunch", "alice-trip"]
    row = page.locator('tr[data-thread="alice-trip"]')
    assert "finished" in row.text_content()
    assert "travel" in row.text_content()
    assert all(url.startswith(served.url + "/") for url in page.requested), page.requested
    assert page.errors == []


def test_the_status_filter_narrows_the_list(page: Any) -> None:
    sign_in(page, ALICE)
    assert listed(page) == ["alice-lunch", "alice-trip"]
    page.locator('button[data-status="finished"]').click()
    page.wait_for_url(re.compile(r"status=finished"))
    assert listed(page) == ["alice-trip"]
    page.locator('button[data-status="waiting"]').click()
    page.wait_for_url(re.compile(r"status=waiting"))
    assert listed(page) == ["alice-lunch"]
    assert page.locator('button[data-status="waiting"]').get_attribute("aria-pressed") == "true"


def test_search_narrows_by_thread_id_and_by_metadata(page: Any) -> None:
    sign_in(page, ALICE)
    assert listed(page) == ["alice-lunch", "alice-trip"]
    page.get_by_label("Search threads").fill("lunch")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"q=lunch"))
    assert listed(page) == ["alice-lunch"]
    page.get_by_label("Search threads").fill("topic=travel")  # a metadata filter in the store
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"q=topic"))
    assert listed(page) == ["alice-trip"]


def test_opening_a_thread_shows_its_conversation_with_tool_calls_folded(page: Any) -> None:
    sign_in(page, ALICE)
    listed(page)
    page.get_by_role("link", name="alice-trip").click()
    chat = page.get_by_test_id("chat")
    chat.wait_for()
    humans = chat.locator(".msg.human .text").all_text_contents()
    assert humans == ["weather in Paris", "weather in Oslo"]
    answers = chat.locator(".msg.ai .text").all_text_contents()
    assert answers == ["It is sunny in Paris.", "It is sunny in Oslo."]
    calls = chat.locator("details.call")
    assert calls.count() == 2
    assert not calls.first.evaluate("d => d.open")  # folded until asked
    calls.first.locator("summary").click()
    assert "sunny in Paris" in calls.first.text_content()
    assert chat.locator(".msg.tool").count() == 0  # each result is folded into its call
    if os.environ.get("THREADKEEP_DOCS_SCREENSHOT") == "1":
        page.screenshot(path=str(ROOT / "docs" / "img" / "inspector.png"), full_page=True)


def test_history_and_diff_show_the_message_a_checkpoint_added(page: Any) -> None:
    sign_in(page, ALICE, "/#/thread/alice-trip/history")
    timeline = page.get_by_test_id("timeline")
    page.get_by_test_id("history-count").wait_for()
    items = timeline.locator(":scope > li")
    assert items.count() >= 8  # two runs of input, agent, tools, agent
    assert items.first.locator(".src").text_content() == "loop"
    # the newest checkpoint against the one before it: the agent's last answer
    items.nth(1).locator('input[type="checkbox"]').check()
    items.nth(0).locator('input[type="checkbox"]').check()
    page.get_by_role("button", name="Diff the two checked").click()
    added = page.get_by_test_id("diff-messages")
    added.wait_for()
    assert added.locator(".msg.added .text").all_text_contents() == ["It is sunny in Oslo."]
    assert page.locator('tr[data-channel="messages"]').text_content().count("changed") == 1


def test_a_thousand_checkpoints_load_a_page_at_a_time_as_the_timeline_scrolls(
    page: Any, open_saver: Opener
) -> None:
    saver = open_saver()
    config: Any = {"configurable": {"thread_id": "alice-long", "checkpoint_ns": "", "user_id": "alice"}}
    for step in range(1000):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"count": step}
        checkpoint["channel_versions"] = {"count": step + 1}
        stored = saver.put(
            config, checkpoint, {"source": "loop", "step": step, "parents": {}}, {"count": step + 1}
        )
        config = {"configurable": {**stored["configurable"], "user_id": "alice"}}
    sign_in(page, ALICE, "/#/thread/alice-long/history")
    count = page.get_by_test_id("history-count")
    count.wait_for()
    items = page.get_by_test_id("timeline").locator(":scope > li")
    assert items.count() == 50
    assert items.first.locator(".step").text_content() == "999"
    asked = [url for url in page.requested if "/history" in url]
    assert len(asked) == 1
    page.get_by_role("button", name="Load older").scroll_into_view_if_needed()  # the next page, on view
    page.wait_for_function("() => document.querySelectorAll('[data-testid=timeline] > li').length >= 100")
    assert items.nth(99).locator(".step").text_content() == "900"
    assert len([url for url in page.requested if "/history" in url]) < 20  # not the whole history


def test_the_retention_panel_shows_the_status_the_due_time_and_marks_a_thread_finished(page: Any) -> None:
    sign_in(page, ALICE, "/#/thread/alice-lunch/retention")
    panel = page.get_by_test_id("retention")
    panel.wait_for()
    assert "waiting" in panel.text_content()
    assert "waiting horizon" in page.get_by_test_id("due").text_content()
    assert page.get_by_test_id("spared").text_content() == "deletes it (no park or interrupt spares it)"
    page.get_by_test_id("mark-finished").click()
    page.get_by_test_id("due").get_by_text("finished horizon").wait_for()
    assert page.get_by_test_id("mark-finished").count() == 0
    page.goto("/#/?status=finished")
    assert listed(page) == ["alice-lunch", "alice-trip"]


def test_another_users_thread_is_not_reachable(page: Any) -> None:
    sign_in(page, ALICE)
    assert "bob-secret" not in listed(page)
    page.goto("/#/thread/bob-secret")
    page.get_by_test_id("not-found").wait_for()
    assert page.get_by_test_id("chat").count() == 0
    assert "Bergen" not in page.content()
    page.goto("/#/thread/bob-secret/history")
    page.get_by_test_id("not-found").wait_for()


def test_a_user_has_no_sweep_and_an_admin_runs_a_dry_run(page: Any) -> None:
    sign_in(page, ALICE)
    listed(page)
    assert page.get_by_test_id("sweep-link").count() == 0
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, ADMIN)
    assert listed(page) == ["alice-lunch", "alice-trip", "bob-secret"]
    page.get_by_test_id("sweep-link").click()
    page.get_by_test_id("sweep-run").click()
    result = page.get_by_test_id("sweep-result")
    result.get_by_text("Would delete 0 threads").wait_for()
    assert "dry_run" in result.text_content()

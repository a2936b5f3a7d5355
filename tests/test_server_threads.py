"""The threads API of ``threadkeep serve`` (SPEC SV1), in process, on every provider.

Keys: ``k-admin`` (ops, admin), ``k-alice`` and ``k-bob`` (users). Every thread route is
asked with no key (401), for another user's thread (404, and the thread is untouched), for a
missing thread (404) and with a bad cursor or parameter (422).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from starlette.routing import Route
from starlette.testclient import TestClient

from tests.providers import Opener
from threadkeep import Settings, ThreadkeepSaver, operator_scope, user_scope
from threadkeep.server import create_app, openapi

pytestmark = pytest.mark.providers("sqlite", "postgres", "memory", "redis", "tiered")

ADMIN, ALICE, BOB = "k-admin", "k-alice", "k-bob"
KEYS = f"{ADMIN}:ops:admin,{ALICE}:alice:user,{BOB}:bob:user"


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    note: str


def chat_graph(saver: ThreadkeepSaver) -> Any:
    def reply(state: Chat) -> dict[str, Any]:
        turn = len(state["messages"]) // 2 + 1
        return {"messages": [AIMessage(f"reply {turn}", id=f"ai-{turn}")], "note": f"turn {turn}"}

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


def talk(saver: ThreadkeepSaver, thread_id: str, user: str, turns: int = 1) -> None:
    graph = chat_graph(saver)
    config = {"configurable": {"thread_id": thread_id, "user_id": user}}
    for turn in range(turns):
        graph.invoke({"messages": [HumanMessage(f"hello {turn}", id=f"{thread_id}-h{turn}")]}, config)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def saver(open_saver: Opener) -> ThreadkeepSaver:
    saver: ThreadkeepSaver = open_saver()
    talk(saver, "a1", "alice", turns=2)
    talk(saver, "b1", "bob")
    return saver


@pytest.fixture
def client(saver: ThreadkeepSaver) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(api_keys=KEYS), saver=saver)) as http:
        yield http


def checkpoint_ids(saver: ThreadkeepSaver, thread_id: str) -> list[str]:
    with operator_scope():
        return [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": thread_id}})]


def thread_routes(thread_id: str, a: str = "x", b: str = "y") -> list[tuple[str, str]]:
    """Every route that names a thread, as (method, url)."""
    base = f"/api/threads/{thread_id}"
    return [
        ("GET", f"{base}/state"),
        ("GET", f"{base}/history"),
        ("GET", f"{base}/checkpoints/{a}"),
        ("GET", f"{base}/diff?a={a}&b={b}"),
        ("GET", f"{base}/retention"),
        ("POST", f"{base}/finished"),
        ("DELETE", base),
    ]


# --- refusals ------------------------------------------------------------------------------------


def test_sv1_every_api_route_refuses_a_request_without_a_known_key(client: TestClient) -> None:
    for method, url in [("GET", "/api/threads"), *thread_routes("a1")]:
        for headers in ({}, auth("nope"), {"Authorization": "Basic k-admin"}):
            response = client.request(method, url, headers=headers)
            assert response.status_code == 401, (method, url, headers)
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["code"] == "AUTH_001"
            assert "Authorization: Bearer" in response.json()["message"]


def test_sv1_another_users_thread_is_not_found_on_every_route(
    client: TestClient, saver: ThreadkeepSaver
) -> None:
    ids = checkpoint_ids(saver, "a1")
    for method, url in thread_routes("a1", ids[0], ids[-1]):
        response = client.request(method, url, headers=auth(BOB))
        assert response.status_code == 404, (method, url, response.text)
        body = response.json()
        assert body["code"] == "THREAD_NOT_FOUND_001"
        assert "a1" in body["message"]
        assert "alice" not in response.text  # the owner is not revealed
    # nothing changed: alice's thread is whole, and not marked finished
    assert checkpoint_ids(saver, "a1") == ids
    retention = client.get("/api/threads/a1/retention", headers=auth(ALICE)).json()
    assert retention["status"] == "waiting"
    assert client.get("/api/threads/a1/state", headers=auth(ALICE)).status_code == 200


def test_sv1_a_missing_thread_is_not_found_on_every_route(client: TestClient) -> None:
    for key in (ALICE, ADMIN):
        for method, url in thread_routes("nobody"):
            response = client.request(method, url, headers=auth(key))
            assert response.status_code == 404, (method, url, response.text)
            assert response.json()["error"] == "ThreadNotFoundError"


def test_sv1_a_missing_checkpoint_of_an_own_thread_is_not_found(client: TestClient) -> None:
    response = client.get(
        "/api/threads/a1/checkpoints/1f000000-0000-6000-8000-000000000000", headers=auth(ALICE)
    )
    assert response.status_code == 404
    assert response.json()["context"]["checkpoint_id"] == "1f000000-0000-6000-8000-000000000000"


@pytest.mark.parametrize(
    "url",
    [
        "/api/threads?cursor=not-a-cursor",
        "/api/threads?status=sleeping",
        "/api/threads?limit=0",
        "/api/threads?limit=many",
        "/api/threads?written_after=yesterday",
        "/api/threads?metadata=[1]",
        "/api/threads?metadata={oops",
        "/api/threads/a1/history?cursor=not-a-checkpoint",
        "/api/threads/a1/history?cursor=1f000000-0000-6000-8000-000000000000",
        "/api/threads/a1/history?limit=0",
        "/api/threads/a1/diff",
        "/api/threads/a1/diff?a=only-one",
    ],
)
def test_sv1_a_bad_cursor_or_parameter_is_refused_with_422(client: TestClient, url: str) -> None:
    response = client.get(url, headers=auth(ALICE))
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"error", "code", "message", "context"}
    assert ":" in body["message"]  # names what was wrong, then what to do


def test_sv1_a_user_may_not_list_another_users_threads(client: TestClient) -> None:
    refused = client.get("/api/threads?user=bob", headers=auth(ALICE))
    assert refused.status_code == 403
    assert refused.json()["code"] == "AUTH_002"
    own = client.get("/api/threads?user=alice", headers=auth(ALICE))
    assert own.status_code == 200
    assert [t["thread_id"] for t in own.json()["threads"]] == ["a1"]


def test_sv1_admin_only_routes_refuse_a_user_key(client: TestClient) -> None:
    refused = client.post("/api/checkpoints/sweep?dry_run=true", headers=auth(ALICE))
    assert refused.status_code == 403
    assert "alice" in refused.json()["message"]


# --- listing -------------------------------------------------------------------------------------


def test_sv1_a_user_lists_their_own_threads_and_an_admin_everyones(client: TestClient) -> None:
    alice = client.get("/api/threads", headers=auth(ALICE)).json()
    assert [(t["thread_id"], t["owner"], t["status"]) for t in alice["threads"]] == [
        ("a1", "alice", "waiting")
    ]
    assert alice["next_cursor"] is None
    everyone = client.get("/api/threads", headers=auth(ADMIN)).json()
    assert {t["thread_id"] for t in everyone["threads"]} == {"a1", "b1"}
    bobs = client.get("/api/threads?user=bob", headers=auth(ADMIN)).json()
    assert [t["thread_id"] for t in bobs["threads"]] == ["b1"]


def test_sv1_paging_through_every_thread_by_cursor(client: TestClient, saver: ThreadkeepSaver) -> None:
    for n in range(7):
        talk(saver, f"p{n}", "carol")
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        url = "/api/threads?user=carol&limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(url, headers=auth(ADMIN)).json()
        seen += [t["thread_id"] for t in page["threads"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == [f"p{n}" for n in range(7)]
    assert len(seen) == 7  # no thread twice
    assert pages == 3
    assert seen[0] == "p6"  # newest write first


def test_sv1_listing_filters_by_status_and_write_time(client: TestClient) -> None:
    assert client.post("/api/threads/a1/finished", headers=auth(ALICE)).status_code == 200
    finished = client.get("/api/threads?status=finished", headers=auth(ADMIN)).json()
    assert [t["thread_id"] for t in finished["threads"]] == ["a1"]
    waiting = client.get("/api/threads?status=waiting", headers=auth(ADMIN)).json()
    assert [t["thread_id"] for t in waiting["threads"]] == ["b1"]
    later = client.get(f"/api/threads?written_after={time.time() + 60}", headers=auth(ADMIN)).json()
    assert later["threads"] == []
    iso = client.get("/api/threads?written_before=2000-01-01T00:00:00Z", headers=auth(ADMIN)).json()
    assert iso["threads"] == []
    loop = client.get("/api/threads", params={"metadata": '{"source": "loop"}'}, headers=auth(ADMIN)).json()
    assert {t["thread_id"] for t in loop["threads"]} == {"a1", "b1"}
    other = client.get("/api/threads", params={"metadata": '{"source": "fork"}'}, headers=auth(ADMIN)).json()
    assert other["threads"] == []


# --- one thread ----------------------------------------------------------------------------------


def test_sv1_state_shows_the_newest_checkpoint_with_its_messages(
    client: TestClient, saver: ThreadkeepSaver
) -> None:
    response = client.get("/api/threads/a1/state", headers=auth(ALICE))
    assert response.status_code == 200
    state = response.json()
    assert state["thread_id"] == "a1"
    assert state["checkpoint_id"] == checkpoint_ids(saver, "a1")[0]
    assert state["values"] == {"note": "turn 2"}
    assert [(m["type"], m["content"]) for m in state["messages"]] == [
        ("human", "hello 0"),
        ("ai", "reply 1"),
        ("human", "hello 1"),
        ("ai", "reply 2"),
    ]
    assert state["next"] == []
    # the admin sees it too
    assert client.get("/api/threads/a1/state", headers=auth(ADMIN)).json() == state


def test_sv1_history_pages_through_every_checkpoint(client: TestClient, saver: ThreadkeepSaver) -> None:
    ids = checkpoint_ids(saver, "a1")
    assert len(ids) >= 4
    seen: list[str] = []
    cursor: str | None = None
    while True:
        url = "/api/threads/a1/history?limit=2" + (f"&cursor={cursor}" if cursor else "")
        response = client.get(url, headers=auth(ALICE))
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["checkpoints"]) <= 2
        seen += [row["checkpoint_id"] for row in page["checkpoints"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    first = client.get("/api/threads/a1/history", headers=auth(ALICE)).json()["checkpoints"]
    assert {"step", "source", "created_at", "parent_id", "writes"} <= set(first[0])


def test_sv1_a_checkpoint_and_the_diff_between_two(client: TestClient, saver: ThreadkeepSaver) -> None:
    ids = checkpoint_ids(saver, "a1")
    newest, after_first_turn = ids[0], ids[len(ids) // 2]
    old = client.get(f"/api/threads/a1/checkpoints/{after_first_turn}", headers=auth(ALICE)).json()
    assert old["checkpoint_id"] == after_first_turn
    assert old["values"] == {"note": "turn 1"}
    diff = client.get(f"/api/threads/a1/diff?a={after_first_turn}&b={newest}", headers=auth(ALICE)).json()
    assert diff["a"] == after_first_turn
    assert diff["b"] == newest
    assert diff["changed"] == ["messages", "note"]
    assert diff["channels"]["note"] == {"change": "changed", "before": "turn 1", "after": "turn 2"}
    assert [m["id"] for m in diff["channels"]["messages"]["messages_added"]] == ["a1-h1", "ai-2"]


def test_sv1_mark_finished_then_delete(client: TestClient, saver: ThreadkeepSaver) -> None:
    marked = client.post("/api/threads/a1/finished", headers=auth(ALICE))
    assert marked.status_code == 200
    body = marked.json()
    assert body["status"] == "finished"
    assert body["due"] > time.time()
    retention = client.get("/api/threads/a1/retention", headers=auth(ALICE)).json()
    assert retention["status"] == "finished"
    assert retention["due"] == pytest.approx(body["due"])
    assert retention["spared_by"] == []
    deleted = client.delete("/api/threads/a1", headers=auth(ALICE))
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert client.get("/api/threads/a1/state", headers=auth(ALICE)).status_code == 404
    assert checkpoint_ids(saver, "a1") == []
    assert checkpoint_ids(saver, "b1") != []  # another thread stays


def test_sv1_an_admin_deletes_any_users_thread(client: TestClient, saver: ThreadkeepSaver) -> None:
    assert client.delete("/api/threads/b1", headers=auth(ADMIN)).status_code == 204
    assert checkpoint_ids(saver, "b1") == []


def test_sv1_retention_of_a_waiting_thread(client: TestClient) -> None:
    retention = client.get("/api/threads/b1/retention", headers=auth(BOB)).json()
    assert retention["status"] == "waiting"
    assert retention["horizons"]["waiting_minutes"] == retention["platform"]["waiting_minutes"]
    assert retention["due"] == pytest.approx(
        retention["written_at"] + 60 * retention["horizons"]["waiting_minutes"]
    )


# --- the store down, and the schema --------------------------------------------------------------


@pytest.mark.providers("postgres")
def test_sv1_a_store_that_does_not_answer_is_503(provider: Any) -> None:
    settings = Settings(
        provider="postgres",
        conn_string="host=127.0.0.1 port=9 user=postgres dbname=test connect_timeout=1",
        api_keys=KEYS,
    )
    with TestClient(create_app(settings)) as client:
        response = client.get("/api/threads/a1/state", headers=auth(ALICE))
    assert response.status_code == 503
    assert response.json()["code"].startswith("STORAGE_")


@pytest.mark.providers("sqlite")
def test_sv1_openapi_lists_every_route_of_the_app(client: TestClient) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    served = {
        (method.lower(), route.path)
        for route in client.app.routes  # type: ignore[attr-defined]
        if isinstance(route, Route) and route.include_in_schema  # not the inspector page's
        for method in route.methods or ()
        if method != "HEAD"
    }
    served = {(method, path.replace(":path}", "}")) for method, path in served}  # ids may hold "/"
    described = {(method, path) for path, ops in schema["paths"].items() for method in ops}
    assert served == described
    assert schema == openapi()
    history = schema["paths"]["/api/threads/{thread_id}/history"]["get"]
    assert {p["name"] for p in history["parameters"]} == {"thread_id", "limit", "cursor"}
    assert {"401", "404", "422", "503"} <= set(history["responses"])


# --- refusals at start and on a settings write (isolation off with user keys) -------------------


@pytest.mark.providers("sqlite")
def test_sv1_user_keys_with_isolation_off_refuse_to_start(open_saver: Opener) -> None:
    from threadkeep.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as refused:
        create_app(Settings(api_keys=KEYS, enforce_user_isolation=False))
    message = refused.value.message
    assert "LLM_PROVIDER_CHECKPOINT_API_KEYS" in message
    assert "LLM_PROVIDER_CHECKPOINT_USER_ISOLATION" in message
    assert "alice" in message  # names users, never keys
    assert "k-alice" not in message
    # a given store that keeps no owners apart is refused the same
    with pytest.raises(ConfigurationError):
        create_app(Settings(api_keys=KEYS), saver=open_saver(enforce_user_isolation=False))
    # admin keys alone are fine: they see every thread anyway
    create_app(Settings(api_keys=f"{ADMIN}:ops:admin", enforce_user_isolation=False))


@pytest.mark.providers("sqlite")
def test_sv1_a_settings_write_turning_isolation_off_with_user_keys_is_refused(client: TestClient) -> None:
    refused = client.patch(
        "/api/settings", json={"LLM_PROVIDER_CHECKPOINT_USER_ISOLATION": "false"}, headers=auth(ADMIN)
    )
    assert refused.status_code == 422, refused.text
    assert "LLM_PROVIDER_CHECKPOINT_USER_ISOLATION" in refused.json()["message"]
    # nothing changed: alice still sees only her own thread
    alice = client.get("/api/threads", headers=auth(ALICE)).json()
    assert [t["thread_id"] for t in alice["threads"]] == ["a1"]


# --- cursors the store could not read ------------------------------------------------------------


@pytest.mark.providers("sqlite", "postgres")
@pytest.mark.parametrize("raw", ['[1.0,"\\u0000"]', '[NaN,"a1"]', '[Infinity,"a1"]', '[-Infinity,"a1"]'])
def test_sv1_a_cursor_with_an_id_or_time_no_store_holds_is_422(client: TestClient, raw: str) -> None:
    cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    response = client.get(f"/api/threads?cursor={cursor}", headers=auth(ADMIN))
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "CONFIG_001"


# --- thread ids holding "/", and unknown routes ---------------------------------------------------


def test_sv1_a_thread_id_with_slashes_answers_on_every_route(
    client: TestClient, saver: ThreadkeepSaver
) -> None:
    thread = "team/alice/checkpoints"  # ends like a route's own segment
    talk(saver, thread, "alice", turns=2)
    ids = checkpoint_ids(saver, thread)
    listed = client.get("/api/threads", headers=auth(ALICE)).json()
    assert thread in [t["thread_id"] for t in listed["threads"]]
    for quoted in (thread, thread.replace("/", "%2F")):  # as typed, or as a browser encodes it
        base = f"/api/threads/{quoted}"
        state = client.get(f"{base}/state", headers=auth(ALICE))
        assert state.status_code == 200, state.text
        assert state.json()["thread_id"] == thread
        history = client.get(f"{base}/history", headers=auth(ALICE)).json()
        assert [row["checkpoint_id"] for row in history["checkpoints"]] == ids
        one = client.get(f"{base}/checkpoints/{ids[-1]}", headers=auth(ALICE)).json()
        assert one["checkpoint_id"] == ids[-1]
        diff = client.get(f"{base}/diff?a={ids[-1]}&b={ids[0]}", headers=auth(ALICE))
        assert diff.status_code == 200, diff.text
        retention = client.get(f"{base}/retention", headers=auth(ALICE))
        assert retention.json()["thread_id"] == thread
        assert client.get(f"{base}/state", headers=auth(BOB)).status_code == 404  # another user's
    assert client.post(f"/api/threads/{thread}/finished", headers=auth(ALICE)).json()["thread_id"] == thread
    assert client.delete(f"/api/threads/{thread}", headers=auth(ALICE)).status_code == 204
    assert checkpoint_ids(saver, thread) == []
    assert checkpoint_ids(saver, "a1") != []


@pytest.mark.providers("sqlite")
def test_sv1_an_unknown_route_or_method_answers_json(client: TestClient) -> None:
    missing = client.get("/api/nothing-here", headers=auth(ALICE))
    assert missing.status_code == 404
    assert {"error", "message"} <= set(missing.json())
    assert "/openapi.json" in missing.json()["message"]
    wrong = client.put("/api/threads/a1/state", headers=auth(ALICE))
    assert wrong.status_code == 405
    assert {"error", "message"} <= set(wrong.json())
    assert "GET" in wrong.headers["allow"]


@pytest.mark.providers("sqlite", "postgres", "tiered")
def test_sv1_retention_due_and_status_are_the_listings_after_a_run_starts(
    client: TestClient, saver: ThreadkeepSaver
) -> None:
    time.sleep(0.05)
    with user_scope("bob"):
        saver.start_threads(["b1"])  # a run starts: the waiting clock moves past the newest checkpoint
    listed = {t["thread_id"]: t for t in client.get("/api/threads", headers=auth(ADMIN)).json()["threads"]}
    for thread_id, key in (("b1", BOB), ("a1", ALICE)):
        retention = client.get(f"/api/threads/{thread_id}/retention", headers=auth(key)).json()
        row = listed[thread_id]
        assert (retention["due"], retention["written_at"], retention["status"]) == (
            row["due"],
            row["written_at"],
            row["status"],
        )
    newest = client.get("/api/threads/b1/state", headers=auth(BOB)).json()["created_at"]
    assert listed["b1"]["written_at"] > newest


# --- the ownership resolver in front of the thread routes (SPEC SV2) -----------------------------


def _forbidden_reads(client: TestClient, provider: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "threadkeep_forbidden_total" and sample.labels == {
                "provider": provider,
                "operation": "read",
            }:
                return float(sample.value)
    return 0.0


@pytest.mark.providers("sqlite", "postgres")
def test_sv2_the_thread_routes_ask_the_resolver_and_count_another_users_thread(
    open_saver: Opener,
) -> None:
    from threadkeep.metrics import Metrics

    saver: ThreadkeepSaver = open_saver(metrics=Metrics())
    talk(saver, "a1", "alice")
    with TestClient(create_app(Settings(api_keys=KEYS), saver=saver, metrics=saver.metrics)) as client:
        assert client.get("/api/threads/a1/state", headers=auth(ALICE)).status_code == 200
        resolver = client.app.state.service.resolver  # type: ignore[attr-defined]
        assert resolver.stats.store_reads == 1
        for path in ("state", "history", "retention"):
            assert client.get(f"/api/threads/a1/{path}", headers=auth(ALICE)).status_code == 200
        assert (resolver.stats.lookups, resolver.stats.store_reads) == (4, 1)  # the LRU answered
        provider = saver.facts.name
        before = _forbidden_reads(client, provider)
        for method, url in thread_routes("a1"):
            assert client.request(method, url, headers=auth(BOB)).status_code == 404, url
        assert _forbidden_reads(client, provider) == before + len(thread_routes("a1"))
        assert resolver.stats.store_reads == 1


@pytest.mark.providers("sqlite", "postgres")
def test_sv2_a_thread_deleted_then_made_again_by_another_user_is_its_new_owners(
    open_saver: Opener,
) -> None:
    from tests.providers import CASES, REDIS_URL, redis_probe, require, track_redis_prefix
    from threadkeep.resolver import store_identity

    require(CASES["redis"], redis_probe())
    saver: ThreadkeepSaver = open_saver()
    track_redis_prefix(f"tkowner:{store_identity(saver)}")
    settings = Settings(api_keys=KEYS, cache_url=REDIS_URL)  # with the shared tier
    talk(saver, "t", "alice")
    with TestClient(create_app(settings, saver=saver)) as client:
        assert client.get("/api/threads/t/state", headers=auth(ALICE)).status_code == 200
        assert client.delete("/api/threads/t", headers=auth(ALICE)).status_code == 204
        talk(saver, "t", "bob")  # the same id, another owner
        assert client.get("/api/threads/t/state", headers=auth(BOB)).status_code == 200
        assert client.get("/api/threads/t/state", headers=auth(ALICE)).status_code == 404
    # another server on the same store and cache (an empty LRU): not the stale owner either
    with TestClient(create_app(settings, saver=saver)) as other:
        assert other.get("/api/threads/t/state", headers=auth(BOB)).status_code == 200
        assert other.get("/api/threads/t/state", headers=auth(ALICE)).status_code == 404


@pytest.mark.providers("sqlite")
def test_sv2_the_sweep_route_evicts_what_it_deleted(open_saver: Opener) -> None:
    saver: ThreadkeepSaver = open_saver()
    talk(saver, "t", "alice")
    with user_scope("alice"):
        saver.mark_finished(["t"])
    with TestClient(create_app(Settings(api_keys=KEYS), saver=saver)) as client:
        assert client.get("/api/threads/t/state", headers=auth(ALICE)).status_code == 200
        later = time.time() + 10 * 86400
        saver.clock = lambda: later  # type: ignore[method-assign]
        swept = client.post("/api/checkpoints/sweep", headers=auth(ADMIN)).json()
        assert swept["swept_count"] == 1
        talk(saver, "t", "bob")
        assert client.get("/api/threads/t/state", headers=auth(BOB)).status_code == 200

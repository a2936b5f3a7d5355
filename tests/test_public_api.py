"""The public surface is small and deliberate: a change to it is a change to this test."""

from __future__ import annotations

import re
from pathlib import Path

import threadkeep
from threadkeep.settings import VARIABLES

ROOT = Path(__file__).resolve().parents[1]


def test_public_names_are_pinned() -> None:
    assert sorted(threadkeep.__all__) == [
        "ANONYMOUS",
        "CheckpointDeleteError",
        "CheckpointSerializationError",
        "CheckpointStoreFormatError",
        "CheckpointedException",
        "ConfigurationError",
        "FaithfulCodec",
        "InvalidInputError",
        "MissingExtraError",
        "NoResumableTurnError",
        "ParkRefusedError",
        "PlatformRetention",
        "ProviderFacts",
        "RunGroup",
        "RunOutcome",
        "Settings",
        "StaleStateError",
        "StorageError",
        "StorageForbiddenError",
        "StorageRefusedError",
        "SweepResult",
        "ThreadRetention",
        "ThreadRetentionError",
        "ThreadkeepError",
        "ThreadkeepSaver",
        "ToolCall",
        "ToolCallError",
        "ToolFailure",
        "TurnFailedError",
        "TurnManager",
        "TurnResult",
        "aopen_checkpointer",
        "arun_agent",
        "ask",
        "close_savers",
        "current_idempotency_key",
        "declare_retention",
        "facts_of",
        "open_checkpointer",
        "operator_scope",
        "register_live_thread_filter",
        "replay_safe",
        "run_agent",
        "saver_for",
        "sweep_checkpoints",
        "user_scope",
    ]
    for name in threadkeep.__all__:
        assert hasattr(threadkeep, name), name


def test_w5_every_error_has_a_stable_code_and_a_dict() -> None:
    errors = [getattr(threadkeep, n) for n in threadkeep.__all__ if n.endswith("Error")]
    codes = {e.default_code for e in errors}
    assert len(codes) == len(errors)
    for error in errors:
        assert issubclass(error, threadkeep.ThreadkeepError)
        assert error.kind in {"conflict", "forbidden", "unavailable", "invalid"}
    stale = threadkeep.StaleStateError("t", "", "a", "b")
    assert stale.to_dict() == {
        "error": "StaleStateError",
        "code": "STORAGE_CONFLICT_001",
        "message": stale.message,
        "context": {"thread_id": "t", "checkpoint_ns": "", "expected_head": "a", "current_head": "b"},
    }


def test_p4_facts_are_queryable_in_code() -> None:
    assert threadkeep.facts_of("memory").survives_restart is False
    assert threadkeep.facts_of("sqlite").survives_restart is True
    assert threadkeep.facts_of("redis").expiry == "ttl"
    assert threadkeep.facts_of("memory").expiry == "process"
    assert {p for p in ("postgres", "redis", "tiered") if threadkeep.facts_of(p).holds_parked_runs} == {
        "postgres",
        "redis",
        "tiered",
    }
    assert not threadkeep.facts_of("sqlite").holds_parked_runs


def test_docs_list_every_setting() -> None:
    documented = set(re.findall(r"`([A-Z_]+)`", (ROOT / "docs" / "settings.md").read_text()))
    assert set(VARIABLES) <= documented


# psycopg's documented modules (https://www.psycopg.org/psycopg3/docs/api/): the ones threadkeep
# may import. Its generators and waiting functions, which drive the protocol by hand, are not
# among them, nor is subclassing its connections to change how they wait.
_PSYCOPG_MODULES = {
    "psycopg",
    "psycopg.conninfo",
    "psycopg.errors",
    "psycopg.rows",
    "psycopg.sql",
    "psycopg_pool",
}


def test_psycopg_is_used_through_its_documented_modules_only() -> None:
    import ast

    import threadkeep

    imported: dict[str, set[str]] = {}
    subclassed: list[str] = []
    for path in Path(threadkeep.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                names = [name for name in names if name.split(".")[0] in ("psycopg", "psycopg_pool")][:1]
            elif isinstance(node, ast.Attribute) and ast.unparse(node).startswith("psycopg."):
                names = [
                    name for name in ("psycopg.generators", "psycopg.waiting") if ast.unparse(node) == name
                ]
            elif isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base) for base in node.bases]
                subclassed += [
                    f"{path.name}:{node.name}" for base in bases if "Connection" in base or "Cursor" in base
                ]
                continue
            else:
                continue
            for name in names:
                if name.split(".")[0] in ("psycopg", "psycopg_pool"):
                    imported.setdefault(name, set()).add(path.name)
    assert {name: files for name, files in imported.items() if name not in _PSYCOPG_MODULES} == {}
    assert subclassed == []

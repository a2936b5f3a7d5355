"""Every install opens what it promises (issue 36 item 1): the plain install, without any
extra's modules, in a subprocess whose import system refuses them.

``tools/check_installs`` (run by ``.ci/run``) checks the same on the built wheel in fresh
virtual environments, one per install; these tests are the fast in-suite check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ("psycopg", "psycopg_pool", "redis", "starlette", "uvicorn")

# Installed first in the subprocess: a finder that answers "not installed" for the modules
# the extras bring, as on a machine where they are not installed.
REFUSE_EXTRAS = """
import sys

class RefuseExtras:
    blocked = {blocked!r}

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.blocked or name in self.blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, RefuseExtras())
"""


def run_without(blocked: tuple[str, ...], code: str, cwd: Path) -> dict[str, object]:
    """Run ``code`` with ``blocked`` modules refused; it prints one JSON object last."""
    script = REFUSE_EXTRAS.format(blocked=set(blocked)) + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_plain_install_opens_sqlite_and_memory_and_imports_no_backend_before_use(tmp_path: Path) -> None:
    result = run_without(
        (*DRIVERS, "langgraph.checkpoint.sqlite"),
        """
        import json, sys
        import threadkeep

        after_import = sorted(m for m in sys.modules if m.startswith("threadkeep.backends"))
        opened = {}
        for provider, where in (("sqlite", "plain.sqlite"), ("memory", None)):
            with threadkeep.open_checkpointer(provider, where, settings=threadkeep.Settings()) as saver:
                config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
                from langgraph.checkpoint.base import empty_checkpoint

                checkpoint = empty_checkpoint()
                checkpoint["channel_values"] = {"answer": 42}
                checkpoint["channel_versions"] = {"answer": 1}
                stored = saver.put(config, checkpoint, {"step": -1}, {"answer": 1})
                opened[provider] = saver.get_tuple(stored).checkpoint["channel_values"]
        print(json.dumps({
            "after_import": after_import,
            "opened": opened,
            "drivers": sorted(m for m in sys.modules if m.partition(".")[0] in RefuseExtras.blocked),
            "backends": sorted(m.split(".")[2] for m in sys.modules if m.count(".") == 2
                               and m.startswith("threadkeep.backends.")),
        }))
        """,
        tmp_path,
    )
    assert result["after_import"] == []
    assert result["opened"] == {"sqlite": {"answer": 42}, "memory": {"answer": 42}}
    assert result["drivers"] == []
    assert result["backends"] == ["sql", "sqlite"]


@pytest.mark.parametrize(
    ("name", "blocked", "command"),
    [
        ("postgres", ("psycopg", "psycopg_pool"), "pip install 'threadkeep[postgres]'"),
        ("postgres", ("psycopg_pool",), "pip install 'threadkeep[postgres]'"),
        ("redis", ("redis",), "pip install 'threadkeep[redis]'"),
        ("tiered", ("redis",), "pip install 'threadkeep[postgres,redis]'"),
        ("tiered", ("psycopg", "psycopg_pool"), "pip install 'threadkeep[postgres,redis]'"),
    ],
)
def test_a_provider_without_its_extra_raises_missing_extra_error_naming_the_pip_install(
    tmp_path: Path, name: str, blocked: tuple[str, ...], command: str
) -> None:
    result = run_without(
        blocked,
        f"""
        import json
        import threadkeep

        try:
            threadkeep.open_checkpointer({name!r}, "unused", settings=threadkeep.Settings())
        except threadkeep.MissingExtraError as error:
            print(json.dumps({{"code": error.code, "message": error.message, "context": error.context}}))
        """,
        tmp_path,
    )
    assert result["code"] == "CONFIG_002"
    assert command in str(result["message"])
    assert f"the {name} provider needs" in str(result["message"])


def test_serve_without_the_server_extra_names_the_pip_install(tmp_path: Path) -> None:
    result = run_without(
        ("starlette", "uvicorn"),
        """
        import json
        from click.testing import CliRunner
        from threadkeep.cli import main

        served = CliRunner().invoke(main, ["serve", "--port", "1"])
        print(json.dumps({"exit": served.exit_code, "output": served.output,
                          "exception": repr(served.exception)}))
        """,
        tmp_path,
    )
    assert result["exit"] == 1, result
    assert "pip install 'threadkeep[server]'" in str(result["output"])


def test_demo_runs_without_langgraph_sqlite_saver_and_says_how_to_compare(tmp_path: Path) -> None:
    result = run_without(
        (*DRIVERS, "langgraph.checkpoint.sqlite"),
        """
        import json
        from click.testing import CliRunner
        from threadkeep.cli import main

        demo = CliRunner().invoke(main, ["demo", "--turns", "2"])
        print(json.dumps({"exit": demo.exit_code, "output": demo.output, "exception": repr(demo.exception)}))
        """,
        tmp_path,
    )
    assert result["exit"] == 0, result
    output = str(result["output"])
    assert "18 checkpoints, newest first" in output
    assert "LangGraph SqliteSaver:" not in output
    assert "pip install langgraph-checkpoint-sqlite" in output
    assert (tmp_path / ".threadkeep" / "checkpoints.sqlite").is_file()


def test_the_package_ships_py_typed() -> None:
    assert (ROOT / "src" / "threadkeep" / "py.typed").is_file()

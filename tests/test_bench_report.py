"""The benchmark page and figures come from the results files, and a run records how it was made."""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

import pytest
from bench import page
from bench.__main__ import main
from bench.stored import RESULTS

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the page and of the results files, to change without touching the repository."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    copy = tmp_path / "benchmarks.md"
    shutil.copy(page.PAGE, copy)
    return copy, results


def test_ratios_say_which_way_they_go() -> None:
    assert page.ratio(1.58, 4.43, "time") == "2.80x faster"
    assert page.ratio(5.11, 4.97, "time") == "1.03x slower"
    assert page.ratio(104.3, 39.2, "rate") == "2.66x faster"
    assert page.ratio(1_261_568, 12_812_288, "bytes") == "10.2x smaller"
    assert page.ratio(640, 320, "count") == "2.00x more"
    assert page.ratio(6.70, 6.69, "cpu") == "1.00x"


def test_the_repository_page_matches_its_results_files() -> None:
    assert page.main(check=True) == 0


def test_a_changed_result_makes_the_page_stale_until_it_is_rewritten(copies: tuple[Path, Path]) -> None:
    copy, results = copies
    servers = json.loads((results / "servers.json").read_text())
    servers["threadkeep-postgres"]["bytes@40"] = servers["langgraph-postgres"]["bytes@40"] / 20
    (results / "servers.json").write_text(json.dumps(servers))
    before = copy.read_text()

    assert page.main(check=True, page=copy, folder=results) == 1
    assert page.main(page=copy, folder=results) == 0
    after = copy.read_text()
    expected = round(servers["langgraph-postgres"]["bytes@40"] / 20)
    assert f"| bytes after 40 turns | 20.0x smaller ({expected:,}) |" in after
    assert page.main(check=True, page=copy, folder=results) == 0
    # What is written by hand, outside the generated blocks, is kept as it was.
    assert page.BLOCK.sub("", after) == page.BLOCK.sub("", before)


def test_a_missing_results_file_names_the_command_that_writes_it(copies: tuple[Path, Path]) -> None:
    copy, results = copies
    (results / "sweep.json").unlink()
    page.main(page=copy, folder=results)
    assert f"No results yet: run `{page.COMMANDS['sweep.json']}`." in copy.read_text()


def test_plot_draws_the_three_figures_from_the_results_files(tmp_path: Path) -> None:
    assert main(["plot", "--images", str(tmp_path)]) == 0
    drawn = sorted(path.name for path in tmp_path.iterdir())
    assert drawn == ["latency.png", "storage.png", "throughput.png"]
    for name in drawn:
        assert (tmp_path / name).read_bytes().startswith(PNG)


def test_a_run_records_its_command_and_machine_and_the_page_shows_them(
    copies: tuple[Path, Path], tmp_path: Path
) -> None:
    copy, results = copies
    written = results / "conversation.json"
    measuring = ["conversation", "--runs", "1", "--turns", "1,2", "--json", str(written)]
    images = tmp_path / "img"
    assert main([*measuring, "--plot", "--results", str(results), "--images", str(images)]) == 0

    run = json.loads(written.read_text())["_run"]
    assert run["command"] == "./dev bench " + " ".join(measuring)
    assert (images / "storage.png").read_bytes().startswith(PNG)
    assert run["environment"]["python"] == platform.python_version()
    assert run["environment"]["postgres server"][:1].isdigit()
    page.main(page=copy, folder=results)
    text = copy.read_text()
    assert f"./dev bench conversation --runs 1 --turns 1,2 --json {written}" in text
    assert "| bytes after 2 turns |" in text
    python = next(line for line in text.splitlines() if line.startswith("| python |"))
    assert python.startswith(f"| python | {platform.python_version()}")


def test_the_startup_table_compares_each_figure_with_async_postgres_saver(copies: tuple[Path, Path]) -> None:
    copy, results = copies
    ours = {"import": 800.0, "open": 56.0, "first_load": 8.0, "open_first_load": 64.0, "second_load": 2.0}
    ungated = {"import": 800.0, "open": 0.5, "first_load": 10.0, "open_first_load": 10.5, "second_load": 2.0}
    theirs = {"import": 400.0, "open": 4.0, "first_load": 3.0, "open_first_load": 7.0, "second_load": 1.0}
    run = {"command": "./dev bench startup --runs 5", "args": {"runs": 5}}
    (results / "startup.json").write_text(
        json.dumps(
            {
                "threadkeep-postgres": ours,
                "threadkeep-postgres-ungated": ungated,
                "langgraph-postgres": theirs,
                "_run": run,
            }
        )
    )
    page.main(page=copy, folder=results)
    text = copy.read_text()
    expected = (
        "./dev bench startup --runs 5\n",
        "In a new process, the median of 5 processes each, against",
        "| measure | threadkeep postgres | threadkeep postgres, no format gate | LangGraph",
        "| import (ms) | 2.00x slower (800) | 2.00x slower (800) | 400 |",
        "| open (ms) | 14.0x slower (56.0) | 8.00x faster (0.50) | 4.00 |",
        "| first load (ms) | 2.67x slower (8.00) | 3.33x slower (10.0) | 3.00 |",
        "| open + first load (ms) | 9.14x slower (64.0) | 1.50x slower (10.5) | 7.00 |",
        "| second load (ms) | 2.00x slower (2.00) | 2.00x slower (2.00) | 1.00 |",
    )
    assert [line for line in expected if line not in text] == []


@pytest.mark.postgres
def test_a_startup_run_times_each_saver_in_processes_of_its_own(tmp_path: Path) -> None:
    written = tmp_path / "startup.json"
    assert main(["startup", "--runs", "1", "--conversation-turns", "1", "--json", str(written)]) == 0

    results = json.loads(written.read_text())
    assert results["_run"]["args"]["runs"] == 1
    for name in ("threadkeep-postgres", "threadkeep-postgres-ungated", "langgraph-postgres"):
        figures = results[name]
        assert all(figures[key] > 0 for key in ("import", "open", "first_load", "second_load"))
        assert figures["open_first_load"] == pytest.approx(figures["open"] + figures["first_load"])


@pytest.mark.postgres
def test_a_sweep_run_seeds_the_current_schema_and_sweeps_every_expired_thread() -> None:
    from bench import sweep

    result = sweep.one_run(20, with_writer=False)

    assert (result["swept"], result["finished_swept"], result["waiting_swept"]) == (20, 10, 10)
    assert result["peak_rss_mib"] > 0

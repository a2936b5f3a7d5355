"""The tables of docs/benchmarks.md, written from the results files (``./dev bench page``).

    ./dev bench page           rewrite every generated block of the page
    ./dev bench page --check   exit 1 if a block differs from the results files (./dev test runs it)

A generated block sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``; the rest
of the page is written by hand and kept as it is. Each table is preceded by the command that
wrote its results file, and compares threadkeep with LangGraph's saver as a ratio first
("2.80x faster (1.58)": threadkeep's figure in brackets), LangGraph's own figure last.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stored import RESULTS, RUN, label, load, stores

PAGE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)

# The command that writes each file, shown when the file does not record its own (``_run``).
COMMANDS = {
    "conversation.json": "./dev bench conversation --runs 9 --json bench/results/conversation.json",
    "servers.json": "./dev bench servers --runs 3 --json bench/results/servers.json",
    "calls.json": "./dev bench calls --runs 3 --conversation-turns 10 --json bench/results/calls.json",
    "tiered-10.json": "./dev bench tiered --runs 3 --conversation-turns 10"
    " --json bench/results/tiered-10.json",
    "tiered-40.json": "./dev bench tiered --runs 3 --conversation-turns 40"
    " --json bench/results/tiered-40.json",
    "sweep.json": "./dev bench sweep --runs 3 --threads 100000 --json bench/results/sweep.json",
    "startup.json": "./dev bench startup --runs 15 --json bench/results/startup.json",
    "ledger.json": "./dev bench ledger --runs 5 --json bench/results/ledger.json",
    "threads.json": "./dev bench threads --runs 15 --json bench/results/threads.json",
}
# What "better" and "worse" are called for each kind of figure; "rate" is the one where more is better.
WORDS = {
    "bytes": ("smaller", "larger"),
    "time": ("faster", "slower"),
    "rate": ("faster", "slower"),
    "cpu": ("less", "more"),
    "count": ("fewer", "more"),
}
CALLS = {"aput": "put", "aput_writes": "put_writes", "aget_tuple": "get_tuple"}


def times(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}x"
    return f"{value:.1f}x" if value >= 10 else f"{value:.2f}x"


def ratio(ours: float, theirs: float, kind: str) -> str:
    """How ``ours`` compares with ``theirs``, in words: ``"10.2x smaller"``, ``"1.30x slower"``."""
    better, worse = WORDS[kind]
    gain = ours / theirs if kind == "rate" else theirs / ours
    if round(gain, 2) == 1:
        return "1.00x"
    return f"{times(gain)} {better}" if gain >= 1 else f"{times(1 / gain)} {worse}"


def number(value: float, kind: str) -> str:
    if kind in ("bytes", "count"):
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


Row = tuple[str, Callable[[dict[str, Any]], float], str]  # measure, figure of a store, kind


def compare(results: dict[str, Any], rows: list[Row], columns: list[tuple[str, str | None]]) -> list[str]:
    """A table: one row per measure, one column per ``(store, compared with)``: the store's
    ratio to the other and its own figure in brackets, or (``None``) its figure alone."""
    columns = [(name, base) for name, base in columns if name in results]
    out = [
        "| measure | " + " | ".join(label(name) for name, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for measure, figure, kind in rows:
        cells = []
        for name, base in columns:
            mine = number(figure(results[name]), kind)
            cells.append(
                mine
                if base is None
                else f"{ratio(figure(results[name]), figure(results[base]), kind)} ({mine})"
            )
        out.append(f"| {measure} | " + " | ".join(cells) + " |")
    return out


def against(ours: list[str], theirs: str) -> list[tuple[str, str | None]]:
    """The columns of ``ours``, each compared with ``theirs``, then ``theirs`` alone."""
    return [*((name, theirs) for name in ours), (theirs, None)]


def command(name: str, results: dict[str, Any]) -> list[str]:
    return ["```", results.get(RUN, {}).get("command") or COMMANDS[name], "```", ""]


def get(key: str) -> Callable[[dict[str, Any]], float]:
    return lambda figures: float(figures[key])


def _turns(figures: dict[str, Any], prefix: str) -> list[int]:
    return sorted(int(key.split("@")[1]) for key in figures if key.startswith(prefix + "@"))


def conversation(results: dict[str, Any]) -> list[str]:
    by_store = {
        name: {k: results[f"{name}@{k}"] for k in _turns_of(results, name)} for name in stores(results)
    }
    last = max(_turns_of(results, "langgraph-sqlite"))
    rows: list[Row] = [
        (f"bytes after {k} turns", _at(k, "bytes"), "bytes") for k in by_store["langgraph-sqlite"]
    ]
    rows += [
        (f"`{call}` median (ms), {last} turns", _at(last, call), "time")
        for call in ("put", "put_writes", "get_tuple")
    ]
    columns = [
        *against(["threadkeep-sqlite", "threadkeep-sqlite-full"], "langgraph-sqlite"),
        *against(["threadkeep-memory"], "langgraph-memory"),
    ]
    out = ["threadkeep `sqlite` against LangGraph's `SqliteSaver`, `memory` against `InMemorySaver`:", ""]
    return out + compare(by_store, rows, columns)


def _turns_of(results: dict[str, Any], name: str) -> list[int]:
    return sorted(int(key.split("@")[1]) for key in results if key.split("@")[0] == name)


def _at(k: int, key: str) -> Callable[[dict[str, Any]], float]:
    return lambda figures: float(figures[k][key])


def servers(results: dict[str, Any]) -> list[str]:
    lg = results["langgraph-postgres"]
    last = max(_turns(lg, "bytes"))
    lengths = _turns(lg, "throughput")
    conversations = results.get(RUN, {}).get("args", {}).get("conversations", 32)
    rows: list[Row] = [(f"bytes after {last} turns", get(f"bytes@{last}"), "bytes")]
    for call, name in CALLS.items():
        rows += [
            (f"`{name}` median (ms)", get(call), "time"),
            (f"`{name}` p99 (ms)", get(f"{call}_p99"), "time"),
        ]
    rows.append(("cold load (ms)", get("cold_load"), "time"))
    rows += [
        (f"turns/s, {conversations} conversations of {n} turns", get(f"throughput@{n}"), "rate")
        for n in lengths
    ]
    rows += [
        (f"`{name}` {stat} (ms), {conversations} at once, {n} turns", get(f"{call}_{stat}@{n}"), "time")
        for n in lengths
        for call, name in (("aput", "put"), ("aget_tuple", "get_tuple"))
        for stat in ("p50", "p99")
        if f"{call}_{stat}@{n}" in lg
    ]
    if "floor-graph" in results:
        graph = results["floor-graph"]
        rows += [
            (f"saver CPU ms per turn, {n}-turn conversations", _saver_cpu(graph, n), "cpu") for n in lengths
        ]
    ours = ["threadkeep-postgres", "threadkeep-pg-z256", "threadkeep-redis"]
    out = ["Against LangGraph's `AsyncPostgresSaver`:", ""]
    out += compare(results, rows, against(ours, "langgraph-postgres"))
    names = [name for name in stores(results) if "bytes@" + str(last) in results[name]]
    ks = _turns(lg, "bytes")
    out += ["", "Bytes stored after K turns on one thread, every store:", ""]
    out += ["| store | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    out += [
        f"| {label(n)} | " + " | ".join(f"{results[n][f'bytes@{k}']:,.0f}" for k in ks) + " |" for n in names
    ]
    out += [
        "",
        f"Throughput, {conversations} conversations at once: turns per second, and CPU ms per turn of this"
        " process / of the Postgres and Redis servers:",
        "",
    ]
    out += ["| store | " + " | ".join(f"{n} turns: turns/s | CPU ms" for n in lengths) + " |"]
    out += ["|---|" + "---:|---:|" * len(lengths)]
    for n in stores(results):
        r = results[n]
        cells = [
            f"{r[f'throughput@{k}']:.1f} | {r[f'client_ms@{k}']:.1f} / {r[f'server_ms@{k}']:.1f}"
            for k in lengths
        ]
        out.append(f"| {label(n)} | " + " | ".join(cells) + " |")
    return out


def _saver_cpu(graph: dict[str, Any], turns: int) -> Callable[[dict[str, Any]], float]:
    """The CPU a saver costs per turn: this process's beyond the graph's alone, plus the servers'."""
    return lambda r: float(r[f"client_ms@{turns}"] - graph[f"client_ms@{turns}"] + r[f"server_ms@{turns}"])


def calls(results: dict[str, Any]) -> list[str]:
    rows: list[Row] = [(f"`{name}` (µs of client CPU)", get(call), "cpu") for call, name in CALLS.items()]
    rows.append(("client CPU ms per turn", get("ms_per_turn"), "cpu"))
    out = ["Against LangGraph's `AsyncPostgresSaver`:", ""]
    return out + compare(
        results, rows, against(["threadkeep-postgres", "threadkeep-redis"], "langgraph-postgres")
    )


def tiered(results: dict[str, Any]) -> list[str]:
    rows: list[Row] = []
    for call, name in CALLS.items():
        rows += [
            (f"`{name}` median (ms)", get(call), "time"),
            (f"`{name}` p99 (ms)", get(f"{call}_p99"), "time"),
        ]
    rows += [
        ("write per step (ms)", get("write_per_step"), "time"),
        ("quiet load (ms)", get("quiet_load"), "time"),
        ("turns/s", get("throughput"), "rate"),
        ("Postgres read queries", get("pg_read_queries"), "count"),
        ("Postgres statements writing", get("pg_writing"), "count"),
    ]
    out = compare(results, rows, against(["threadkeep-postgres", "threadkeep-tiered"], "langgraph-postgres"))
    if "floor_load" in results.get("threadkeep-tiered", {}):
        floor, quiet = results["threadkeep-tiered"]["floor_load"], results["threadkeep-tiered"]["quiet_load"]
        out += [
            "",
            f"The floor of a quiet load, one Redis `GET` of the same state plus decoding it: {floor:.2f} ms"
            f" (threadkeep `tiered`: {times(quiet / floor)} its time).",
        ]
    return out


def sweep(results: dict[str, Any]) -> list[str]:
    runs, median, quarter = results["runs"], results["median"], results["quarter"]
    rows = [
        ("threads swept per second", "threads_per_second", "{:,.0f}"),
        (f"sweep process peak RSS (MiB), {median['swept']:,.0f} threads", "peak_rss_mib", "{:.1f}"),
        ("live `put` p99 before the sweep (ms)", "p99_before_ms", "{:.1f}"),
        ("live `put` p99 during the sweep (ms)", "p99_during_ms", "{:.1f}"),
    ]
    out = ["| measure | median | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |"]
    out.append("|---|---:|" + "---:|" * len(runs))
    for measure, key, fmt in rows:
        out.append(
            f"| {measure} | {fmt.format(median[key])} | "
            + " | ".join(fmt.format(r[key]) for r in runs)
            + " |"
        )
    during = median["p99_during_ms"] / median["p99_before_ms"]
    out += [
        "",
        f"The live writer's `put` p99 during the sweep: {times(during)} its p99 before it. With"
        f" {quarter['swept']:,.0f} threads and no writer, the sweep's peak RSS is"
        f" {quarter['peak_rss_mib']:.1f} MiB.",
    ]
    return out


def startup(results: dict[str, Any]) -> list[str]:
    rows: list[Row] = [
        ("import (ms)", get("import"), "time"),
        ("open (ms)", get("open"), "time"),
        ("first load (ms)", get("first_load"), "time"),
        ("open + first load (ms)", get("open_first_load"), "time"),
    ]
    if all("second_load" in figures for name, figures in results.items() if name != RUN):
        rows.append(("second load (ms)", get("second_load"), "time"))
    runs = results.get(RUN, {}).get("args", {}).get("runs")
    each = f", the median of {runs} processes each" if runs else ""
    out = [f"In a new process{each}, against LangGraph's `AsyncPostgresSaver`:", ""]
    ours = ["threadkeep-postgres", "threadkeep-postgres-ungated"]
    return out + compare(results, rows, against(ours, "langgraph-postgres"))


def ledger(results: dict[str, Any]) -> list[str]:
    stores = [name for name in results if name not in (RUN, "postgres-floor")]
    out = [
        "`begin_tool_call` then `end_tool_call`, one call after another on one thread (ms per call),"
        " and the workload's agent with and without the ledger around each of its tool calls:",
        "",
        "| store | sync call | async call | agent ms/turn without | with | ledger ms per tool call |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in stores:
        r = results[name]
        out.append(
            f"| {label(name)} | {r['sync_wall']:.3f} | {r['async_wall']:.3f} | {r['turn_without']:.2f}"
            f" | {r['turn_with']:.2f} | {r['per_call']:.3f} |"
        )
    floor = results.get("postgres-floor")
    if floor:
        out += [
            "",
            f"The Postgres server itself, for scale (median ms): a round trip {floor['round trip']:.3f}, a"
            f" one-row INSERT committed durably {floor['durable commit']:.3f}, the same without waiting"
            f" for its WAL flush {floor['commit, no flush wait']:.3f}. A tool call's ledger is two durable"
            " commits (started, then its result), each acknowledged only once Postgres has flushed it.",
        ]
    return out


def threads(results: dict[str, Any]) -> list[str]:
    page_size = results.get("page", 50)
    out = [
        f"Milliseconds to read a page of {page_size} threads (`saver.threads`), the median of the runs, in"
        " stores seeded with that many threads: the first page, a page deep in the listing (by its"
        " cursor), the finished threads only, and one user's threads:",
        "",
        "| store | threads | first page | deep page | finished | one user's |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for store, sizes in results.get("stores", {}).items():
        for size, r in sizes.items():
            out.append(
                f"| {label(store)} | {int(size):,} | {r['first_page_ms']:.2f} | {r['deep_page_ms']:.2f}"
                f" | {r['finished_ms']:.2f} | {r['user_page_ms']:.2f} |"
            )
    return out


def environment(folder: Path) -> list[str]:
    """One row per recorded property; a value that differs between files names the files."""
    seen: dict[str, dict[str, list[str]]] = {}
    recorded = []
    for name in COMMANDS:
        results = load(name, folder)
        env = (results or {}).get(RUN, {}).get("environment")
        if not env:
            continue
        recorded.append(name)
        for key, value in env.items():
            seen.setdefault(key, {}).setdefault(str(value), []).append(name)
    if not seen:
        return ["No results file records its machine: `./dev bench env` prints this one's."]
    out = ["| | |", "|---|---|"]
    for key, values in seen.items():
        shown = (
            next(iter(values))
            if len(values) == 1 and len(next(iter(values.values()))) == len(recorded)
            else "; ".join(f"{value} ({', '.join(files)})" for value, files in values.items())
        )
        out.append(f"| {key} | {shown} |")
    unrecorded = [name for name in COMMANDS if name not in recorded and (folder / name).exists()]
    out += ["", "Recorded in " + ", ".join(f"`{name}`" for name in recorded) + "."]
    if unrecorded:
        out[-1] += " " + ", ".join(f"`{name}`" for name in unrecorded) + " record no machine."
    return out


# Each block: the results files it is written from, and how.
BLOCKS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], list[str]]]] = {
    "conversation": (("conversation.json",), conversation),
    "servers": (("servers.json",), servers),
    "calls": (("calls.json",), calls),
    "tiered": (("tiered-10.json", "tiered-40.json"), tiered),
    "sweep": (("sweep.json",), sweep),
    "startup": (("startup.json",), startup),
    "ledger": (("ledger.json",), ledger),
    "threads": (("threads.json",), threads),
}


def render(name: str, folder: Path = RESULTS) -> str:
    """The body of the block ``name``."""
    if name == "environment":
        return "\n".join(environment(folder)) + "\n"
    if name not in BLOCKS:
        raise SystemExit(
            f"{PAGE}: unknown block bench:{name}; the blocks are environment, {', '.join(BLOCKS)}"
        )
    files, write = BLOCKS[name]
    out: list[str] = []
    for file in files:
        results = load(file, folder)
        if out:
            out.append("")
        if results is None:
            out += [f"No results yet: run `{COMMANDS[file]}`."]
            continue
        out += command(file, results) + write(results)
    return "\n".join(out) + "\n"


def rewrite(page: str, folder: Path = RESULTS) -> str:
    """``page`` with every generated block written again from the results in ``folder``."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name"), folder) + m.group(4), page)


def main(check: bool = False, page: Path = PAGE, folder: Path = RESULTS) -> int:
    current = page.read_text()
    wanted = rewrite(current, folder)
    if check:
        if current != wanted:
            print(f"{page} differs from {folder}: run ./dev bench page")
            return 1
        return 0
    if current != wanted:
        page.write_text(wanted)
        print(f"wrote {page}")
    return 0

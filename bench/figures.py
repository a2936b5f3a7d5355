"""The benchmark figures as PNGs, drawn from the results files (``./dev bench plot``).

- ``storage.png``: bytes stored against conversation length, log-log, every saver
  (``conversation.json`` and ``servers.json``);
- ``latency.png``: per-call median (bar) and p99 (whisker) of each saver call, over one
  40-turn conversation (``servers.json``) and with 32 conversations at once (``tiered-10.json``);
- ``throughput.png``: turns per second with 32 conversations at once (``servers.json``).

Needs matplotlib, the ``bench`` extra (``pip install -e '.[bench]'``; ``./dev`` installs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.stored import RESULTS, RUN, label, load, stores

IMAGES = Path(__file__).resolve().parents[1] / "docs" / "img"
CALLS = {"aput": "put", "aput_writes": "put_writes", "aget_tuple": "get_tuple"}
# One colour per store in every figure: LangGraph's in blues and grey, the floors in greys.
COLOURS = {
    "langgraph-memory": "#555555",
    "langgraph-sqlite": "#1f3b73",
    "langgraph-postgres": "#1f77b4",
    "threadkeep-memory": "#2ca02c",
    "threadkeep-sqlite": "#ff7f0e",
    "threadkeep-sqlite-full": "#ffbb78",
    "threadkeep-postgres": "#d62728",
    "threadkeep-pg-z256": "#ff9896",
    "threadkeep-redis": "#9467bd",
    "threadkeep-tiered": "#8c564b",
    "floor-postgres": "#999999",
    "floor-redis": "#bbbbbb",
    "floor-graph": "#dddddd",
}


def draw(results: Path = RESULTS, out: Path = IMAGES) -> list[Path]:
    """Draw every figure whose results file is in ``results`` into ``out``; the files written."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit(
            "the figures need matplotlib: pip install -e '.[bench]' (./dev installs it)"
        ) from exc
    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    conversation, servers, tiered = (
        load(name, results) for name in ("conversation.json", "servers.json", "tiered-10.json")
    )
    written = []
    if conversation or servers:
        written.append(_storage(conversation or {}, servers or {}, out / "storage.png"))
    if servers or tiered:
        written.append(_latency(servers, tiered, out / "latency.png"))
    if servers:
        written.append(_throughput(servers, out / "throughput.png"))
    return written


def _savers(results: dict[str, Any]) -> list[str]:
    return [name for name in stores(results) if not name.startswith("floor")]


def _style(name: str) -> dict[str, Any]:
    """LangGraph's savers dashed, threadkeep's solid."""
    return {
        "color": COLOURS.get(name),
        "linestyle": "--" if name.startswith("langgraph") else "-",
        "marker": "o",
    }


def _storage(conversation: dict[str, Any], servers: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for key, figures in conversation.items():
        if key != RUN and not key.startswith("floor"):
            name, k = key.split("@")
            series.setdefault(name, []).append((int(k), figures["bytes"]))
    for name in _savers(servers):
        series[name] = [
            (int(key[6:]), value) for key, value in servers[name].items() if key.startswith("bytes@")
        ]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    names = [name for name in [*stores(conversation), *_savers(servers)] if name in series]
    for name in sorted(names, key=lambda name: not name.startswith("langgraph")):  # LangGraph's first
        points = sorted(series[name])
        ax.plot([k for k, _ in points], [b for _, b in points], label=label(name), **_style(name))
    ax.set_xscale("log")
    ax.set_yscale("log")
    turns = sorted({k for points in series.values() for k, _ in points})
    ax.set_xticks(turns, [str(k) for k in turns])
    ax.minorticks_off()
    ax.set_xlabel("turns on one thread (K)")
    ax.set_ylabel("bytes stored")
    ax.set_title("Storage against conversation length (log-log)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _latency(servers: dict[str, Any] | None, tiered: dict[str, Any] | None, path: Path) -> Path:
    import matplotlib.pyplot as plt

    panels = [
        (results, title)
        for results, title in (
            (servers, f"one conversation of {max(_turns(servers, 'bytes'), default=40)} turns"),
            (tiered, f"{_arg(tiered, 'conversations', 32)} conversations of 10 turns at once"),
        )
        if results
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    for ax, (results, title) in zip(axes[0], panels, strict=True):
        names = _savers(results)
        width = 0.8 / len(names)
        for index, name in enumerate(names):
            xs = [call + (index - (len(names) - 1) / 2) * width for call in range(len(CALLS))]
            medians = [results[name][call] for call in CALLS]
            p99s = [results[name][f"{call}_p99"] for call in CALLS]
            ax.bar(xs, medians, width, color=COLOURS.get(name), label=label(name))
            ax.errorbar(
                xs,
                medians,
                yerr=[[0] * len(CALLS), [p - m for p, m in zip(p99s, medians, strict=True)]],
                fmt="none",
                ecolor="black",
                capsize=3,
                linewidth=1,
            )
        ax.set_xticks(range(len(CALLS)), list(CALLS.values()))
        ax.set_ylabel("ms per call (bar: median, whisker: p99)")
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    fig.suptitle("Per-call latency")
    return _save(fig, path)


def _throughput(servers: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    names = stores(servers)
    lengths = _turns(servers, "throughput")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    height = 0.8 / len(lengths)
    for index, turns in enumerate(lengths):
        ys = [row + (index - (len(lengths) - 1) / 2) * height for row in range(len(names))]
        rates = [servers[name][f"throughput@{turns}"] for name in names]
        bars = ax.barh(ys, rates, height, color=f"C{index}", label=f"{turns}-turn conversations")
        for bar, name in zip(bars, names, strict=True):
            if name.startswith("floor"):  # a yardstick, not a saver
                bar.set_alpha(0.45)
        ax.bar_label(bars, fmt="%.0f", fontsize="x-small", padding=2)
    ax.set_yticks(range(len(names)), [label(name) for name in names], fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("turns per second")
    ax.set_title(f"Throughput, {_arg(servers, 'conversations', 32)} conversations at once in one process")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _turns(results: dict[str, Any] | None, prefix: str) -> list[int]:
    """The conversation lengths of the figures named ``<prefix>@<K>`` in ``results``."""
    figures = next((v for k, v in (results or {}).items() if k != RUN), {})
    return sorted(int(key.split("@")[1]) for key in figures if key.startswith(prefix + "@"))


def _arg(results: dict[str, Any] | None, name: str, default: int) -> int:
    """An argument of the command that wrote ``results``, or the benchmark's default for it."""
    return int((results or {}).get(RUN, {}).get("args", {}).get(name, default))


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    # No timestamp or software tag in the file, so a redraw of the same figures is the same file.
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path

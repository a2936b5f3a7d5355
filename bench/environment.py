"""The machine and the versions a benchmark runs on (``./dev bench env``), recorded in every
results file the benchmarks write."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sqlite3

# The distributions whose versions decide the figures.
PACKAGES = (
    "threadkeep",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-postgres",
    "langgraph-checkpoint-sqlite",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "redis",
    "hiredis",
)


def describe() -> dict[str, str]:
    """Python, the CPU, the memory, SQLite, each of ``PACKAGES`` and the two servers' versions."""
    found = {
        "python": platform.python_version(),
        "system": platform.platform(terse=True),
        "cpu": f"{os.cpu_count()} x {_cpu_model()}",
        "memory": _memory(),
        "sqlite": sqlite3.sqlite_version,
    }
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    found["postgres server"] = _postgres_version()
    found["redis server"] = _redis_version()
    return found


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory() -> str:
    try:
        with open("/proc/meminfo") as info:
            kib = int(info.readline().split()[1])  # MemTotal
    except (OSError, ValueError, IndexError):
        return "unknown"
    return f"{kib / 2**20:.0f} GiB"


def _postgres_version() -> str:
    import psycopg

    from bench.servers import POSTGRES

    try:
        with psycopg.connect(POSTGRES, connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:
        return f"unreachable ({type(exc).__name__})"
    return str(row[0]) if row else "unknown"


def _redis_version() -> str:
    import redis

    from bench.servers import REDIS

    client = redis.Redis.from_url(REDIS, socket_timeout=3)
    try:
        return str(client.info("server")["redis_version"])
    except redis.RedisError as exc:
        return f"unreachable ({type(exc).__name__})"
    finally:
        client.close()

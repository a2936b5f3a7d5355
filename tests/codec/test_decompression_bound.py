"""SPEC C5: one bound on what a stored value may expand to, for every compressed form a read
accepts (``+zlib``, ``+zstd``), refused with CheckpointSerializationError before the memory is
spent: a 1.1 MB zlib value holding 1.1 GiB is refused having allocated a few MB.
"""

from __future__ import annotations

import asyncio
import tracemalloc
import zlib
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import zstandard
from langgraph.checkpoint.base import empty_checkpoint

from tests.providers import Opener
from threadkeep import CheckpointSerializationError, Settings
from threadkeep.codec import build_serde
from threadkeep.codec.serde import MAX_EXPANDED_BYTES, decompress

EXPANDED = MAX_EXPANDED_BYTES + (64 << 20)  # what each bomb holds: just past the bound
# A refused read may hold the stored bytes and a chunk or two of output; never the expansion.
SPENT_AT_MOST = 64 << 20


@cache
def bomb(suffix: str) -> bytes:
    """``EXPANDED`` zero bytes, zlib- or zstd-compressed (a zstd frame that states no size,
    as a streaming writer's)."""
    chunk = bytes(16 << 20)
    stream: Any = (
        zlib.compressobj(9) if suffix == "+zlib" else zstandard.ZstdCompressor(level=1).compressobj()
    )
    parts = [stream.compress(chunk) for _ in range(EXPANDED // len(chunk))]
    return b"".join([*parts, stream.flush()])


def peak_while(call: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """What ``call`` raised, and the most memory Python held meanwhile."""
    tracemalloc.start()
    try:
        call()
    except BaseException as exc:
        return exc, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return None, 0  # pragma: no cover - every call here is refused


class Planting:
    """A writer's serializer that stores ``payload`` under ``kind`` for the value "bomb"."""

    def __init__(self, kind: str, payload: bytes) -> None:
        self.stored = (kind, payload)
        self.plain = build_serde(compress_threshold=None)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.stored if obj == "bomb" else self.plain.dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.plain.loads_typed(data)


def plant(open_saver: Opener, suffix: str, where: str) -> dict[str, Any]:
    """A checkpoint of thread ``t`` holding the bomb as a channel value or a pending write."""
    writer = open_saver(
        settings=Settings(inline_compress_bytes=None), serde=Planting("json" + suffix, bomb(suffix))
    )
    start = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    values = {"big": "bomb"} if where == "channel" else {}
    checkpoint = {
        **empty_checkpoint(),
        "channel_values": values,
        "channel_versions": dict.fromkeys(values, "1"),
    }
    config: dict[str, Any] = writer.put(
        start, checkpoint, {"source": "loop", "step": 0}, dict.fromkeys(values, "1")
    )
    if where == "write":
        writer.put_writes(config, [("big", "bomb")], "task-1")
    return config


def read(saver: Any, config: dict[str, Any], how: str) -> Callable[[], Any]:
    async def alist() -> list[Any]:
        return [item async for item in saver.alist(None)]

    return {"get_tuple": lambda: saver.get_tuple(config), "alist": lambda: asyncio.run(alist())}[how]


@pytest.mark.providers("sqlite", "postgres")
@pytest.mark.parametrize(("where", "how"), [("channel", "get_tuple"), ("write", "alist")])
@pytest.mark.parametrize("suffix", ["+zlib", "+zstd"])
def test_c5_a_stored_compression_bomb_is_refused_before_its_memory_is_spent(
    open_saver: Opener, suffix: str, where: str, how: str
) -> None:
    config = plant(open_saver, suffix, where)
    reader = open_saver()
    refused, peak = peak_while(read(reader, config, how))
    assert isinstance(refused, CheckpointSerializationError), refused
    assert f"expands to more than {MAX_EXPANDED_BYTES} bytes" in refused.message
    assert refused.path.startswith("channel_values.big" if where == "channel" else "pending_writes")
    assert peak < SPENT_AT_MOST, f"{peak} bytes held to refuse {EXPANDED}"


# --- without a server ------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["+zlib", "+zstd"])
def test_c5_every_compressed_form_is_refused_past_the_one_bound_without_spending_it(suffix: str) -> None:
    refused, peak = peak_while(lambda: build_serde().loads_typed(("json" + suffix, bomb(suffix))))
    assert isinstance(refused, CheckpointSerializationError), refused
    assert "1 GiB" in refused.message
    assert peak < SPENT_AT_MOST


def test_c5_values_up_to_the_bound_read_back_in_every_form() -> None:
    value = b'"' + b"tides " * 400_000 + b'"'
    streamed = zstandard.ZstdCompressor().compressobj()
    forms = {
        "+zlib": zlib.compress(value),
        "+zstd": build_serde(compress_threshold=1).dumps_typed(value.decode()[1:-1])[1],
        "+zstd, size not stated": streamed.compress(value) + streamed.flush(),
    }
    for name, payload in forms.items():
        assert decompress(name[:5], payload) == value, name
    assert zstandard.frame_content_size(forms["+zstd, size not stated"]) == -1
    with pytest.raises(CheckpointSerializationError, match="corrupt"):
        decompress("+zstd", forms["+zstd, size not stated"][:-6])

"""Codecs: the faithful JSON codec, exception records, compression (SPEC section 2)."""

from threadkeep.codec.exceptions import CheckpointedException
from threadkeep.codec.faithful import FaithfulCodec
from threadkeep.codec.serde import (
    CompressingSerializer,
    FaithfulSerializer,
    build_serde,
    with_allowlist,
)

__all__ = [
    "CheckpointedException",
    "CompressingSerializer",
    "FaithfulCodec",
    "FaithfulSerializer",
    "build_serde",
    "with_allowlist",
]

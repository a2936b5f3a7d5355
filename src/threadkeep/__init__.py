"""threadkeep: durable, retention-managed memory for LangGraph agents.

graph.compile(checkpointer=threadkeep.open_checkpointer())
"""

from threadkeep.codec import CheckpointedException, FaithfulCodec
from threadkeep.core.identity import ANONYMOUS, operator_scope, user_scope
from threadkeep.errors import (
    CheckpointDeleteError,
    CheckpointSerializationError,
    CheckpointStoreFormatError,
    ConfigurationError,
    MissingExtraError,
    StaleStateError,
    StorageError,
    StorageForbiddenError,
    ThreadkeepError,
    ThreadRetentionError,
)
from threadkeep.providers import facts_of, open_checkpointer
from threadkeep.saver import ProviderFacts, ThreadkeepSaver
from threadkeep.settings import Settings

__all__ = [
    "ANONYMOUS",
    "CheckpointDeleteError",
    "CheckpointSerializationError",
    "CheckpointStoreFormatError",
    "CheckpointedException",
    "ConfigurationError",
    "FaithfulCodec",
    "MissingExtraError",
    "ProviderFacts",
    "Settings",
    "StaleStateError",
    "StorageError",
    "StorageForbiddenError",
    "ThreadRetentionError",
    "ThreadkeepError",
    "ThreadkeepSaver",
    "facts_of",
    "open_checkpointer",
    "operator_scope",
    "user_scope",
]

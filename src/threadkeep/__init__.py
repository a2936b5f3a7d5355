"""threadkeep: durable, retention-managed memory for LangGraph agents.

graph.compile(checkpointer=threadkeep.open_checkpointer())
"""

from threadkeep.codec import CheckpointedException, FaithfulCodec
from threadkeep.core.identity import ANONYMOUS, operator_scope, user_scope
from threadkeep.core.ledger import ToolCall
from threadkeep.core.retention import PlatformRetention, ThreadRetention, declare_retention
from threadkeep.errors import (
    CheckpointDeleteError,
    CheckpointSerializationError,
    CheckpointStoreFormatError,
    ConfigurationError,
    InvalidInputError,
    MissingExtraError,
    NoResumableTurnError,
    ParkRefusedError,
    StaleStateError,
    StorageError,
    StorageForbiddenError,
    StorageRefusedError,
    ThreadkeepError,
    ThreadRetentionError,
    ToolCallError,
    TurnFailedError,
)
from threadkeep.owners import RunGroup, RunOutcome, arun_agent, ask, run_agent
from threadkeep.providers import aopen_checkpointer, facts_of, open_checkpointer
from threadkeep.registry import close_savers, saver_for
from threadkeep.saver import ProviderFacts, ThreadkeepSaver
from threadkeep.settings import Settings
from threadkeep.sweep import SweepResult, register_live_thread_filter, sweep_checkpoints
from threadkeep.turns import ToolFailure, TurnManager, TurnResult, current_idempotency_key, replay_safe

__all__ = [
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

"""Turns (SPEC TM1-TM5): a user message as a turn with rollback, retry and resume, and tool
calls that never run twice. ``docs/turns.md`` tells how to use them."""

from threadkeep.turns.manager import TurnManager, TurnResult
from threadkeep.turns.plan import ToolFailure
from threadkeep.turns.replay import ReplaySafeTool, current_idempotency_key, ledger_scope, replay_safe

__all__ = [
    "ReplaySafeTool",
    "ToolFailure",
    "TurnManager",
    "TurnResult",
    "current_idempotency_key",
    "ledger_scope",
    "replay_safe",
]

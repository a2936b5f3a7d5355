"""Turns (SPEC TM1-TM5): a user message as a turn with rollback, retry and resume, and tool
calls that never run twice. ``docs/turns.md`` tells how to use them."""

from threadkeep.turns.manager import TurnManager, TurnResult
from threadkeep.turns.plan import ToolFailure

__all__ = ["ToolFailure", "TurnManager", "TurnResult"]

"""Atomix: timely, transactional tool use for LLM agents.

Tool calls run, but their effects settle only when the transaction's footprint is sealed
and per-resource frontiers show that no earlier conflicting work can still arrive.
"""

from atomix.decisions import AbortPlan, CommitPlan, Settlement, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import (
    AtomixError,
    IllegalTransition,
    ScopeError,
    ToolDefinitionError,
    TransactionAborted,
)
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.runtime import Runtime, current_transaction
from atomix.scopes import Scope, ScopePolicy, parse_scope
from atomix.tools import Ack, Call

__version__ = "0.1.0"

__all__ = [
    "AbortPlan",
    "AbortSource",
    "Ack",
    "AtomixError",
    "Call",
    "CommitPlan",
    "Effect",
    "EffectClass",
    "IllegalTransition",
    "Runtime",
    "RuntimeOptions",
    "Scope",
    "ScopeError",
    "ScopePolicy",
    "Settlement",
    "ToolDefinitionError",
    "TransactionAborted",
    "TransactionManager",
    "Wait",
    "__version__",
    "current_transaction",
    "parse_scope",
]

"""Atomix: timely, transactional tool use for LLM agents.

Tool calls run, but their effects settle only when the transaction's footprint is sealed
and per-resource frontiers show that no earlier conflicting work can still arrive.
"""

from atomix.decisions import AbortPlan, CommitPlan, Settlement, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import (
    AtomixError,
    CommitIncomplete,
    IllegalTransition,
    OutsideTransaction,
    ScopeError,
    ToolDefinitionError,
    TransactionAborted,
)
from atomix.handles import current_transaction
from atomix.log import LogBusy, LogError, TxLog
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.recovery import RecoveryReport, recover
from atomix.runtime import Runtime, TransactionExecutor
from atomix.savepoints import ASavepoint, Savepoint
from atomix.schemas import ToolSchema, function_schema, tool_schema
from atomix.scope_parsing import ScopePolicy, parse_scope
from atomix.scopes import Scope
from atomix.tools import Ack, Call, ScopeTemplate

__version__ = "0.1.0"

__all__ = [
    "ASavepoint",
    "AbortPlan",
    "AbortSource",
    "Ack",
    "AtomixError",
    "Call",
    "CommitIncomplete",
    "CommitPlan",
    "Effect",
    "EffectClass",
    "IllegalTransition",
    "LogBusy",
    "LogError",
    "OutsideTransaction",
    "RecoveryReport",
    "Runtime",
    "Savepoint",
    "RuntimeOptions",
    "Scope",
    "ScopeError",
    "ScopePolicy",
    "ScopeTemplate",
    "Settlement",
    "ToolDefinitionError",
    "ToolSchema",
    "TransactionAborted",
    "TransactionExecutor",
    "TransactionManager",
    "TxLog",
    "Wait",
    "__version__",
    "current_transaction",
    "function_schema",
    "parse_scope",
    "recover",
    "tool_schema",
]

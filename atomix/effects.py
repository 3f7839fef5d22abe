"""Effects: what one tool call does to the world, and how it settles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from atomix.scopes import Scope


class EffectClass(StrEnum):
    """How an effect settles.

    BUFFERABLE effects are not executed before commit; REVERSIBLE ones execute eagerly and are
    compensated at abort; IRREVERSIBLE ones wait at the gate and leave it only at commit.
    """

    BUFFERABLE = "bufferable"
    REVERSIBLE = "reversible"
    IRREVERSIBLE = "irreversible"


# Python 3.11's EnumType has a __getattr__, which makes every `EffectClass.BUFFERABLE` a slow
# lookup (a Python-level call; `python -m harness.bench` measures the hot paths); hot paths
# compare against these constants.
BUFFERABLE = EffectClass.BUFFERABLE
REVERSIBLE = EffectClass.REVERSIBLE
IRREVERSIBLE = EffectClass.IRREVERSIBLE


class AbortSource(StrEnum):
    """Why a transaction aborted."""

    TOOL_FAILURE = "tool_failure"
    LOSING_SPECULATION = "losing_speculation"
    STALE_READ = "stale_read"
    PRE_COMMIT_VETO = "pre_commit_veto"
    TIMEOUT = "timeout"
    SEAL_VIOLATION = "seal_violation"
    CANCELLED = "cancelled"  # its waiter was cancelled or interrupted (CancelledError, Ctrl-C)


#: What a compensation's key adds to its effect's key.
COMPENSATION_SUFFIX = ":compensate"


def compensation_key(effect_key: str) -> str:
    """The idempotency key of the compensation of the effect keyed `effect_key`.

    Derived from the effect's key alone, so the live abort and a recovery in another process
    (which reads the effect's key from the durable log) hand the compensating tool the same
    key (`Call.key`): a compensation that records it with its own change (a store's applied
    keys) is applied at most once, even when the process dies between it and its log mark.
    """
    return effect_key + COMPENSATION_SUFFIX


class BatchApplier(Protocol):
    """A substrate that applies several of one transaction's effects at once (e.g. one SQL transaction)."""

    def apply_batch(self, effects: Sequence[Effect]) -> None: ...


@dataclass(slots=True, eq=False, init=False)
class Effect:
    """One staged side effect.

    The core never calls `apply` or `compensate`; it only says, in a settlement plan, which
    effects a driver must apply, release or compensate, and in which order. `key` is the
    idempotency key: a substrate that sees the same key twice applies it once. A reversible
    effect always has a compensation and an irreversible one never has one.
    """

    tool: str
    effect_class: EffectClass
    scopes: tuple[Scope, ...]
    key: str
    apply: Callable[[], Any] | None
    compensate: Callable[[], Any] | None
    batch: BatchApplier | None
    payload: Any
    seq: int

    # Written out: every shimmed call makes one, and a generated __init__ pays a separate
    # __post_init__ call for the two checks.
    def __init__(
        self,
        tool: str,
        effect_class: EffectClass,
        scopes: tuple[Scope, ...],
        key: str,
        apply: Callable[[], Any] | None = None,
        compensate: Callable[[], Any] | None = None,
        batch: BatchApplier | None = None,
        payload: Any = None,
        seq: int = 0,
    ) -> None:
        if compensate is None:
            if effect_class is REVERSIBLE:
                raise ValueError(f"effect of {tool!r}: a reversible effect needs a compensation")
        elif effect_class is IRREVERSIBLE:
            raise ValueError(f"effect of {tool!r}: an irreversible effect cannot be compensated")
        self.tool = tool
        self.effect_class = effect_class
        self.scopes = scopes
        self.key = key
        self.apply = apply
        self.compensate = compensate
        self.batch = batch
        self.payload = payload
        self.seq = seq

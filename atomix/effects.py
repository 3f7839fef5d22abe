"""Effects: what one tool call does to the world, and how it settles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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


class AbortSource(StrEnum):
    """Why a transaction aborted."""

    TOOL_FAILURE = "tool_failure"
    LOSING_SPECULATION = "losing_speculation"
    STALE_READ = "stale_read"
    PRE_COMMIT_VETO = "pre_commit_veto"
    TIMEOUT = "timeout"
    SEAL_VIOLATION = "seal_violation"


class BatchApplier(Protocol):
    """A substrate that applies several of one transaction's effects at once (e.g. one SQL transaction)."""

    def apply_batch(self, effects: Sequence[Effect]) -> None: ...


@dataclass(slots=True, eq=False)
class Effect:
    """One staged side effect.

    The core never calls `apply` or `compensate`; it only says, in a settlement plan, which
    effects a driver must apply, release or compensate, and in which order. `key` is the
    idempotency key: a substrate that sees the same key twice applies it once.
    """

    tool: str
    effect_class: EffectClass
    scopes: tuple[Scope, ...]
    key: str
    apply: Callable[[], Any] | None = None
    compensate: Callable[[], Any] | None = None
    batch: BatchApplier | None = None
    payload: Any = None
    seq: int = field(default=0)

    def __post_init__(self) -> None:
        if self.effect_class is EffectClass.REVERSIBLE and self.compensate is None:
            raise ValueError(f"effect of {self.tool!r}: a reversible effect needs a compensation")
        if self.effect_class is EffectClass.IRREVERSIBLE and self.compensate is not None:
            raise ValueError(f"effect of {self.tool!r}: an irreversible effect cannot be compensated")

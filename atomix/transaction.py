"""Transaction records and the one table of lifecycle transitions."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from atomix.effects import AbortSource, Effect
from atomix.errors import IllegalTransition
from atomix.scopes import Scope


class TxState(StrEnum):
    OPEN = "open"
    SEALED = "sealed"
    WAITING = "waiting"
    COMMITTED = "committed"
    ABORTED = "aborted"


class TxEvent(StrEnum):
    SEAL = "seal"
    WAIT = "wait"
    COMMIT = "commit"
    ABORT = "abort"


#: Every legal lifecycle step. Anything not listed raises IllegalTransition.
TRANSITIONS: dict[tuple[TxState, TxEvent], TxState] = {
    (TxState.OPEN, TxEvent.SEAL): TxState.SEALED,
    (TxState.OPEN, TxEvent.ABORT): TxState.ABORTED,
    (TxState.SEALED, TxEvent.WAIT): TxState.WAITING,
    (TxState.SEALED, TxEvent.COMMIT): TxState.COMMITTED,
    (TxState.SEALED, TxEvent.ABORT): TxState.ABORTED,
    (TxState.WAITING, TxEvent.WAIT): TxState.WAITING,
    (TxState.WAITING, TxEvent.COMMIT): TxState.COMMITTED,
    (TxState.WAITING, TxEvent.ABORT): TxState.ABORTED,
}

TERMINAL = frozenset({TxState.COMMITTED, TxState.ABORTED})


def next_state(txid: int, state: TxState, event: TxEvent) -> TxState:
    """The state after `event`, or IllegalTransition (the caller then changes nothing)."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(txid, state.value, event.value) from None


@dataclass(slots=True, eq=False)
class Transaction:
    """The runtime's record of one transaction: its footprint, staged effects and state.

    Only the manager mutates it; drivers read it.
    """

    txid: int
    epoch: int
    trace: str
    group: str | None = None
    branch: int = 0
    state: TxState = TxState.OPEN
    reads: dict[Scope, int] = field(default_factory=dict)  # scope -> log position of first read
    effects: list[Effect] = field(default_factory=list)
    effect_scopes: set[Scope] = field(default_factory=set)
    # scopes with an externalised reversible effect -> log position when it became visible
    eager_scopes: dict[Scope, int] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    registered: set[Scope] = field(default_factory=set)  # index keys this tx holds
    abort_source: AbortSource | None = None
    abort_detail: str = ""
    duplicates_suppressed: int = 0
    finished: bool = False

    def footprint(self) -> set[Scope]:
        return set(self.reads) | self.effect_scopes

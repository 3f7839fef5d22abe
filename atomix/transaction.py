"""Transaction records and the one table of lifecycle transitions."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from atomix.effects import AbortSource, Effect
from atomix.errors import IllegalTransition
from atomix.scopes import Scope

if TYPE_CHECKING:
    from atomix.decisions import Settlement


class TxState(StrEnum):
    """Where a transaction is in its lifecycle; `TRANSITIONS` lists every legal step."""

    OPEN = "open"
    SEALED = "sealed"
    WAITING = "waiting"
    COMMITTED = "committed"
    ABORTED = "aborted"


class TxEvent(StrEnum):
    """What moves a transaction from one state to the next (see `TRANSITIONS`)."""

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

# Python 3.11's EnumType has a __getattr__, which makes every `TxState.OPEN` a slow lookup
# (a function call's worth; `python -m harness.bench` measures the hot paths); hot paths
# compare against these constants.
OPEN = TxState.OPEN
SEALED = TxState.SEALED
WAITING = TxState.WAITING
COMMITTED = TxState.COMMITTED
ABORTED = TxState.ABORTED
SEAL_EVENT = TxEvent.SEAL
WAIT_EVENT = TxEvent.WAIT
ABORT_EVENT = TxEvent.ABORT


def _after(event: TxEvent) -> dict[TxState, TxState]:
    return {state: nxt for (state, ev), nxt in TRANSITIONS.items() if ev is event}


#: TRANSITIONS by event, for hot paths that know theirs: `AFTER_SEAL.get(state)` is the next
#: state, or None where the table has no such step.
AFTER_SEAL = _after(TxEvent.SEAL)
AFTER_COMMIT = _after(TxEvent.COMMIT)
AFTER_ABORT = _after(TxEvent.ABORT)


def next_state(txid: int, state: TxState, event: TxEvent) -> TxState:
    """The state after `event`, or IllegalTransition (the caller then changes nothing)."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(txid, state.value, event.value) from None


@dataclass(slots=True, eq=False, init=False)
class Transaction:
    """The runtime's record of one transaction: its footprint, staged effects and state.

    Only the manager mutates it, except `waited`, which the driver adds its waiting to (in
    its own clock's units) and which the settlement reports; drivers read the rest. A driver
    may have the manager make its own handle class, a subclass, as the record (see
    `TransactionManager.begin`). Where it is registered follows from its footprint (or the
    one global scope), so it keeps no separate list of registrations. Once finished, its
    `settlement` is set, and the manager may forget it: the record stays with its holder.
    """

    txid: int
    epoch: int
    trace: str
    group: str | None
    branch: int
    state: TxState
    reads: dict[Scope, int]  # scope -> log position of first read
    staged: dict[str, Effect]  # idempotency key -> effect, in staging order
    effect_scopes: set[Scope]
    # scopes with an externalised reversible effect -> log position when it became visible
    eager_scopes: dict[Scope, int]
    abort_source: AbortSource | None
    abort_detail: str
    duplicates_suppressed: int
    finished: bool
    waited: float
    settlement: Settlement | None
    # Savepoints (nested blocks) as a tree: savepoint -> its parent (0: the transaction
    # itself); None until the first one. `owners`: effect key -> the savepoint that staged
    # it (effects staged outside every savepoint are not listed). `current_savepoint`: the
    # one a stage that names none belongs to (the innermost opened by a caller that nests
    # savepoints one at a time; see `TransactionManager.savepoint`).
    savepoints: dict[int, int] | None
    # Scopes claimed before they were touched (`TransactionManager.reserve`), held until finish.
    reserved: set[Scope] | None
    owners: dict[str, int] | None
    current_savepoint: int

    # Written out: one record is made per transaction, and the generated __init__ would take
    # every container as a parameter and call a factory for each.
    def __init__(
        self, txid: int, epoch: int, trace: str, group: str | None = None, branch: int = 0
    ) -> None:
        self.txid = txid
        self.epoch = epoch
        self.trace = trace
        self.group = group
        self.branch = branch
        self.state = OPEN
        self.reads = {}
        self.staged = {}
        self.effect_scopes = set()
        self.eager_scopes = {}
        self.abort_source = None
        self.abort_detail = ""
        self.duplicates_suppressed = 0
        self.finished = False
        self.waited = 0.0
        self.settlement = None
        self.savepoints = None
        self.reserved = None
        self.owners = None
        self.current_savepoint = 0

    @property
    def effects(self) -> list[Effect]:
        """The staged effects, in staging order."""
        return list(self.staged.values())

    def footprint(self) -> set[Scope]:
        return set(self.reads) | self.effect_scopes

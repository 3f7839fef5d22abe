"""Frontier-contract negative controls (paper Table 18): the real runtime with a wrong frontier.

The safety contract (docs/design.md, "The model", Frontier) says a resource's frontier passes
epoch e only when every transaction of an epoch below e registered there has settled. These
modes break that promise on purpose, and nothing else: each runs `tx-full`'s runtime
unmodified, except that the manager's ordering index (the `ScopeIndex` whose registrations say
which earlier epochs are still unsettled on a resource, and so where each frontier stands) is
replaced by a faulty one.

- `tx-frontier-premature`: a registration is forgotten the moment it is made, so every
  resource's frontier is already past an epoch while that epoch's transaction is still open:
  a later transaction commits without waiting for an earlier one that has not finalized.
- `tx-frontier-stalled`: a registration is never removed, so a resource's frontier never
  advances past an epoch that touched it: a later transaction on it waits until its own
  deadline (`settings.timeout_ms`) and aborts with `timeout`, on every attempt.

The seam: `TransactionManager` keeps its ordering index in the attribute `_order`, built in
its constructor, and reads it on every access and commit; the harness swaps it right after
the coordinator is built, before any transaction begins. No public hook exists (RuntimeOptions
has no index factory); `install_frontier_fault` refuses with a clear error if the attribute
is gone or already used, so a refactor of the manager cannot silently turn these modes into
tx-full.
"""

from __future__ import annotations

from typing import Any, Literal

from atomix.frontier import ScopeIndex
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.scopes import Scope
from atomix.transaction import Transaction
from harness.modes.base import ModeSettings
from harness.modes.tx import TxTrial
from harness.world.clock import VirtualClock
from harness.world.substrates import TrialEnv

FrontierFault = Literal["premature", "stalled"]


class PrematureFrontierIndex(ScopeIndex):
    """An ordering index that advances every frontier too early: it never holds a
    registration, so no transaction ever waits for an earlier epoch that has not finalized."""

    def register(
        self, scope: Scope, tx: Transaction, *, eager: bool = False, write: bool = True
    ) -> None:
        return None


class StalledFrontierIndex(ScopeIndex):
    """An ordering index whose frontiers never advance: a registration outlives its
    transaction, so every later epoch on that resource waits for it for ever."""

    def unregister(self, scope: Scope, tx: Transaction) -> None:
        return None


_INDEXES: dict[str, type[ScopeIndex]] = {
    "premature": PrematureFrontierIndex,
    "stalled": StalledFrontierIndex,
}


def install_frontier_fault(core: TransactionManager, fault: FrontierFault) -> None:
    """Replace `core`'s ordering index with the faulty one named by `fault`, before any
    transaction has begun."""
    if fault not in _INDEXES:
        raise ValueError(f"unknown frontier fault {fault!r}; allowed: {', '.join(_INDEXES)}")
    current = getattr(core, "_order", None)
    if type(current) is not ScopeIndex:
        raise RuntimeError(
            "TransactionManager no longer keeps its ordering index in `_order` (a ScopeIndex):"
            " the frontier-fault modes (harness/modes/tx_frontier_fault.py) need that seam"
        )
    if core.options.frontier != "per-resource" or core.active():
        raise RuntimeError("a frontier fault is installed on a fresh per-resource manager only")
    core._order = _INDEXES[fault]()


def frontier_fault_factory(fault: FrontierFault) -> Any:
    """A trial-mode factory: tx-full's trial with `fault` installed in its manager."""

    def factory(env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> TxTrial:
        trial = TxTrial(env, clock, settings, RuntimeOptions())
        install_frontier_fault(trial.co.core, fault)
        return trial

    factory.budget_for = TxTrial.budget_for  # type: ignore[attr-defined]
    return factory


premature = frontier_fault_factory("premature")
stalled = frontier_fault_factory("stalled")

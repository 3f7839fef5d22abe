"""What every session of one runtime shares: the core, its lock, and the wake-ups.

`SessionCoordinator` is the coordinator without the one thing that needs the session class
(`begin`, in `atomix.session.Coordinator`), so that the session's own layers
(`atomix.session_settle` and up) can name their coordinator's type without importing
`atomix.session`.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from atomix.decisions import Settlement
from atomix.instructions import Signal
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.scopes import Scope
from atomix.tools import ToolSpec

if TYPE_CHECKING:
    from atomix.log import TxLog

# Canonicalising these kinds consults the file system (symlinks, letter case): never memoised.
_FS_KINDS = frozenset({"fs", "sqlite"})
_SCOPE_MEMO_MAX = 1 << 16
# A bounded settlement history is trimmed once it holds this many more than it keeps.
_TRIM_SLACK = 64


class SessionCoordinator:
    """The shared, thread-safe home of one TransactionManager and its wake-ups.

    Every driver of one runtime goes through the same coordinator, so threads and asyncio
    tasks can share transactions' frontiers safely. Guarantees: every core access its
    sessions make holds `lock`; a settlement is kept (all, none, or the latest N, trimmed in
    batches) and every thread parked on a transaction it unblocks, or on the settled
    transaction itself, is woken; a scope text is canonicalised once unless its canonical form
    depends on the file system. `atomix.session.Coordinator` adds `begin`, which makes the
    sessions.
    """

    def __init__(
        self,
        options: RuntimeOptions | None = None,
        *,
        apply_attempts: int = 8,
        keep_settlements: bool | int = True,
        run_id: str | None = None,
    ) -> None:
        self.core = TransactionManager(options)
        # Part of every key: stores keep applied keys across restarts, and transaction
        # numbers restart at 1 in every process, so without it a new process's effects would
        # be dropped as duplicates of an old one's. Random unless the caller (a durable log,
        # or the harness, which wants reproducible keys) names one.
        self.run_id = secrets.token_hex(6) if run_id is None else run_id
        # Every core access holds it. The per-call paths take it with acquire() and release()
        # in try/finally: on CPython 3.11 a `with` block costs as much again (two special
        # method lookups and a three-argument __exit__ call), and a branch takes it thrice.
        self.lock = threading.RLock()
        self.apply_attempts = apply_attempts
        # keep_settlements: True keeps every settlement, False none, a number N the latest N
        # (trimmed in batches, so up to _TRIM_SLACK more between trims).
        if keep_settlements is not True and keep_settlements is not False and keep_settlements < 0:
            raise ValueError(f"keep_settlements must be True, False or a count >= 0, not {keep_settlements!r}")
        self.keep_settlements = bool(keep_settlements)
        self._keep_at_most = None if keep_settlements is True else int(keep_settlements)
        self.settlements: list[Settlement] = []
        self._wakers: dict[int, Signal] = {}
        self._scopes: dict[str, Scope] = {}
        # The durable log (driver-side I/O; None: nothing is logged and the steps skip it),
        # and the tools by name, from which recovery redoes a user tool's logged effect
        # (None for a name two different tools share).
        self.log: TxLog | None = None
        self.tools: dict[str, ToolSpec | None] = {}

    def scope(self, spec: str | Scope) -> Scope:
        """The core's canonical scope, memoised for texts whose canonical form depends on the
        text alone (names, URLs); file-system scopes are resolved afresh every time."""
        if spec.__class__ is str:
            found = self._scopes.get(spec)
            if found is not None:
                return found
            scope = self.core.scope(spec)
            if scope.kind not in _FS_KINDS:
                if len(self._scopes) >= _SCOPE_MEMO_MAX:
                    self._scopes.clear()
                self._scopes[spec] = scope
            return scope
        return self.core.scope(spec)

    def adopt(self, settled: list[Settlement], woken: list[int]) -> None:
        """Take note of settlements the core made on its own (losing branches with nothing to
        compensate, settled by resolve); the caller holds the lock."""
        if self.keep_settlements:
            self.settlements.extend(settled)
            self._trim()
        if self._wakers:
            self._wake(woken)
            # Also a thread still parked on a settled loser itself: it wakes to find it settled.
            self._wake([s.txid for s in settled])

    def _settled(self, settlement: Settlement, woken: Iterable[int]) -> None:
        # The core has dropped the record (forget=True): its holder keeps it, with the
        # settlement, and the core's map of live transactions does not grow a long-lived heap.
        if self.keep_settlements:
            history = self.settlements
            history.append(settlement)
            cap = self._keep_at_most
            if cap is not None and len(history) > cap + _TRIM_SLACK:
                del history[: len(history) - cap]
        if self._wakers:
            self._wake(woken)
            # Also a thread still parked on this transaction itself (settled by another one,
            # e.g. a losing branch aborted by resolve): it wakes to find it settled.
            self._wake((settlement.txid,))

    def _trim(self) -> None:
        cap = self._keep_at_most
        history = self.settlements
        if cap is not None and len(history) > cap + _TRIM_SLACK:
            del history[: len(history) - cap]

    def _park(self, txid: int, signal: Signal) -> None:
        self._wakers[txid] = signal

    def _wake(self, txids: Iterable[int]) -> None:
        for txid in txids:
            signal = self._wakers.pop(txid, None)
            if signal is not None:
                signal.set()


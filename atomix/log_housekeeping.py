"""The durable log's housekeeping: which stores a run delivered to, and when to prune them.

The log remembers the adapter stores each run delivered to (the ``stores`` table, written
with the intent that first names a store for the run). When a dead run has nothing
unfinished left (no transaction and no delivery waiting for a retry), the log records when it
first saw it so (``finished_runs``); once ``key_retention`` seconds have passed since then,
recovery may prune that run's applied keys from those stores, since no retry can come for them
any more, and the log forgets the run's stores (`pruned`). The stores of a dead run not yet
recorded as ended are also offered to recovery to sweep for the temporary files a killed
writer left.

Guarantees: a run's stores are offered for pruning only when the run is not this process's
own, has no row in ``txs`` or ``deliveries``, and ended at least ``key_retention`` seconds
ago; each store is recorded once per run. `LogHousekeeping` is a mixin of
`atomix.log.TxLog` and runs under its lock; this module never imports `atomix.log`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from atomix.log_format import store_of

__all__ = ["LogHousekeeping"]


class LogHousekeeping:
    """The housekeeping half of `atomix.log.TxLog` (see the module docstring).

    Guarantees: `dead_run_stores` never offers a live run's or an unfinished run's stores
    for pruning, nor any before ``key_retention`` seconds have passed since the run ended.
    """

    # What the host (TxLog) provides.
    own_runs: set[str]
    key_retention: float
    _lock: threading.Lock

    if TYPE_CHECKING:

        def _write(self, statements: Iterable[tuple[str, Any]], *, sync: bool = False) -> None: ...

        def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def _init_housekeeping(self) -> None:
        # Stores this object has recorded in `stores`, per run: (run_id, kind, path).
        self._stores: set[tuple[str, str, str]] = set()

    def _store_rows(self, run_id: str, rows: list[tuple[Any, ...]]) -> tuple[str, Any]:
        """The adapter stores these effects deliver to, not yet recorded for this run (so
        that their applied keys can be pruned once the run is over)."""
        new = []
        for row in rows:
            store = store_of(row[7])
            if store is not None and (run_id, *store) not in self._stores:
                self._stores.add((run_id, *store))
                new.append((run_id, *store))
        return ("INSERT OR IGNORE INTO stores VALUES (?, ?, ?)", new)

    def dead_run_stores(self) -> tuple[dict[str, list[tuple[str, str]]], list[tuple[str, str]]]:
        """For recovery's housekeeping: the stores of dead runs whose applied keys may now be
        pruned (nothing unfinished, `key_retention` passed), by run; and the stores of dead
        runs seen for the first time since they ended (to sweep for temporary files)."""
        now = time.time()
        with self._lock:
            busy = {r for (r,) in self._query("SELECT DISTINCT run_id FROM txs")}
            busy |= {r for (r,) in self._query("SELECT DISTINCT run_id FROM deliveries")}
            rows = self._query("SELECT run_id, kind, path FROM stores")
            seen = dict(self._query("SELECT run_id, at FROM finished_runs"))
            dead = {r for r, _, _ in rows} - self.own_runs
            fresh = sorted({(k, p) for r, k, p in rows if r in dead and r not in seen})
            ended = dead - busy
            new = [(r, now) for r in ended if r not in seen]
            if new:
                self._write([("INSERT OR IGNORE INTO finished_runs VALUES (?, ?)", new)])
            due = {r for r in ended if seen.get(r, now) <= now - self.key_retention}
        prunable: dict[str, list[tuple[str, str]]] = {}
        for run_id, kind, path in rows:
            if run_id in due:
                prunable.setdefault(run_id, []).append((kind, path))
        return prunable, fresh

    def pruned(self, run_id: str) -> None:
        """A dead run's applied keys are pruned from its stores: forget its stores."""
        with self._lock:
            self._write([
                ("DELETE FROM stores WHERE run_id = ?", (run_id,)),
                ("DELETE FROM finished_runs WHERE run_id = ?", (run_id,)),
            ])

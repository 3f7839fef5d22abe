"""Reading the durable log back for recovery, and salvaging what cannot be decoded.

`unfinished` decodes the unfinished transactions of dead runs, in the order recovery must
finish them. A record that cannot be decoded does not stop recovery: `quarantine_bad_records`
first moves it (and, for a transaction's record, that transaction's effects) to the
``quarantine`` table with the reason and the raw record, durably, and everything else
recovers; `quarantined` lists what is there.

Guarantees: `unfinished` never returns a live run's transaction (``exclude_runs``); it lists
committed transactions in commit order first, then the rest in the order they were logged,
each with its effects in the order they were logged; it raises `LogError`, never guesses, on a
record it cannot decode. Quarantine deletes nothing it has not copied into ``quarantine`` in
the same SQLite transaction. `LogReadback` is a mixin of `atomix.log.TxLog` and runs under
its lock; this module never imports `atomix.log`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from atomix.effects import EffectClass
from atomix.log_files import LogError
from atomix.log_format import (
    LoggedEffect,
    LoggedTx,
    Quarantined,
    bad_effect,
    bad_tx,
    record_text,
)

__all__ = ["LogReadback"]


class LogReadback:
    """The reading-back half of `atomix.log.TxLog` (see the module docstring).

    Guarantees: what `quarantine_bad_records` moved is durable before it returns, and
    `unfinished` afterwards decodes every remaining record of the runs it looked at.
    """

    # What the host (TxLog) provides.
    location: str
    _lock: threading.Lock
    _db_errors: tuple[type[Exception], ...]

    if TYPE_CHECKING:

        def _write(self, statements: Iterable[tuple[str, Any]], *, sync: bool = False) -> None: ...

        def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def quarantine_bad_records(self, *, exclude_runs: Iterable[str] = ()) -> list[Quarantined]:
        """Move every record of a dead run that cannot be decoded to the ``quarantine`` table,
        with the reason, so the rest can recover; returns what was moved now."""
        skip = set(exclude_runs)
        moved: list[Quarantined] = []
        with self._lock:
            try:
                txs = self._query(
                    "SELECT rowid, run_id, txid, epoch, trace, state, commit_seq FROM txs"
                )
                effects = self._query(
                    "SELECT rowid, run_id, txid, key, seq, tool, class, status, redo, problem "
                    "FROM effects"
                )
            except self._db_errors as exc:
                raise LogError(self.location, f"corrupt Atomix log: {exc}") from exc
            statements: list[tuple[str, Any]] = []
            bad_txs: set[tuple[Any, Any]] = set()
            for rowid, run_id, txid, epoch, trace, state, commit_seq in txs:
                if run_id in skip:
                    continue
                why = bad_tx(run_id, txid, epoch, trace, state, commit_seq)
                if why is None:
                    continue
                bad_txs.add((run_id, txid))
                record = {"run_id": run_id, "txid": txid, "epoch": epoch, "trace": trace,
                          "state": state, "commit_seq": commit_seq}
                item = Quarantined("tx", f"{run_id}/tx{txid}", why, record_text(record))
                moved.append(item)
                statements += self._quarantine_rows(item, "txs", rowid)
            for rowid, run_id, txid, key, seq, tool, cls, status, redo, problem in effects:
                if run_id in skip:
                    continue
                orphan = (run_id, txid) in bad_txs
                why = "its transaction's record is quarantined" if orphan else bad_effect(
                    key, seq, tool, cls, status, redo
                )
                if why is None:
                    continue
                record = {"run_id": run_id, "txid": txid, "key": key, "seq": seq, "tool": tool,
                          "class": cls, "status": status, "redo": redo, "problem": problem}
                item = Quarantined("effect", f"{run_id}/tx{txid} [{key}]", why, record_text(record))
                moved.append(item)
                statements += self._quarantine_rows(item, "effects", rowid)
            if statements:
                self._write(statements, sync=True)
        return moved

    @staticmethod
    def _quarantine_rows(item: Quarantined, table: str, rowid: int) -> list[tuple[str, Any]]:
        return [
            ("INSERT INTO quarantine (what, ident, reason, record, at) VALUES (?, ?, ?, ?, ?)",
             (item.what, item.ident, item.reason, item.record, time.time())),
            (f"DELETE FROM {table} WHERE rowid = ?", (rowid,)),
        ]

    def quarantined(self) -> list[Quarantined]:
        """Everything in quarantine (earlier recoveries' too), oldest first."""
        with self._lock:
            rows = self._query("SELECT what, ident, reason, record FROM quarantine ORDER BY n")
        return [Quarantined(*row) for row in rows]

    def unfinished(self, *, exclude_runs: Iterable[str] = ()) -> list[LoggedTx]:
        """Every unfinished transaction of other (dead) runs: committed ones in commit order
        first, then the rest in the order they were logged. A record that cannot be decoded
        raises LogError: `quarantine_bad_records` first moves such records aside."""
        skip = set(exclude_runs)
        with self._lock:
            try:
                txs = self._query("SELECT run_id, txid, epoch, trace, state, commit_seq FROM txs")
                effects = self._query(
                    "SELECT run_id, txid, key, seq, tool, class, status, redo, problem "
                    "FROM effects ORDER BY seq"
                )
            except self._db_errors as exc:
                raise LogError(self.location, f"corrupt Atomix log: {exc}") from exc
        out: dict[tuple[str, int], LoggedTx] = {}
        for run_id, txid, epoch, trace, state, commit_seq in txs:
            if run_id not in skip:
                out[(run_id, txid)] = LoggedTx(run_id, txid, epoch, trace, state, commit_seq)
        for run_id, txid, key, seq, tool, cls, status, redo, problem in effects:
            tx = out.get((run_id, txid))
            if tx is None:
                continue
            try:
                record = json.loads(redo)
                effect_class = EffectClass(cls)
            except (TypeError, ValueError) as exc:
                raise LogError(self.location, f"corrupt redo record of {key!r}: {exc}") from exc
            tx.effects.append(LoggedEffect(key, seq, tool, effect_class, status, record, problem))

        def order(tx: LoggedTx) -> tuple[int, int]:
            if tx.committed:
                return (0, tx.commit_seq or 0)
            return (1, tx.effects[0].seq if tx.effects else 0)

        return sorted(out.values(), key=order)

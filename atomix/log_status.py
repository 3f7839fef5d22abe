"""What a durable log holds, read without changing it: `atomix recover --status`.

`read_status(DIR)` opens the log read-only and without its directory lock, so it works while
a live process holds the log (it then says so). It lists the unfinished transactions
(pending), the deliveries that failed and wait for a retry, the dead letters and the
quarantined records; `LogStatus.lines()` renders them for a terminal of 80 columns and
`LogStatus.data()` as JSON data.

The logs kept in a coordinator's PostgreSQL database are read the same way, by the same
queries (`fill_status`), in `atomix.coordinator.db_log_admin.log_statuses` (``atomix recover
--status --coordinator URL``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from atomix.log_files import (
    ID_FILE,
    LOCK_FILE,
    LOG_FILE,
    LogError,
    LogLost,
    check_sidecar,
    lost_body,
    lost_wal,
)
from atomix.log_format import SETTLED, Quarantined

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

WIDTH = 80


@dataclass(frozen=True, slots=True)
class PendingTx:
    """An unfinished transaction: its state and how many of its effects are not settled."""

    tx: str
    state: str
    effects: int
    unsettled: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """A delivery that failed (retried: waiting for its next attempt; dead: given up)."""

    tx: str
    key: str
    tool: str
    attempts: int
    last_error: str
    when: float | None  # retried: when the next attempt is due (None: at the next recovery);
    # dead: when it was given up


@dataclass(slots=True)
class LogStatus:
    """A durable log's contents that need attention (see the module docstring)."""

    log: str
    held_by: str | None = None  # a live process holds the log (it may change meanwhile)
    pending: list[PendingTx] = field(default_factory=list)
    retried: list[Delivery] = field(default_factory=list)
    dead: list[Delivery] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.pending or self.retried or self.dead or self.quarantined)

    def data(self) -> dict[str, Any]:
        return {
            "log": self.log,
            "held_by": self.held_by,
            "pending": [asdict(p) for p in self.pending],
            "retried": [asdict(d) for d in self.retried],
            "dead": [asdict(d) for d in self.dead],
            "quarantined": [asdict(q) for q in self.quarantined],
        }

    def lines(self, width: int = WIDTH) -> list[str]:
        now = time.time()
        out = [_cut(f"log {self.log}", width)]
        if self.held_by:
            out.append(_cut(f"in use by a live process ({self.held_by}): its work may change", width))
        out.append(
            f"{len(self.pending)} pending, {len(self.retried)} retried, {len(self.dead)} dead, "
            f"{len(self.quarantined)} quarantined"
        )
        if self.pending:
            out += ["", "pending (unfinished transactions):", f"  {'transaction':<34} {'state':<10} unsettled"]
            out += [
                _cut(f"  {p.tx:<34} {p.state:<10} {p.unsettled} of {p.effects}", width)
                for p in self.pending
            ]
        if self.retried:
            out += ["", "retried (delivery failed, tried again later):"]
            for d in self.retried:
                due = "next recovery" if d.when is None else f"in {max(0.0, d.when - now):.0f} s"
                out.append(_cut(f"  {d.tx} {d.tool}: {d.attempts} attempt(s), next {due}", width))
                out += _detail(f"key {d.key}", width) + _detail(d.last_error, width)
        if self.dead:
            out += ["", "dead letters (delivery given up):"]
            for d in self.dead:
                out.append(_cut(f"  {d.tx} {d.tool}: {d.attempts} attempt(s)", width))
                out += _detail(f"key {d.key}", width) + _detail(d.last_error, width)
        if self.quarantined:
            out += ["", "quarantined (could not be decoded; not recovered):"]
            for q in self.quarantined:
                out.append(_cut(f"  {q.what} {q.ident}", width))
                out += _detail(q.reason, width)
        if self.empty:
            out.append("nothing pending")
        return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _detail(text: str, width: int) -> list[str]:
    return [_cut("    " + text.replace("\n", " "), width)]


def read_status(directory: str | os.PathLike[str]) -> LogStatus:
    """The status of the log in `directory`, read-only (see the module docstring). LogError
    if there is no log there or it cannot be read; `LogLost` if its body or WAL was lost."""
    directory = Path(directory)
    path = directory / LOG_FILE
    if not directory.is_dir():
        raise LogError(directory, "no such log directory")
    if not path.is_file():
        raise LogError(directory, f"no Atomix log here ({LOG_FILE} is missing)")
    held_by = _holder(directory / LOCK_FILE)
    sidecar = check_sidecar(directory)
    wal_missing = not (directory / (LOG_FILE + "-wal")).exists()
    status = LogStatus(str(directory), held_by)
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error as exc:
        raise LogError(path, f"cannot open the log read-only: {exc}") from exc
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if sidecar is not None and not tables:
            if wal_missing:
                raise LogLost(directory / (LOG_FILE + "-wal"), lost_wal(directory, sidecar))
            raise LogLost(path, lost_body(directory, str(sidecar["log"])))
        if "meta" not in tables or "txs" not in tables:
            raise LogError(path, "not an Atomix log (a SQLite database without its tables)")
        meta = dict(conn.execute("SELECT name, value FROM meta"))
        if sidecar is not None and held_by is None:
            if meta.get("log_id") != sidecar["log"]:
                raise LogLost(path, lost_body(directory, str(sidecar["log"]), found=meta.get("log_id")))
            if wal_missing and meta.get("token") != sidecar.get("token"):
                raise LogLost(directory / (LOG_FILE + "-wal"), lost_wal(directory, sidecar))
        fill_status(status, lambda sql: conn.execute(sql).fetchall(), deliveries="deliveries" in tables)
    except sqlite3.Error as exc:
        raise LogError(path, f"corrupt or unreadable Atomix log: {exc}") from exc
    finally:
        conn.close()
    return status


def fill_status(
    status: LogStatus, query: Callable[[str], Sequence[Sequence[Any]]], *, deliveries: bool = True
) -> None:
    """Fill `status` from a log's tables: `query` runs one statement (the log's tables, either
    store: SQLite's and PostgreSQL's spelling alike) and returns its rows. `deliveries`: the
    log has the retry tables (a log older than them has not)."""
    counts: dict[tuple[str, int], list[int]] = {}
    for run_id, txid, st in query("SELECT run_id, txid, status FROM effects"):
        slot = counts.setdefault((run_id, txid), [0, 0])
        slot[0] += 1
        slot[1] += st not in SETTLED
    for run_id, txid, state in query(
        "SELECT run_id, txid, state FROM txs ORDER BY commit_seq IS NULL, commit_seq, rowid"
    ):
        n, left = counts.get((run_id, txid), [0, 0])
        status.pending.append(PendingTx(f"{run_id}/tx{txid}", str(state), n, left))
    if not deliveries:
        return
    for run_id, txid, key, tool, attempts, error, due in query(
        "SELECT d.run_id, d.txid, d.key, coalesce(e.tool, '?'), d.attempts, d.last_error, "
        "d.next_at FROM deliveries d LEFT JOIN effects e "
        "ON e.run_id = d.run_id AND e.txid = d.txid AND e.key = d.key ORDER BY d.rowid"
    ):
        status.retried.append(Delivery(f"{run_id}/tx{txid}", key, tool, attempts, error or "", due))
    for run_id, txid, key, tool, attempts, error, died in query(
        "SELECT run_id, txid, key, tool, attempts, last_error, died FROM dead_letters ORDER BY died"
    ):
        status.dead.append(Delivery(f"{run_id}/tx{txid}", key, tool, attempts, error or "", died))
    status.quarantined = [
        Quarantined(*row) for row in query("SELECT what, ident, reason, record FROM quarantine ORDER BY n")
    ]


def _holder(lock: Path) -> str | None:
    """Who holds the log's directory lock (its pid text), or None if nobody does."""
    if fcntl is None or not lock.exists():
        return None
    with open(lock, "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            return fh.read().strip() or "another process"
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None


__all__ = ["ID_FILE", "Delivery", "LogStatus", "PendingTx", "fill_status", "read_status"]

"""The logs in a coordinator's PostgreSQL database, as a whole: read their status, sweep them.

- `log_statuses(url)`: what ``atomix recover --status DIR`` shows for a directory, for every
  log in the database (``atomix recover --status --coordinator URL``): unfinished
  transactions, deliveries waiting for a retry, dead letters, quarantined records. Read-only
  (a read-only transaction per log, one snapshot each) and without any log's lock, so it
  works while a live process holds a log, and then says which process (the lock's holder,
  and the member that names the log).
- `sweep_logs(url, busy)`: ``atomix recover --coordinator URL``'s clean-up (see
  `atomix.coordinator.db_log`): every log not in `busy` (the logs of live or fenced members)
  whose lock is free is recovered (built-in adapters' effects; its key housekeeping too) and
  closed, which drops it if it is then finished. A log whose lock is held is a live
  process's, never touched.

Guarantees: `log_statuses` writes nothing and takes no log's lock; `sweep_logs` opens a log
only through `CoordinatorLog` (its lock: one opener at a time), so it never drops a log
another process holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atomix.coordinator.db_log import (
    KEYS,
    LOCK_CLASS,
    LOST,
    WORK,
    CoordinatorLog,
    NoSuchLog,
    _psycopg,
    locator,
)
from atomix.coordinator.store import CoordinatorError, safe_url
from atomix.log import LogBusy, LogError
from atomix.log_status import LogStatus, fill_status
from atomix.recovery import RecoveryReport, recover

__all__ = ["SweptLog", "log_statuses", "sweep_logs"]

_POSTGRES = ("postgresql://", "postgres://")


@dataclass(frozen=True, slots=True)
class SweptLog:
    """A log `sweep_logs` opened: dropped (finished), or kept and why."""

    log: str
    dropped: bool
    #: Its recovery (None: it could not be opened, `problem` says why).
    report: RecoveryReport | None
    #: Why it was kept (`CoordinatorLog.kept`), or why it could not be opened.
    problem: str | None = None

    @property
    def waits_for_pruning(self) -> bool:
        """Kept only until its runs' applied keys are pruned (key_retention): nothing to do."""
        return not self.dropped and self.problem == KEYS

    @property
    def needs_work(self) -> bool:
        """Kept with work for a program or a human (see ``atomix recover --status``), or
        not a log this Atomix can recover."""
        return not self.dropped and (self.report is None or self.problem == WORK)

    def line(self) -> str:
        """One line for a terminal."""
        if self.dropped:
            return f"log {self.log}: finished, removed"
        if self.report is None:
            return f"log {self.log}: kept, cannot be recovered: {self.problem}"
        if self.problem == LOST:
            return f"log {self.log}: recovered, could not be removed (warned why); the next sweep tries"
        if self.waits_for_pruning:
            return f"log {self.log}: kept until its runs' applied keys are pruned (key_retention)"
        return (
            f"log {self.log}: kept, it holds work for its program or a human "
            "(atomix recover --status --coordinator URL lists it)"
        )


def _connect(url: str, what: str) -> Any:
    if not isinstance(url, str) or not url.startswith(_POSTGRES):
        raise ValueError(
            f"{what}: the logs kept in a coordinator's database need a 'postgresql://USER@HOST/DB' "
            f"URL, not {safe_url(url)!r}"
        )
    pg = _psycopg()
    try:
        return pg.connect(url, autocommit=True)
    except pg.Error as exc:
        raise CoordinatorError(f"{what}: cannot reach {safe_url(url)}: {exc}") from exc


def _logs(conn: Any) -> list[tuple[int, str]]:
    """The registered logs (number, name), oldest first; none without the registry."""
    (registry,) = conn.execute("SELECT to_regclass('atomix_log.logs')").fetchone()
    if registry is None:
        return []
    return [(int(n), str(name)) for n, name in conn.execute("SELECT n, name FROM atomix_log.logs ORDER BY n")]


def _holders(conn: Any) -> dict[int, str]:
    """The logs whose lock a live connection holds: number -> who (the member naming the log,
    if the coordinator has one, else the server process of the connection)."""
    held = {
        int(n): int(pid)
        for n, pid in conn.execute(
            "SELECT objid::bigint, pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid "
            "AND objsubid = 2 AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_CLASS,),
        )
    }
    members: dict[str, str] = {}
    (table,) = conn.execute("SELECT to_regclass('atomix_members')").fetchone()
    if table is not None:
        for ident, pid, host, log_dir in conn.execute(
            "SELECT id, pid, host, log_dir FROM atomix_members WHERE log_dir IS NOT NULL ORDER BY id"
        ):
            members[str(log_dir)] = f"member {ident}: pid {pid} on {host}"  # the newest wins
    names = dict(_logs(conn))
    return {n: members.get(locator(names.get(n, "")), f"server pid {pid}") for n, pid in held.items()}


def log_statuses(url: str) -> list[LogStatus]:
    """The status of every log in the coordinator's database at `url`, oldest first (see the
    module docstring). ValueError for a URL that is not ``postgresql://``; CoordinatorError if
    the database cannot be reached or read."""
    what = "atomix recover --status --coordinator"
    conn = _connect(url, what)
    pg = _psycopg()
    out: list[LogStatus] = []
    try:
        with conn:
            conn.execute("SET default_transaction_read_only TO on")
            holders = _holders(conn)
            for number, name in _logs(conn):
                status = LogStatus(locator(name), holders.get(number))
                try:
                    with conn.transaction():
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        # Shared with readers, exclusive for a drop (db_log): a log is read
                        # whole or not at all, and a reader never deadlocks a drop.
                        conn.execute("SELECT pg_advisory_xact_lock_shared(%s, 0)", (LOCK_CLASS,))
                        if conn.execute("SELECT 1 FROM atomix_log.logs WHERE n = %s", (number,)).fetchone() is None:
                            continue  # dropped meanwhile: finished
                        conn.execute(f"SET LOCAL search_path TO atomix_log_{number}")
                        fill_status(status, lambda sql: conn.execute(sql).fetchall())
                except (pg.errors.UndefinedTable, pg.errors.InvalidSchemaName):
                    continue  # not a whole log (never finished being made): nothing to show
                out.append(status)
    except pg.Error as exc:
        raise CoordinatorError(f"{what}: cannot read the logs in {safe_url(url)}: {exc}") from exc
    return out


def sweep_logs(url: str, busy: set[str]) -> list[SweptLog]:
    """Recover and drop the finished logs in the coordinator's database at `url` that no live
    process holds (see the module docstring); `busy`: the locations of logs to leave alone
    (those of live or fenced members). What it opened, oldest first."""
    what = "atomix recover --coordinator"
    conn = _connect(url, what)
    pg = _psycopg()
    try:
        with conn:
            logs = _logs(conn)
    except pg.Error as exc:
        raise CoordinatorError(f"{what}: cannot read the logs in {safe_url(url)}: {exc}") from exc
    out: list[SweptLog] = []
    for _, name in logs:
        if locator(name) in busy:
            continue
        try:
            log = CoordinatorLog(url, name, create=False)
        except (LogBusy, NoSuchLog):
            continue  # a live process holds it, or it was dropped meanwhile
        except LogError as exc:  # not a log this Atomix reads: for a human
            out.append(SweptLog(locator(name), False, None, str(exc)))
            continue
        try:
            report = recover(log)
        finally:
            log.close()
        out.append(SweptLog(log.location, log.dropped, report, log.kept))
    return out

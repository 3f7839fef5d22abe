"""The durable transaction log: what a crashed process leaves behind for recovery.

One SQLite database (``atomix-log.sqlite3``) in a directory the user names. Drivers write it
(the core stays pure): the session's step generators call the record points below, and
`atomix.recovery` reads it back in a new process. What a row holds (statuses, redo records)
is `atomix.log_format`; this module is the store.

Record points, per transaction that has at least one effect (read-only transactions are never
logged):

- ``call_started`` - a reversible call, BEFORE it runs (durable), with its arguments and its
  before-image, so a crash mid-call can still be compensated; ``call_returned`` - its result.
- ``intent`` - every staged effect with its idempotency key and a redo record (a JSON
  description a new process can act on, see `describe_effect`), before commit starts.
- ``committed`` - the commit point: written (durable) after the core decided CommitPlan and
  before the first apply or release. Recovery finishes exactly the transactions with this mark.
- ``settled`` - one step's effects applied / released / failed, or one compensation done.
- ``done`` - the transaction's end: its rows are deleted, so the log holds only unfinished work.

Durability (``durable=True``, the default): the log runs in WAL mode; the two records whose loss
could lose or strand an effect - the committed mark and a reversible call's start - are
committed with ``synchronous=FULL`` (fsync of the WAL, which also makes every earlier record
durable, since the WAL is written in order). The other records ride on the next fsync: losing
one to a power cut only means recovery re-delivers an effect by its key (the stores drop it as
a duplicate) or forgets an unfinished, uncommitted intent. ``durable=False`` never fsyncs: it
survives a killed process (the OS keeps the pages), not a power cut.

One process at a time: opening takes an exclusive lock on ``atomix-log.lock`` (released when
the process dies, however it dies). A second opener, in this or another process, is refused
with `LogBusy` - so recovery can never abort a live process's in-flight transactions.

A lost log is refused, never read as empty (`LogLost`): the sidecar ``atomix-log.id`` holds
the log's identity and a token that the log also writes into the database after each of its
own checkpoints (SQLite's automatic ones are off). A database file that is missing, empty or
of another identity, or a missing WAL file while the database does not hold the sidecar's
token (so the WAL held records no checkpoint had copied), is a lost log; see
`atomix.log_files`.

`TxLog` is assembled from one module per job: this one opens, writes and closes the log (the
record points and the session's hooks); `atomix.log_readback` reads it back for recovery and
quarantines a record that cannot be decoded (reported; everything else recovers);
`atomix.log_retries` keeps a delivery that failed at commit, retries it with backoff under the
same key and dead-letters it after ``max_delivery_attempts``; `atomix.log_housekeeping`
remembers each run's stores so that recovery can prune a finished dead run's applied keys
after ``key_retention`` seconds and sweep the temporary files a killed writer left.
"""

from __future__ import annotations

import itertools
import os
import secrets
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from atomix.effects import REVERSIBLE, Effect, EffectClass
from atomix.log_files import (
    ID_FILE,
    LOCK_FILE,
    LOG_FILE,
    LogBusy,
    LogError,
    LogLost,
    check_sidecar,
    open_database,
    take_lock,
    write_sidecar,
)
from atomix.log_format import (
    APPLIED,
    CALLED,
    CALLING,
    COMPENSATED,
    FAILED,
    RELEASED,
    RESIDUE,
    STAGED,
    TX_COMMITTED,
    TX_INTENT,
    TX_OPEN,
    LoggedSession,
    describe_effect,
    tool_redo,
)
from atomix.log_housekeeping import LogHousekeeping
from atomix.log_readback import LogReadback
from atomix.log_retries import DeliveryRetries, forget_rows
from atomix.tools import Call

if TYPE_CHECKING:
    from atomix.tools import ToolSpec

#: Records written between two of the log's own checkpoints (see TxLog._checkpoint).
CHECKPOINT_EVERY = 1000

__all__ = ["ID_FILE", "LOCK_FILE", "LOG_FILE", "LogBusy", "LogError", "LogLost", "TxLog", "crash_hook"]


#: Test hook: called as ``crash_hook(point, detail)`` at each named point of a logged
#: transaction (the kill test sets it in a child process to SIGKILL itself there). Points:
#: call.logged, call.ran, call.returned, intent.written, commit.marked, step.applied,
#: step.marked, commit.applied, compensate.ran (the compensation ran, its mark not yet
#: written), compensate.done, abort.compensated.
crash_hook: Callable[[str, str], None] | None = None


def _at(point: str, detail: str = "") -> None:
    hook = crash_hook
    if hook is not None:
        hook(point, detail)



class TxLog(LogReadback, DeliveryRetries, LogHousekeeping):
    """The durable transaction log in `directory` (see the module docstring).

    Guarantees: a transaction's committed mark is on disk (``durable=True``: fsynced) before
    its first effect is applied or released, and all its effects' redo records are on disk
    before the mark; a reversible call's record is on disk before the call runs. Thread-safe
    (one connection under one lock); one open `TxLog` per directory at a time (`LogBusy`).
    A log whose body or WAL was lost is refused (`LogLost`); a failed delivery stays in the
    log until it lands or is dead-lettered (``max_delivery_attempts`` deliveries in all).

    The store is SQLite here; a subclass keeps the same records elsewhere by overriding the
    storage methods (`_query`, `_write`, `_close_store`, `_db_errors`) and calling
    `_configure` and `_start` from its own ``__init__`` (`atomix.coordinator.db_log`).
    """

    #: What a read or write of the store raises when the store fails.
    _db_errors: tuple[type[Exception], ...] = (sqlite3.Error,)
    #: Where the log is, as the coordinator records it (a directory's path here).
    location: str
    #: How this log's run identities begin (a store shared by many logs makes it unique).
    _run_prefix = "r"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        durable: bool = True,
        create: bool = True,
        journal: str = "wal",
        max_delivery_attempts: int = 5,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 60.0,
        key_retention: float = 86400.0,
    ) -> None:
        # journal: "wal" (default: one fsync per durable record, measured in harness.bench.runtime) or
        # "delete" (SQLite's rollback journal: several fsyncs per durable record).
        if journal not in ("wal", "delete"):
            raise ValueError(f"journal must be 'wal' or 'delete', not {journal!r}")
        self._configure(
            durable=durable, max_delivery_attempts=max_delivery_attempts, retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max, key_retention=key_retention,
        )
        self.directory = Path(directory)
        self.location = str(self.directory)
        self.journal = journal
        path = self.directory / LOG_FILE
        if not create:
            if not self.directory.is_dir():
                raise LogError(self.directory, "no such log directory")
            if not path.is_file():
                raise LogError(self.directory, f"no Atomix log here ({LOG_FILE} is missing)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_fh: IO[str] | None = take_lock(self.directory / LOCK_FILE)
        wal_missing = not path.with_name(LOG_FILE + "-wal").exists()
        self._lock = threading.Lock()
        try:
            # Before SQLite touches the files: it would make a missing body or WAL look empty.
            sidecar = check_sidecar(self.directory)
            self._conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self.log_id = open_database(self._conn, self.directory, self.journal, sidecar, wal_missing)
            self._rotate_token()
        except sqlite3.Error as exc:
            self._release_lock()
            raise LogError(path, f"corrupt or unreadable Atomix log: {exc}") from exc
        except LogError as exc:
            if isinstance(exc, LogLost) and getattr(self, "_conn", None) is not None:
                self._conn.close()
                wal = path.with_name(LOG_FILE + "-wal")
                if wal_missing and wal.exists() and wal.stat().st_size == 0:
                    wal.unlink()  # the empty one reading made: refused alike the next time
            self._release_lock()
            raise
        # The synchronous level of ordinary records; the commit point is raised to FULL.
        self._low = "NORMAL" if durable else "OFF"
        self._conn.execute(f"PRAGMA synchronous={self._low}")
        self._writes = 0  # since the last checkpoint
        self._start()

    # -- what every store shares (a store subclass calls these from its own __init__) ----------
    def _configure(
        self,
        *,
        durable: bool,
        max_delivery_attempts: int,
        retry_backoff: float,
        retry_backoff_max: float,
        key_retention: float,
    ) -> None:
        """Check and keep the settings every store has (ValueError naming a bad one)."""
        if not isinstance(max_delivery_attempts, int) or max_delivery_attempts < 1:
            raise ValueError(f"max_delivery_attempts must be an int >= 1, not {max_delivery_attempts!r}")
        for name, value in (("retry_backoff", retry_backoff), ("retry_backoff_max", retry_backoff_max),
                            ("key_retention", key_retention)):
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
        self.durable = durable
        #: Deliveries in all (the commit's own counts as the first) before a dead letter.
        self.max_delivery_attempts = max_delivery_attempts
        self.retry_backoff = float(retry_backoff)
        self.retry_backoff_max = float(retry_backoff_max)
        #: Seconds a finished dead run's applied keys are kept in the stores before pruning.
        self.key_retention = float(key_retention)

    def _start(self) -> None:
        """The in-memory state, once the store is open: sequence numbers go on from the log's."""
        row = self._query("SELECT max(seq) FROM effects")[0]
        self._seq = itertools.count(_int_or(row[0], 0) + 1)
        row = self._query("SELECT max(commit_seq) FROM txs")[0]
        self._commit_seq = itertools.count(_int_or(row[0], 0) + 1)
        #: Runs started through this object: live, so recovery leaves them alone.
        self.own_runs: set[str] = set()
        # (run_id, txid) -> state, for the transactions of live runs that have rows.
        self._live: dict[tuple[str, int], str] = {}
        self.closed = False
        #: Log writes that failed past the commit decision (also warned about).
        self.errors: list[Exception] = []
        self._init_housekeeping()
        self._init_retries()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One read (SQLite's spelling: ``?`` placeholders); its rows. Caller locks."""
        return self._conn.execute(sql, params).fetchall()

    def _rotate_token(self) -> None:
        """A new token: into the sidecar first (durably), then into the database. From here on,
        the database holds this token only once a checkpoint copied the whole WAL (a closing
        connection's), so a missing WAL with another token in the body means lost records."""
        token = secrets.token_hex(8)
        write_sidecar(self.directory, self.log_id, token, durable=self.durable)
        self._conn.execute("PRAGMA synchronous=FULL")
        try:
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('token', ?)", (token,))
        finally:
            self._conn.execute(f"PRAGMA synchronous={getattr(self, '_low', 'FULL')}")

    def _checkpoint(self) -> None:
        """Fold the WAL into the body (the log's own checkpoint, every CHECKPOINT_EVERY writes,
        since SQLite's automatic ones are off), then a new token. Caller holds the lock."""
        self._writes = 0
        if self.journal != "wal":
            return
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self._rotate_token()

    def begin_run(self) -> str:
        """Allocate this process run's identity (part of every idempotency key), persisted.

        A sequence number makes it unique per log; the random part keeps it unique if the
        log directory is ever deleted while the stores keep their applied keys.
        """
        with self._lock:
            # The directory lock makes this process the log's only writer: max + 1 is unique.
            n = (self._query("SELECT max(n) FROM runs")[0][0] or 0) + 1
            run_id = f"{self._run_prefix}{n}-{secrets.token_hex(3)}"
            self._write(
                [("INSERT INTO runs (n, run_id, pid, started) VALUES (?, ?, ?, ?)",
                  (n, run_id, os.getpid(), time.time()))],
                sync=True,
            )
            self.own_runs.add(run_id)
            return run_id

    # -- writing ------------------------------------------------------------------------------
    def _write(self, statements: Iterable[tuple[str, Any]], *, sync: bool = False) -> None:
        """One SQLite transaction; `sync` makes it (and all before it) durable. Caller locks."""
        conn = self._conn
        if sync and self.durable:
            conn.execute("PRAGMA synchronous=FULL")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    if params.__class__ is list:
                        conn.executemany(sql, params)
                    else:
                        conn.execute(sql, params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            if sync and self.durable:
                conn.execute(f"PRAGMA synchronous={self._low}")
        self._writes += 1
        if self._writes >= CHECKPOINT_EVERY:
            self._checkpoint()

    def _tx_row(self, tx: LoggedSession, state: str) -> tuple[str, Any]:
        return (
            "INSERT INTO txs (run_id, txid, epoch, trace, state, updated) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (run_id, txid) DO UPDATE SET state = excluded.state, updated = excluded.updated",
            (tx.co.run_id, tx.txid, tx.epoch, tx.trace, state, time.time()),
        )

    def _effect_rows(self, tx: LoggedSession) -> list[tuple[Any, ...]]:
        rows = []
        tools = getattr(tx.co, "tools", None) or {}
        for effect in tx.staged.values():
            redo, problem = describe_effect(effect, tools)
            status = CALLED if effect.effect_class is REVERSIBLE else STAGED
            rows.append(
                (tx.co.run_id, tx.txid, effect.key, next(self._seq), effect.tool,
                 effect.effect_class.value, status, redo, problem)
            )
        return rows

    def call_started(
        self, tx: LoggedSession, key: str, spec: ToolSpec, args: Mapping[str, Any], before: Any
    ) -> None:
        """A reversible call is about to run: record it durably first."""
        redo, problem = tool_redo(spec.name, args, before=before)
        ident = (tx.co.run_id, tx.txid)
        with self._lock:
            statements = [] if ident in self._live else [self._tx_row(tx, TX_OPEN)]
            statements.append((
                "INSERT OR REPLACE INTO effects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*ident, key, next(self._seq), spec.name, REVERSIBLE.value, CALLING, redo, problem),
            ))
            self._write(statements, sync=True)
            self._live.setdefault(ident, TX_OPEN)
        _at("call.logged", spec.name)

    def call_returned(self, tx: LoggedSession, key: str, call: Call) -> None:
        """The reversible call returned: record its result (for the compensation)."""
        _at("call.ran", call.tool)
        redo, problem = tool_redo(call.tool, call.args, before=call.before, result=call.result)
        with self._lock:
            self._write([(
                "UPDATE effects SET status = ?, redo = ?, problem = ? "
                "WHERE run_id = ? AND txid = ? AND key = ?",
                (CALLED, redo, problem, tx.co.run_id, tx.txid, key),
            )])
        _at("call.returned", call.tool)

    def intent(self, tx: LoggedSession) -> None:
        """Every staged effect with its redo record, before commit starts."""
        if not tx.staged:
            return
        ident = (tx.co.run_id, tx.txid)
        with self._lock:
            if self._live.get(ident) in (TX_INTENT, TX_COMMITTED):
                return
            rows = self._effect_rows(tx)
            self._write([
                self._tx_row(tx, TX_INTENT),
                ("INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows),
                self._store_rows(tx.co.run_id, rows),
            ])
            self._live[ident] = TX_INTENT
        _at("intent.written", tx.trace)

    def committed(self, tx: LoggedSession) -> bool:
        """The commit point, durably (with the intent, if no commit_steps wrote it: a branch
        committed by resolve). False if the transaction has no effects (nothing logged)."""
        ident = (tx.co.run_id, tx.txid)
        with self._lock:
            state = self._live.get(ident)
            if state is None and not tx.staged:
                return False
            statements = []
            if state in (None, TX_OPEN):
                rows = self._effect_rows(tx)
                statements += [
                    self._tx_row(tx, TX_INTENT),
                    ("INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows),
                    self._store_rows(tx.co.run_id, rows),
                ]
            statements.append((
                "UPDATE txs SET state = ?, commit_seq = ?, updated = ? WHERE run_id = ? AND txid = ?",
                (TX_COMMITTED, next(self._commit_seq), time.time(), *ident),
            ))
            self._write(statements, sync=True)
            self._live[ident] = TX_COMMITTED
        _at("commit.marked", tx.trace)
        return True

    # -- what the session's steps call (they never raise: past the core's commit decision a
    # log failure cannot undo the commit, so it is warned about and the commit goes on) -------
    def commit_point(self, tx: LoggedSession) -> Callable[[Sequence[Effect], bool], None] | None:
        """Write the committed mark; the per-step hook, or None if nothing is logged."""
        try:
            return self.step_hook(tx) if self.committed(tx) else None
        except Exception as exc:  # noqa: BLE001
            self._failed_write(tx, "committed mark", exc)
            return None

    def abort_hook(self, tx: LoggedSession) -> Callable[[Effect, bool], None] | None:
        """The per-compensation hook of a logged transaction, else None."""
        return self.compensation_hook(tx) if (tx.co.run_id, tx.txid) in self._live else None

    def end(self, tx: LoggedSession, errors: Mapping[str, BaseException] | None = None) -> None:
        """The done mark (the transaction's rows go), unless a delivery failed at commit:
        then it stays, to be retried (`errors`: the failures by effect key)."""
        try:
            failed = self._failed.pop((tx.co.run_id, tx.txid), None)
            if failed:
                self._keep_failed(tx, failed, errors or {})
            else:
                self.done(tx)
        except Exception as exc:  # noqa: BLE001
            self._failed_write(tx, "done mark", exc)

    def _failed_write(self, tx: LoggedSession, what: str, exc: Exception) -> None:
        self.errors.append(exc)
        warnings.warn(
            f"atomix log {self.location}: tx{tx.txid}: could not write the {what}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )

    def step_hook(self, tx: LoggedSession) -> Callable[[Sequence[Effect], bool], None]:
        """The per-step callback for `carry_out_commit`: marks a step's effects settled."""
        run_id, txid = tx.co.run_id, tx.txid

        def settled(effects: Sequence[Effect], ok: bool) -> None:
            _at("step.applied", ",".join(e.tool for e in effects))
            if not ok:  # kept for a retry (or a dead letter) when the transaction ends
                self._failed.setdefault((run_id, txid), []).extend(effects)
            try:
                self.mark(run_id, txid, effects, ok)
            except Exception as exc:  # noqa: BLE001 - unmarked: recovery re-delivers by key
                self._failed_write(tx, "settlement mark", exc)
            _at("step.marked", ",".join(e.tool for e in effects))

        return settled

    def compensation_hook(self, tx: LoggedSession) -> Callable[[Effect, bool], None]:
        """The per-effect callback for `carry_out_abort`: marks a compensation done (or residue)."""
        run_id, txid = tx.co.run_id, tx.txid

        def compensated(effect: Effect, ok: bool) -> None:
            _at("compensate.ran", effect.tool)
            try:
                self.set_status(run_id, txid, effect.key, COMPENSATED if ok else RESIDUE)
            except Exception as exc:  # noqa: BLE001
                self._failed_write(tx, "compensation mark", exc)
            _at("compensate.done", effect.tool)

        return compensated

    def mark(self, run_id: str, txid: int, effects: Sequence[Effect], ok: bool) -> None:
        """Effects of one step settled (applied, released) or failed for good."""
        rows = [
            (
                (APPLIED if e.effect_class is EffectClass.BUFFERABLE else RELEASED) if ok else FAILED,
                run_id, txid, e.key,
            )
            for e in effects
        ]
        with self._lock:
            self._write([(
                "UPDATE effects SET status = ? WHERE run_id = ? AND txid = ? AND key = ?", rows
            )])

    def is_logged(self, tx: LoggedSession) -> bool:
        """Whether this live transaction has rows (so its end must be recorded)."""
        return (tx.co.run_id, tx.txid) in self._live

    def done(self, tx: LoggedSession) -> None:
        """The transaction's end (committed-done or aborted-done): its rows go."""
        ident = (tx.co.run_id, tx.txid)
        if ident not in self._live:
            return
        _at("commit.applied" if self._live[ident] == TX_COMMITTED else "abort.compensated", tx.trace)
        self.forget(*ident)

    def forget(self, run_id: str, txid: int) -> None:
        """Delete a finished transaction's rows."""
        with self._lock:
            self._write(forget_rows(run_id, txid))
            self._live.pop((run_id, txid), None)

    def set_status(self, run_id: str, txid: int, key: str, status: str) -> None:
        """Recovery's own settlement of one effect."""
        with self._lock:
            self._write([(
                "UPDATE effects SET status = ? WHERE run_id = ? AND txid = ? AND key = ?",
                (status, run_id, txid, key),
            )])

    # -- closing --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the retry thread, close the database and release the directory lock. Failed
        deliveries not yet retried stay in the log for the next start or `atomix recover`."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._retry_wake.notify_all()
        self._join_retrier()
        with self._lock:
            self._close_store()

    def _close_store(self) -> None:
        """Close the store and let another process open the log. Caller locks."""
        if self.journal == "wal":
            try:  # every record into the body: the WAL SQLite then deletes held nothing more
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error:
                pass  # the WAL stays, and the next open reads it
        self._conn.close()
        self._release_lock()

    def _release_lock(self) -> None:
        fh = self._lock_fh
        if fh is not None:
            self._lock_fh = None
            fh.close()  # closing the descriptor drops the flock

    def __enter__(self) -> TxLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) else default



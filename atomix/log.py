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
"""

from __future__ import annotations

import itertools
import json
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
from atomix.errors import AtomixError
from atomix.log_format import (
    APPLIED,
    CALLED,
    CALLING,
    COMPENSATED,
    FAILED,
    FORMAT,
    RELEASED,
    RESIDUE,
    STAGED,
    TX_COMMITTED,
    TX_INTENT,
    TX_OPEN,
    VERSION,
    LoggedEffect,
    LoggedSession,
    LoggedTx,
    describe_effect,
    tool_redo,
)
from atomix.tools import Call

try:
    import fcntl

    _CAN_LOCK = True
except ImportError:  # pragma: no cover - not POSIX: no cross-process lock
    _CAN_LOCK = False

if TYPE_CHECKING:
    from atomix.tools import ToolSpec

LOG_FILE = "atomix-log.sqlite3"
LOCK_FILE = "atomix-log.lock"

#: Test hook: called as ``crash_hook(point, detail)`` at each named point of a logged
#: transaction (the kill test sets it in a child process to SIGKILL itself there). Points:
#: call.logged, call.ran, call.returned, intent.written, commit.marked, step.applied,
#: step.marked, commit.applied, compensate.done, abort.compensated.
crash_hook: Callable[[str, str], None] | None = None


def _at(point: str, detail: str = "") -> None:
    hook = crash_hook
    if hook is not None:
        hook(point, detail)


class LogError(AtomixError):
    """The log at `path` is missing, unreadable or not an Atomix log."""

    def __init__(self, path: Path | str, message: str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {message}")


class LogBusy(LogError):
    """Another live process (or another open `TxLog` in this one) holds the log."""


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    n INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT UNIQUE NOT NULL,
    pid INTEGER NOT NULL, started REAL NOT NULL);
CREATE TABLE IF NOT EXISTS txs (
    run_id TEXT NOT NULL, txid INTEGER NOT NULL, epoch INTEGER NOT NULL, trace TEXT NOT NULL,
    state TEXT NOT NULL, commit_seq INTEGER, updated REAL NOT NULL,
    PRIMARY KEY (run_id, txid));
CREATE TABLE IF NOT EXISTS effects (
    run_id TEXT NOT NULL, txid INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL,
    tool TEXT NOT NULL, class TEXT NOT NULL, status TEXT NOT NULL,
    redo TEXT NOT NULL, problem TEXT,
    PRIMARY KEY (run_id, txid, key));
INSERT OR IGNORE INTO meta VALUES ('format', '{FORMAT}'), ('version', '{VERSION}');
"""


class TxLog:
    """The durable transaction log in `directory` (see the module docstring).

    Guarantees: a transaction's committed mark is on disk (``durable=True``: fsynced) before
    its first effect is applied or released, and all its effects' redo records are on disk
    before the mark; a reversible call's record is on disk before the call runs. Thread-safe
    (one connection under one lock); one open `TxLog` per directory at a time (`LogBusy`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        durable: bool = True,
        create: bool = True,
        journal: str = "wal",
    ) -> None:
        # journal: "wal" (default: one fsync per durable record, measured in harness.bench.runtime) or
        # "delete" (SQLite's rollback journal: several fsyncs per durable record).
        if journal not in ("wal", "delete"):
            raise ValueError(f"journal must be 'wal' or 'delete', not {journal!r}")
        self.directory = Path(directory)
        self.durable = durable
        self.journal = journal
        path = self.directory / LOG_FILE
        if not create:
            if not self.directory.is_dir():
                raise LogError(self.directory, "no such log directory")
            if not path.is_file():
                raise LogError(self.directory, f"no Atomix log here ({LOG_FILE} is missing)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_fh: IO[str] | None = _take_lock(self.directory / LOCK_FILE)
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._open()
        except sqlite3.Error as exc:
            self._release_lock()
            raise LogError(path, f"corrupt or unreadable Atomix log: {exc}") from exc
        except LogError:
            self._release_lock()
            raise
        # The synchronous level of ordinary records; the commit point is raised to FULL.
        self._low = "NORMAL" if durable else "OFF"
        self._conn.execute(f"PRAGMA synchronous={self._low}")
        row = self._conn.execute("SELECT max(seq) FROM effects").fetchone()
        self._seq = itertools.count((row[0] or 0) + 1)
        row = self._conn.execute("SELECT max(commit_seq) FROM txs").fetchone()
        self._commit_seq = itertools.count((row[0] or 0) + 1)
        #: Runs started through this object: live, so recovery leaves them alone.
        self.own_runs: set[str] = set()
        # (run_id, txid) -> state, for the transactions of live runs that have rows.
        self._live: dict[tuple[str, int], str] = {}
        self.closed = False
        #: Log writes that failed past the commit decision (also warned about).
        self.errors: list[Exception] = []

    def _open(self) -> None:
        conn = self._conn
        mode = conn.execute(f"PRAGMA journal_mode={self.journal}").fetchone()[0]
        if str(mode).lower() != self.journal:
            raise LogError(self.path, f"cannot use the {self.journal} journal (got {mode!r})")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "meta" not in tables:
            raise LogError(self.path, "not an Atomix log (a SQLite database without its tables)")
        conn.executescript(_SCHEMA)
        meta = dict(conn.execute("SELECT name, value FROM meta"))
        if meta.get("format") != FORMAT:
            raise LogError(self.path, f"not an Atomix log (format {meta.get('format')!r})")
        if meta.get("version") != str(VERSION):
            raise LogError(self.path, f"log version {meta.get('version')}, this Atomix reads {VERSION}")
        conn.execute("SELECT count(*) FROM effects").fetchone()  # fails on a damaged table

    def begin_run(self) -> str:
        """Allocate this process run's identity (part of every idempotency key), persisted.

        A sequence number makes it unique per log; the random part keeps it unique if the
        log directory is ever deleted while the stores keep their applied keys.
        """
        with self._lock:
            # The directory lock makes this process the log's only writer: max + 1 is unique.
            n = (self._conn.execute("SELECT max(n) FROM runs").fetchone()[0] or 0) + 1
            run_id = f"r{n}-{secrets.token_hex(3)}"
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
            self._write([
                self._tx_row(tx, TX_INTENT),
                ("INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 self._effect_rows(tx)),
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
                statements += [
                    self._tx_row(tx, TX_INTENT),
                    ("INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     self._effect_rows(tx)),
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
            self._failed(tx, "committed mark", exc)
            return None

    def abort_hook(self, tx: LoggedSession) -> Callable[[Effect, bool], None] | None:
        """The per-compensation hook of a logged transaction, else None."""
        return self.compensation_hook(tx) if (tx.co.run_id, tx.txid) in self._live else None

    def end(self, tx: LoggedSession) -> None:
        """The done mark (the transaction's rows go)."""
        try:
            self.done(tx)
        except Exception as exc:  # noqa: BLE001
            self._failed(tx, "done mark", exc)

    def _failed(self, tx: LoggedSession, what: str, exc: Exception) -> None:
        self.errors.append(exc)
        warnings.warn(
            f"atomix log {self.path}: tx{tx.txid}: could not write the {what}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )

    def step_hook(self, tx: LoggedSession) -> Callable[[Sequence[Effect], bool], None]:
        """The per-step callback for `carry_out_commit`: marks a step's effects settled."""
        run_id, txid = tx.co.run_id, tx.txid

        def settled(effects: Sequence[Effect], ok: bool) -> None:
            _at("step.applied", ",".join(e.tool for e in effects))
            try:
                self.mark(run_id, txid, effects, ok)
            except Exception as exc:  # noqa: BLE001 - unmarked: recovery re-delivers by key
                self._failed(tx, "settlement mark", exc)
            _at("step.marked", ",".join(e.tool for e in effects))

        return settled

    def compensation_hook(self, tx: LoggedSession) -> Callable[[Effect, bool], None]:
        """The per-effect callback for `carry_out_abort`: marks a compensation done (or residue)."""
        run_id, txid = tx.co.run_id, tx.txid

        def compensated(effect: Effect, ok: bool) -> None:
            try:
                self.set_status(run_id, txid, effect.key, COMPENSATED if ok else RESIDUE)
            except Exception as exc:  # noqa: BLE001
                self._failed(tx, "compensation mark", exc)
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
            self._write([
                ("DELETE FROM effects WHERE run_id = ? AND txid = ?", (run_id, txid)),
                ("DELETE FROM txs WHERE run_id = ? AND txid = ?", (run_id, txid)),
            ])
            self._live.pop((run_id, txid), None)

    def set_status(self, run_id: str, txid: int, key: str, status: str) -> None:
        """Recovery's own settlement of one effect."""
        with self._lock:
            self._write([(
                "UPDATE effects SET status = ? WHERE run_id = ? AND txid = ? AND key = ?",
                (status, run_id, txid, key),
            )])

    # -- reading back ---------------------------------------------------------------------------
    def unfinished(self, *, exclude_runs: Iterable[str] = ()) -> list[LoggedTx]:
        """Every unfinished transaction of other (dead) runs: committed ones in commit order
        first, then the rest in the order they were logged."""
        skip = set(exclude_runs)
        with self._lock:
            try:
                txs = self._conn.execute(
                    "SELECT run_id, txid, epoch, trace, state, commit_seq FROM txs"
                ).fetchall()
                effects = self._conn.execute(
                    "SELECT run_id, txid, key, seq, tool, class, status, redo, problem "
                    "FROM effects ORDER BY seq"
                ).fetchall()
            except sqlite3.Error as exc:
                raise LogError(self.path, f"corrupt Atomix log: {exc}") from exc
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
            except ValueError as exc:
                raise LogError(self.path, f"corrupt redo record of {key!r}: {exc}") from exc
            tx.effects.append(LoggedEffect(key, seq, tool, effect_class, status, record, problem))

        def order(tx: LoggedTx) -> tuple[int, int]:
            if tx.committed:
                return (0, tx.commit_seq or 0)
            return (1, tx.effects[0].seq if tx.effects else 0)

        return sorted(out.values(), key=order)

    # -- closing --------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the database and release the directory lock."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
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


def _take_lock(path: Path) -> IO[str]:
    fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the log's lifetime
    if not _CAN_LOCK:  # pragma: no cover
        return fh
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise LogBusy(path.parent, f"the Atomix log is in use (held by {holder})") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}")
    fh.flush()
    return fh


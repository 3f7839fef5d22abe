"""The coordinator store in one SQLite file: many processes on one host, no server.

Appends are serialised by an exclusive `flock` on ``PATH.lock`` (the kernel queues the
waiters, where SQLite's own busy handler would sleep in steps of up to 100 ms), then written
in one ``BEGIN IMMEDIATE`` transaction of a WAL database. Waiters learn of new events by
polling ``PRAGMA data_version`` (a change by another connection), every `poll` seconds.
Leases use this host's wall clock, which every process on it shares. A heartbeat is the
modification time of the member's own file in ``PATH.leases/``: renewing it takes neither
the append lock nor SQLite's write lock, so members whose appends queue behind a hot scope
on overloaded cores still renew their leases on time.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from atomix.coordinator.store import (
    FENCED,
    LEFT,
    LIVE,
    RECOVERED,
    CoordinatorError,
    Event,
    Fenced,
    Member,
    dumps_batch,
    loads,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, member INTEGER NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members (
    id INTEGER PRIMARY KEY AUTOINCREMENT, status TEXT NOT NULL, heartbeat REAL NOT NULL,
    log_dir TEXT, pid INTEGER NOT NULL, host TEXT NOT NULL, claimed_by INTEGER);
"""


# One statement (its own transaction): the next position, unless the member is not live.
_INSERT = (
    "INSERT INTO events (seq, member, body) SELECT coalesce((SELECT max(seq) FROM events), 0) + 1, "
    "?, ? WHERE (SELECT status FROM members WHERE id = ?) = ?"
)


# The appender of every this many-th position checkpoints the WAL (see `append`).
_CHECKPOINT_EVERY = 512


class SQLiteStore:
    """The store of a ``sqlite:///PATH`` coordinator (see the module docstring).

    Guarantees: appends are totally ordered across every process that opens the same file;
    a fenced member's append is refused before its step runs; a read sees a prefix of the
    log (appends commit in order, under the lock)."""

    polls = True  # waiters poll for news (see the module docstring)

    def __init__(self, url: str, *, poll: float = 0.001) -> None:
        self.url = url
        # sqlite:///tmp/c.db names /tmp/c.db: what follows "sqlite://" is the path.
        path = Path(url[len("sqlite://") :])
        if not path.parent.is_dir():
            raise CoordinatorError(f"coordinator {url!r}: directory {path.parent} does not exist")
        self.path = path
        self.poll = poll
        self._lock = threading.Lock()
        self._renewed: dict[int, float] = {}
        self._flock = open(f"{path}.lock", "a+b")  # noqa: SIM115 - held while open
        self._leases = Path(f"{path}.leases")
        self._leases.mkdir(exist_ok=True)
        self._news_lock = threading.Lock()
        self._beat_lock = threading.Lock()
        # Under the file lock: switching a new file to WAL takes an exclusive lock that
        # SQLite's busy handler does not wait for, so processes starting at once would clash.
        with self._serial():
            self._conn = self._connect()
            self._news = self._connect()  # the waiters' connection (a thread of its own)
            self._beat = self._connect()  # the heartbeat's: it only reads, so never waits
            self._conn.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=60.0
            )
            conn.execute("PRAGMA journal_mode=WAL")
            # A lost event after a power cut is lost by every process at once (one host), and
            # every replica is rebuilt from the log on restart: no fsync per append.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # see `append`
        except sqlite3.Error as exc:
            raise CoordinatorError(f"coordinator {self.url!r}: {exc}") from exc
        return conn

    def _serial(self) -> _Serial:
        return _Serial(self)

    # -- members --------------------------------------------------------------------------
    def register(self, *, pid: int, host: str, log_dir: str | None, options: str) -> int:
        with self._serial():
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute("SELECT value FROM meta WHERE name = 'options'").fetchone()
                if row is None:
                    conn.execute("INSERT INTO meta VALUES ('options', ?)", (options,))
                elif row[0] != options:
                    raise CoordinatorError(
                        f"coordinator {self.url!r}: its runtimes use options {row[0]}; this one "
                        f"has {options}: every runtime on one coordinator must use the same"
                    )
                cur = conn.execute(
                    "INSERT INTO members (status, heartbeat, log_dir, pid, host) VALUES (?, ?, ?, ?, ?)",
                    (LIVE, time.time(), log_dir, pid, host),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            assert cur.lastrowid is not None
            self._touch(cur.lastrowid)
            return cur.lastrowid

    def _lease_file(self, member: int) -> Path:
        return self._leases / f"m{member}"

    def _touch(self, member: int) -> None:
        """Renew `member`'s lease: its file's modification time is now."""
        path = self._lease_file(member)
        try:
            os.utime(path)
        except FileNotFoundError:
            path.touch()

    def _renewed_at(self, member: int, recorded: float) -> float:
        """When `member` last renewed its lease (its file, or the time it registered)."""
        try:
            return max(recorded, self._lease_file(member).stat().st_mtime)
        except FileNotFoundError:
            return recorded

    def heartbeat(self, member: int) -> bool:
        self._touch(member)  # (no lock: see the module docstring)
        with self._beat_lock:
            row = self._beat.execute("SELECT status FROM members WHERE id = ?", (member,)).fetchone()
        return row is not None and row[0] == LIVE

    def fence_expired(self, lease: float, alive: Callable[[Member], bool] | None = None) -> list[int]:
        fenced: list[int] = []
        with self._serial():
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                rows = conn.execute(
                    "SELECT id, status, log_dir, pid, host, heartbeat FROM members WHERE status = ?",
                    (LIVE,),
                ).fetchall()
                now = time.time()
                for mid, status, log_dir, pid, host, recorded in rows:
                    if now - self._renewed_at(mid, recorded) <= lease:
                        continue
                    if alive is not None and alive(Member(mid, status, log_dir, pid, host)):
                        continue  # late, but provably alive: never fence a live member
                    conn.execute("UPDATE members SET status = ? WHERE id = ?", (FENCED, mid))
                    fenced.append(mid)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return fenced

    def fence(self, member: int) -> None:
        with self._serial():
            self._conn.execute(
                "UPDATE members SET status = ? WHERE id = ? AND status = ?", (FENCED, member, LIVE)
            )

    def claim(self, recoverer: int) -> Member | None:
        with self._serial():
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(
                "SELECT id, status, log_dir, pid, host FROM members WHERE status = ? AND "
                "(claimed_by IS NULL OR claimed_by NOT IN (SELECT id FROM members WHERE status = ?)) "
                "ORDER BY id LIMIT 1",
                (FENCED, LIVE),
            ).fetchone()
            if row is not None:
                conn.execute("UPDATE members SET claimed_by = ? WHERE id = ?", (recoverer, row[0]))
            conn.execute("COMMIT")
        return None if row is None else Member(*row)

    def release(self, member: int, *, recovered: bool) -> None:
        with self._serial():
            if recovered:
                self._conn.execute(
                    "UPDATE members SET status = ?, claimed_by = NULL WHERE id = ?", (RECOVERED, member)
                )
            else:
                self._conn.execute("UPDATE members SET claimed_by = NULL WHERE id = ?", (member,))

    def members(self) -> list[Member]:
        with self._serial():
            rows = self._conn.execute(
                "SELECT id, status, log_dir, pid, host FROM members ORDER BY id"
            ).fetchall()
        return [Member(*r) for r in rows]

    def leave(self, member: int) -> None:
        with self._serial():
            self._conn.execute(
                "UPDATE members SET status = ? WHERE id = ? AND status = ?", (LEFT, member, LIVE)
            )
        self._lease_file(member).unlink(missing_ok=True)

    # -- the log ---------------------------------------------------------------------------
    def append(
        self, member: int, since: int, batch: Sequence[dict[str, Any]], *, notify: bool = False
    ) -> list[Event]:
        # (`notify` is moot: waiters poll.) Only the insert is under the file lock, so
        # positions are handed out in commit order and the log never has a gap: everything
        # below the new position is committed, and is read after the lock is let go.
        body = dumps_batch(batch)
        now = time.monotonic()
        if now - self._renewed.get(member, 0.0) > 1.0:
            # A busy process renews its lease with its appends too: its heartbeat thread may
            # be slow to get the CPU.
            self._touch(member)
            self._renewed[member] = now
        with self._serial():
            cur = self._conn.execute(_INSERT, (member, body, member, LIVE))
            seq = cur.lastrowid if cur.rowcount == 1 else None
        if seq is not None and seq % _CHECKPOINT_EVERY == 0:
            # Outside the file lock (SQLite's own checkpoints would run under it, fsyncs
            # and all): a passive checkpoint copies what it can while others append.
            with self._news_lock:
                self._news.execute("PRAGMA wal_checkpoint(PASSIVE)")
        if seq is None:
            with self._news_lock:
                row = self._news.execute("SELECT status FROM members WHERE id = ?", (member,)).fetchone()
            raise Fenced(
                f"coordinator {self.url!r}: member {member} is "
                f"{row[0] if row else 'unknown'}; its writes are refused"
            )
        rows: list[Any] = []
        if seq > since + 1:  # (others appended since this caller last looked)
            with self._news_lock:
                rows = self._news.execute(
                    "SELECT seq, member, body FROM events WHERE seq > ? AND seq < ? ORDER BY seq",
                    (since, seq),
                ).fetchall()
        events = [Event(s, m, loads(b)) for s, m, b in rows]
        events.append(Event(seq, member, list(batch)))
        return events

    def read(self, since: int) -> list[Event]:
        with self._news_lock:
            rows = self._news.execute(
                "SELECT seq, member, body FROM events WHERE seq > ? ORDER BY seq", (since,)
            ).fetchall()
        return [Event(s, m, loads(b)) for s, m, b in rows]

    def wait_for_news(self, since: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._news_lock:
            version = self._news.execute("PRAGMA data_version").fetchone()[0]
            row = self._news.execute("SELECT max(seq) FROM events").fetchone()
        if (row[0] or 0) > since:
            return True
        while True:
            time.sleep(self.poll)
            with self._news_lock:
                now_version = self._news.execute("PRAGMA data_version").fetchone()[0]
            if now_version != version:
                return True
            if time.monotonic() >= end:
                return False

    def quiet(self) -> None:
        pass  # waiters poll, and only while they wait: nothing to stop

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._flock.close()
        with self._news_lock:
            self._news.close()
        with self._beat_lock:
            self._beat.close()


class _Serial:
    """The in-process lock, then the cross-process flock: held for one serialised write."""

    __slots__ = ("store",)

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    def __enter__(self) -> None:
        store = self.store
        store._lock.acquire()
        try:
            fcntl.flock(store._flock.fileno(), fcntl.LOCK_EX)
        except BaseException:
            store._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        store = self.store
        try:
            fcntl.flock(store._flock.fileno(), fcntl.LOCK_UN)
        finally:
            store._lock.release()

"""Several OS processes open one fresh SQLite database at the same moment, through `SQLiteStore`.

Switching a new file to WAL takes an exclusive lock that SQLite's busy handler does not always
wait for, so processes starting together used to fail with "database is locked". Here every
process opens each of a series of fresh databases behind one barrier (many chances for the
race, few process starts), writes its own row and reads it back; every open must succeed.
The race is a matter of scheduling, so that test catches a regression most times, not every
time; the tests after it pin the retry itself, deterministically, with a connection that
reports busy.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3
import traceback
from pathlib import Path
from typing import Any

import pytest

from atomix.adapters import sqlite as sqlite_adapter
from atomix.adapters.sqlite import SQLiteStore

PROCESSES = 10
DATABASES = 100


def _open_at_once(
    dbs: list[str], barrier: Any, results: Any, i: int
) -> None:  # pragma: no cover - runs in a child process
    outcomes: list[str] = []
    for db in dbs:
        try:
            barrier.wait(timeout=60)
            with SQLiteStore(db) as store:
                store.put("rows", i, {"pid": os.getpid()})
                got = store.get("rows", i)
            outcomes.append("ok" if got == {"pid": os.getpid()} else f"read back {got!r}")
        except BaseException as exc:  # report every failure to the parent, whatever its kind
            outcomes.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
    results.put((i, outcomes))


def open_together(dbs: list[Path], n: int) -> list[str]:
    """`n` processes open each of `dbs` in turn, all at once behind a barrier; every failure."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    paths = [str(db) for db in dbs]
    procs = [ctx.Process(target=_open_at_once, args=(paths, barrier, results, i)) for i in range(n)]
    for p in procs:
        p.start()
    gathered = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return [o for _, outcomes in gathered for o in outcomes if o != "ok"]


def test_processes_open_one_fresh_database_at_once(tmp_path: Path) -> None:
    dbs = [tmp_path / f"fresh{j}.db" for j in range(DATABASES)]
    failed = open_together(dbs, PROCESSES)
    assert not failed, f"{len(failed)} failed opens, the first: {failed[0]}"
    for db in dbs:
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("SELECT count(*) FROM rows").fetchone()[0] == PROCESSES
        finally:
            conn.close()


class _BusyThenFine:
    """A connection whose journal-mode switch reports "database is locked" `busy` times."""

    def __init__(self, busy: int, message: str = "database is locked") -> None:
        self.busy = busy
        self.message = message
        self.calls = 0

    def execute(self, sql: str) -> None:
        self.calls += 1
        if self.calls <= self.busy:
            raise sqlite3.OperationalError(self.message)


def test_the_wal_switch_is_retried_while_busy() -> None:
    conn = _BusyThenFine(busy=5)
    sqlite_adapter._switch_to_wal(conn)  # type: ignore[arg-type]
    assert conn.calls == 6


def test_the_wal_switch_gives_up_at_the_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_adapter, "_BUSY_TIMEOUT", 0.05)
    conn = _BusyThenFine(busy=10**9)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        sqlite_adapter._switch_to_wal(conn)  # type: ignore[arg-type]
    assert 1 < conn.calls < 1000


def test_other_errors_of_the_wal_switch_are_not_retried() -> None:
    conn = _BusyThenFine(busy=1, message="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        sqlite_adapter._switch_to_wal(conn)  # type: ignore[arg-type]
    assert conn.calls == 1

"""The durable log in the coordinator's PostgreSQL database (`atomix.coordinator.db_log`):
a survivor that cannot see a dead process's files recovers its effects from the database.

Against a real throwaway PostgreSQL (tests/coordinator_support.py; skipped, saying why,
without one):

- a process (tests/coordinator_log_child.py, role ``victim``) with ``log="coordinator"`` runs
  a reversible call in a transaction it leaves open, then SIGKILLs itself at another
  transaction's committed mark, before its SQLite row and its user note are applied;
  survivors in other working directories (no log directory exists anywhere) finish the
  committed effects once each, by key, and compensate the reversible call once - one survivor,
  and two at once;
- the log's records at unit level: intent, committed mark, settlement and done mark round
  trip through PostgreSQL (seen committed from another connection before the first apply);
  recovery finishes a half-applied transaction and twice is a no-op; an undecodable record is
  quarantined and the rest recovers; one opener at a time; the statement translation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from coordinator_support import ROOT, pg_fixture, pg_url_fixture  # noqa: F401
from crash_hooks import Crash, crash_at, reset_crash_hook  # noqa: F401

import atomix.log as atomix_log
from atomix import Runtime
from atomix.adapters import FileStore, SQLiteStore
from atomix.adapters.tools import file_tools, sqlite_tools
from atomix.coordinator import open_store
from atomix.coordinator.db_log import CoordinatorLog, log_held_in, log_name, to_postgres
from atomix.log import LogBusy, LogError
from atomix.recovery import recover

CHILD = Path(__file__).with_name("coordinator_log_child.py")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ------------------------------------------------------------------------- processes
def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}


def _data(tmp: Path) -> Path:
    data = tmp / "data"
    data.mkdir()
    SQLiteStore(data / "rows.db").close()
    return data


def _victim(url: str, tmp: Path, data: Path) -> dict[str, Any]:
    cwd = tmp / "victim"
    cwd.mkdir()
    cfg = {"role": "victim", "url": url, "cwd": str(cwd), "data": str(data)}
    run = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(cfg)], capture_output=True, text=True, timeout=120,
        env=_env(),
    )
    assert run.returncode == -9, f"the victim was to kill itself at its committed mark: {run.stderr[-3000:]}"
    info: dict[str, Any] = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("{")))
    return info


def _survivors(url: str, tmp: Path, data: Path, n: int) -> list[dict[str, Any]]:
    go = tmp / "go"
    procs = []
    for i in range(n):
        cwd = tmp / f"survivor{i}"
        cwd.mkdir()
        cfg = {"role": "survivor", "url": url, "cwd": str(cwd), "data": str(data), "go": str(go),
               "linger": 2.0 if n > 1 else 0.0}
        procs.append(subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(cfg)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=_env(),
        ))
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            for other in procs:
                other.kill()
            raise AssertionError(f"a survivor did not start: {line!r} {proc.communicate()[1][-3000:]}")
    go.touch()
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(next(x for x in stdout.splitlines() if x.startswith("{"))))
    return out


def _check_recovered(url: str, tmp: Path, data: Path, info: dict[str, Any], found: list[dict[str, Any]]) -> None:
    # Exactly one survivor took the dead member over, from its log in the database.
    took = [r for result in found for r in result["recovered"] if r["member"] == info["member"]]
    assert len(took) == 1 and took[0]["compensated"] and took[0]["log"] == info["log"], found
    # The committed transaction: its row and its note, each applied once, under its key.
    notes = _lines(data / "notes.txt")
    assert len(notes) == 1 and notes[0].startswith(f"{info['run']}:") and notes[0].endswith(" B"), notes
    rows = SQLiteStore(data / "rows.db")
    try:
        assert rows.get("t", "k") == "committed"
        assert len([k for k in rows.applied_keys() if k.startswith(f"{info['run']}:")]) == 1
    finally:
        rows.close()
    # The open transaction: its reversible call compensated once.
    assert _lines(data / "effects.txt") == ["do A", "undo A"]
    store = open_store(url)
    try:
        statuses = {m.id: m.status for m in store.members()}
    finally:
        store.close()
    assert statuses[info["member"]] == "recovered", statuses
    # Nothing of any process's log is on disk: it was in the database only.
    assert not list(tmp.rglob("atomix-log*"))
    name = log_name(info["log"])
    assert name is not None
    log = CoordinatorLog(url, name, create=False)
    try:
        assert log.unfinished() == []
    finally:
        log.close()


def _open_once_released(url: str, name: str) -> CoordinatorLog:
    """The dead process's log, once the server has noticed the process's connection closed
    and ended its session (whose advisory lock holds the log): a moment after the kill."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return CoordinatorLog(url, name, create=False)
        except LogBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _check_left_behind(url: str, info: dict[str, Any]) -> None:
    """What the victim left, read from the database: the committed transaction with its two
    effects not applied, the open one with its reversible call."""
    name = log_name(info["log"])
    assert name is not None
    log = _open_once_released(url, name)
    try:
        txs = {tx.state: sorted((e.tool, e.status) for e in tx.effects) for tx in log.unfinished()}
    finally:
        log.close()
    assert txs == {
        "committed": [("note", "staged"), ("sqlite.put", "staged")],
        "open": [("reserve", "called")],
    }, txs


def test_a_survivor_elsewhere_finishes_and_compensates_from_the_database(pg_url: str, tmp_path: Path) -> None:
    data = _data(tmp_path)
    info = _victim(pg_url, tmp_path, data)
    assert info["log"].startswith("coordinator-log://")
    assert not list(tmp_path.rglob("atomix-log*"))
    _check_left_behind(pg_url, info)
    assert _lines(data / "notes.txt") == [] and _lines(data / "effects.txt") == ["do A"]
    found = _survivors(pg_url, tmp_path, data, 1)
    _check_recovered(pg_url, tmp_path, data, info, found)


def test_two_recoverers_at_once_never_duplicate(pg_url: str, tmp_path: Path) -> None:
    data = _data(tmp_path)
    info = _victim(pg_url, tmp_path, data)
    found = _survivors(pg_url, tmp_path, data, 2)
    _check_recovered(pg_url, tmp_path, data, info, found)


def test_recover_coordinator_finishes_adapter_effects_from_the_database(pg_url: str, tmp_path: Path) -> None:
    """`atomix recover --coordinator URL`'s function, without the program's tools: the SQLite
    row is finished from the database; the user's note and compensation wait for the program."""
    from atomix.coordinator import recover_coordinator

    data = _data(tmp_path)
    info = _victim(pg_url, tmp_path, data)
    time.sleep(0.8)  # its lease (0.5 s here) runs out
    with pytest.warns(RuntimeWarning, match="still needs work"):
        done, left = recover_coordinator(pg_url, lease=0.5)
    assert done == [] and [m.id for m in left] == [info["member"]]
    rows = SQLiteStore(data / "rows.db")
    try:
        assert rows.get("t", "k") == "committed"  # finished by key, from the database
    finally:
        rows.close()
    assert _lines(data / "notes.txt") == [] and _lines(data / "effects.txt") == ["do A"]
    found = _survivors(pg_url, tmp_path, data, 1)  # the program's tools: the rest
    _check_recovered(pg_url, tmp_path, data, info, found)


# ------------------------------------------------------------------------- the log itself
def _rows(url: str, number: int, sql: str) -> list[tuple[Any, ...]]:
    """Read the log's tables from another connection: only what was committed is visible."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO atomix_log_{number}")
        return conn.execute(sql).fetchall()


def test_records_round_trip_and_are_committed_before_the_first_apply(pg_url: str, tmp_path: Path) -> None:
    log = CoordinatorLog(pg_url, "unit")
    rt = Runtime(log=log)
    fs = file_tools(rt, FileStore(tmp_path / "root"))
    db = sqlite_tools(rt, SQLiteStore(tmp_path / "db.sqlite"))
    seen: list[tuple[str, Any]] = []

    def hook(at: str, detail: str) -> None:
        if at in ("intent.written", "commit.marked", "step.marked"):
            effects = _rows(pg_url, log.number, "SELECT tool, status FROM effects ORDER BY seq")
            state = _rows(pg_url, log.number, "SELECT state FROM txs")
            seen.append((at, [*effects, *state, (tmp_path / "root" / "a.txt").exists()]))

    atomix_log.crash_hook = hook
    with rt.transaction():
        fs.write_text("a.txt", "A")
        db.put("t", 1, {"v": 1})
    atomix_log.crash_hook = None
    assert seen[0] == ("intent.written", [("fs.write_text", "staged"), ("sqlite.put", "staged"), ("intent",), False])
    assert seen[1] == ("commit.marked", [("fs.write_text", "staged"), ("sqlite.put", "staged"), ("committed",), False])
    assert seen[2][0] == "step.marked" and seen[2][1][-1] is True
    assert ("applied",) in [tuple(x[1:2]) for x in seen[2][1][:2]]  # the first step's settlement
    # The done mark: the transaction's rows are gone.
    assert _rows(pg_url, log.number, "SELECT count(*) FROM effects") == [(0,)]
    assert _rows(pg_url, log.number, "SELECT count(*) FROM txs") == [(0,)]
    run = rt.coordinator.run_id
    assert run.startswith(f"log{log.number}-r1-")  # unique across the database's logs

    # Crash after the first step: recovery finishes the rest by key, and twice is a no-op.
    crash_at("step.marked")
    with pytest.raises(Crash), rt.transaction():
        fs.write_text("b.txt", "B")
        db.put("t", 2, {"v": 2})
    atomix_log.crash_hook = None
    log.close()  # what a dead process's connection does: the lock goes, the rows stay
    first = recover(CoordinatorLog(pg_url, "unit", create=False))
    assert len(first.finished) == 1 and first.delivered == 1 and first.clean, str(first)
    assert first.log == "coordinator-log://unit"
    assert (tmp_path / "root" / "b.txt").read_text() == "B"
    rows = SQLiteStore(tmp_path / "db.sqlite")
    try:
        assert rows.get("t", 2) == {"v": 2}
    finally:
        rows.close()
    again = recover(CoordinatorLog(pg_url, "unit", create=False))
    assert again.finished == [] and again.aborted == [] and again.clean


def test_an_open_transactions_reversible_call_is_compensated_once(pg_url: str, tmp_path: Path) -> None:
    log = CoordinatorLog(pg_url, "open")
    rt = Runtime(log=log)
    undone: list[str] = []

    def undo(call: Any) -> None:
        undone.append(call.args["ident"])

    @rt.tool(effect="reversible", writes="res:{ident}", compensate=undo)
    def reserve(ident: str) -> str:
        return ident

    crash_at("intent.written")  # at commit, before its mark: it aborts on recovery
    with pytest.raises(Crash), rt.transaction():
        reserve("X")
    atomix_log.crash_hook = None
    log.close()
    tools = dict(rt.coordinator.tools)
    report = recover(CoordinatorLog(pg_url, "open", create=False), tools=tools)
    assert len(report.aborted) == 1 and report.compensated == 1 and undone == ["X"], str(report)
    assert recover(CoordinatorLog(pg_url, "open", create=False), tools=tools).aborted == []
    assert undone == ["X"]


def test_an_undecodable_record_is_quarantined_and_the_rest_recovers(pg_url: str, tmp_path: Path) -> None:
    log = CoordinatorLog(pg_url, "salvage")
    rt = Runtime(log=log)
    fs = file_tools(rt, FileStore(tmp_path / "root"))
    crash_at("commit.marked")
    with pytest.raises(Crash), rt.transaction():
        fs.write_text("good.txt", "good")
        fs.write_text("bad.txt", "bad")
    atomix_log.crash_hook = None
    log.close()
    import psycopg

    (bad,) = next(r for r in _rows(pg_url, log.number, "SELECT key, redo FROM effects") if "bad.txt" in r[1])[:1]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the redo record's JSON cut short
        conn.execute(
            f"UPDATE atomix_log_{log.number}.effects SET redo = '{{\"kind\": \"fs.write\", \"path\": ' "
            "WHERE key = %s", (bad,),
        )
    again = CoordinatorLog(pg_url, "salvage", create=False)
    report = recover(again)
    assert len(report.finished) == 1 and not report.clean, str(report)
    assert len(report.needs_human) == 1 and "quarantined" in str(report) and "not JSON" in str(report)
    assert (tmp_path / "root" / "good.txt").read_text() == "good"
    assert not (tmp_path / "root" / "bad.txt").exists()  # never guessed
    assert [q.what for q in again.quarantined()] == ["effect"]
    assert bad in again.quarantined()[0].record
    again.close()


def test_one_opener_at_a_time_and_a_missing_log_is_an_error(pg_url: str) -> None:
    log = CoordinatorLog(pg_url, "busy")
    try:
        with pytest.raises(LogBusy, match="in use"):
            CoordinatorLog(pg_url, "busy")
        assert log_held_in(pg_url, log.location)
    finally:
        log.close()
    assert not log_held_in(pg_url, log.location)
    assert not log_held_in(pg_url, "/some/directory")
    assert log.dropped  # it held nothing: closing it cleanly removed it
    with pytest.raises(LogError, match="no Atomix log of this name"):
        CoordinatorLog(pg_url, "busy", create=False)
    with pytest.raises(LogError, match="no Atomix log of this name"):
        CoordinatorLog(pg_url, "never-made", create=False)
    with pytest.raises(ValueError, match="printable"):
        CoordinatorLog(pg_url, "")


def test_runtime_log_coordinator_needs_a_postgresql_coordinator(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give coordinator='postgresql://...' too"):
        Runtime(log="coordinator")
    with pytest.raises(ValueError, match="needs a postgresql:// coordinator"):
        Runtime(coordinator=f"sqlite://{tmp_path}/c.db", log="coordinator")
    assert not (tmp_path / "coordinator").exists()


def test_statements_translate_to_postgresql() -> None:
    assert to_postgres("SELECT a FROM txs WHERE run_id = ? AND txid = ?") == (
        "SELECT a FROM txs WHERE run_id = %s AND txid = %s"
    )
    assert to_postgres("INSERT OR IGNORE INTO stores VALUES (?, ?, ?)") == (
        "INSERT INTO stores VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
    )
    assert to_postgres("INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?, ?)") == (
        "INSERT INTO deliveries VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (run_id, txid, key) "
        "DO UPDATE SET attempts = excluded.attempts, last_error = excluded.last_error, "
        "next_at = excluded.next_at"
    )
    with pytest.raises(ValueError, match="no table"):
        to_postgres("INSERT OR IGNORE INTO nowhere VALUES (?)")


def test_the_postgresql_tables_have_the_sqlite_logs_columns_in_order() -> None:
    """Rows are inserted by position: a column added to one log and not the other would
    shift every value after it."""
    import sqlite3

    from atomix.coordinator.db_log import _TABLES
    from atomix.log_files import SCHEMA

    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    tables = [t for t in tables if not t.startswith("sqlite_")]
    assert sorted(tables) == sorted(_TABLES)
    for table in tables:
        sqlite_columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        pg_columns = [part.split()[0] for part in _TABLES[table][0].split(", ")]
        assert [c for c in pg_columns if c != "rowid"] == sqlite_columns, table
        sqlite_key = sorted((r[5], r[1]) for r in conn.execute(f"PRAGMA table_info({table})") if r[5])
        assert tuple(c for _, c in sqlite_key) == _TABLES[table][1], table

"""The logs in a coordinator's PostgreSQL database go once finished, and `atomix recover
--status --coordinator URL` reads them (`atomix.coordinator.db_log`, `db_log_admin`).

Against a real throwaway PostgreSQL (tests/coordinator_support.py; skipped, saying why,
without one):

- a clean close drops the process's log (schema and registry row) and prunes its runs'
  applied keys from the stores at once;
- a log holding a dead letter is kept, and ``--status --coordinator`` lists it (also while
  the process lives, saying so), exit 1; a sweep keeps it too;
- a dead member's log that a recoverer recovered cleanly is dropped; one whose runs left
  applied keys is kept until key_retention has passed, then a sweep prunes them and drops it;
- `recover_coordinator`'s sweep drops an orphaned finished log (a clean close whose drop
  never happened) and never touches a live (locked) one;
- bad input to ``--status --coordinator``: a clear error, exit 2.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from coordinator_support import pg_fixture, pg_url_fixture  # noqa: F401
from crash_hooks import Crash, crash_at, reset_crash_hook  # noqa: F401
from typer.testing import CliRunner

import atomix.log as atomix_log
from atomix import Runtime
from atomix.adapters import FileStore, MailboxSink, SQLiteStore
from atomix.adapters.tools import file_tools, sqlite_tools
from atomix.coordinator import CoordinatorSettings, recover_coordinator
from atomix.coordinator.db_log import CoordinatorLog
from atomix.coordinator.db_log_admin import SweptLog, log_statuses
from atomix.errors import CommitIncomplete
from cli import app

runner = CliRunner()


def _schemas(url: str) -> set[str]:
    """The log schemas in the database, and the names the registry holds."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        found = {r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'atomix_log_%'")}
        if conn.execute("SELECT to_regclass('atomix_log.logs')").fetchone()[0] is not None:
            found |= {f"name:{r[0]}" for r in conn.execute("SELECT name FROM atomix_log.logs")}
    return found


def _gone(url: str, log: CoordinatorLog) -> bool:
    here = _schemas(url)
    return f"atomix_log_{log.number}" not in here and f"name:{log.name}" not in here


def _sql(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def _die(rt: Runtime) -> None:
    """What a killed process leaves: its lease stops being renewed (never left), its log's
    connection goes (the lock with it) and its rows stay."""
    membership = rt.membership
    assert membership is not None and rt.log is not None
    membership._stop.set()
    for thread in membership._threads:
        thread.join(5)
    membership.store.close()
    rt.log._pg.close()  # type: ignore[attr-defined]


def _status(url: str, *extra: str) -> Any:
    return runner.invoke(app, ["recover", "--status", "--coordinator", url, *extra])


def test_a_clean_close_drops_the_log_and_prunes_its_keys(pg_url: str, tmp_path: Path) -> None:
    rt = Runtime(coordinator=CoordinatorSettings(pg_url, recover_others=False), log="coordinator")
    log = rt.log
    assert isinstance(log, CoordinatorLog)
    fs = file_tools(rt, FileStore(tmp_path / "root"))
    db = sqlite_tools(rt, SQLiteStore(tmp_path / "db.sqlite"))
    with rt.transaction():
        fs.write_text("a.txt", "A")
        db.put("t", 1, {"v": 1})
    run = rt.coordinator.run_id
    assert run in (tmp_path / "root" / ".atomix" / "applied").read_text()
    rows = SQLiteStore(tmp_path / "db.sqlite")
    try:
        assert [k for k in rows.applied_keys() if k.startswith(f"{run}:")]  # kept while it lives
    finally:
        rows.close()
    assert not _gone(pg_url, log)
    rt.close()
    assert log.dropped and _gone(pg_url, log)  # before: the schema stayed for ever
    rows = SQLiteStore(tmp_path / "db.sqlite")
    try:
        assert rows.get("t", 1) == {"v": 1}
        assert not [k for k in rows.applied_keys() if k.startswith(f"{run}:")]
    finally:
        rows.close()
    journal = tmp_path / "root" / ".atomix" / "applied"  # the file store's applied keys
    assert journal.is_file() and run not in journal.read_text()
    assert (tmp_path / "root" / "a.txt").read_text() == "A"
    status = _status(pg_url)
    assert status.exit_code == 0 and "no log in the coordinator's database" in status.output


def test_a_log_with_a_dead_letter_is_kept_and_listed(pg_url: str, tmp_path: Path) -> None:
    sink = MailboxSink(tmp_path / "outbox.jsonl")

    def gateway(to: str, subject: str, body: str, idempotency_key: str) -> bool:
        raise ConnectionError("gateway down")

    log = CoordinatorLog(pg_url, "mailer", retry_backoff=0.02, max_delivery_attempts=2)
    rt = Runtime(log=log, apply_attempts=1)
    send = rt.tool(gateway, effect="irreversible", writes="mail:{to}", name="notify")
    with pytest.raises(CommitIncomplete), rt.transaction():
        send("ann@example.org", "hi", "one")
    end = time.monotonic() + 20
    while not [s for s in log_statuses(pg_url) if s.dead]:
        assert time.monotonic() < end, "no dead letter"
        time.sleep(0.05)
    live = _status(pg_url)  # read without the log's lock, while the process holds it
    assert live.exit_code == 1, live.output
    assert "coordinator-log://mailer" in live.output and "1 dead" in live.output
    assert "gateway down" in live.output and "in use by a live process" in live.output
    assert all(len(line) <= 80 for line in live.output.splitlines()), live.output
    rt.close()
    assert not log.dropped and log.kept == "work" and not _gone(pg_url, log)
    data = json.loads(_status(pg_url, "--json").output)
    (only,) = data["logs"]
    assert only["log"] == "coordinator-log://mailer" and only["held_by"] is None
    assert [d["attempts"] for d in only["dead"]] == [2] and only["pending"] == only["retried"] == []
    assert sink.messages() == []
    swept: list[SweptLog] = []
    done, left = recover_coordinator(pg_url, swept=swept)  # the sweep keeps it: a human's
    assert [(s.log, s.dropped, s.needs_work) for s in swept] == [("coordinator-log://mailer", False, True)]
    assert not _gone(pg_url, log)
    out = runner.invoke(app, ["recover", "--coordinator", pg_url])
    assert out.exit_code == 1 and "holds work" in out.output, out.output


def _dead_member(pg_url: str, tmp_path: Path, *, adapter: bool) -> tuple[Runtime, CoordinatorLog, str]:
    """A member that crashed at a transaction's intent (a user tool's staged effect: it
    aborts on recovery, no tools needed) and died; `adapter`: a committed SQLite row first,
    so its run left an applied key in a store."""
    rt = Runtime(
        coordinator=CoordinatorSettings(pg_url, lease=0.5, heartbeat=0.1, recover_others=False),
        log="coordinator",
    )
    log = rt.log
    assert isinstance(log, CoordinatorLog)

    @rt.tool(effect="bufferable", writes="notes:{text}")
    def note(text: str, idempotency_key: str) -> None:
        raise AssertionError("never applied: the transaction never commits")

    if adapter:
        db = sqlite_tools(rt, SQLiteStore(tmp_path / "db.sqlite"))
        with rt.transaction():
            db.put("t", 1, "kept")
    crash_at("intent.written")
    with pytest.raises(Crash), rt.transaction():
        note("x")
    atomix_log.crash_hook = None
    _die(rt)
    time.sleep(0.8)  # the lease runs out
    return rt, log, rt.coordinator.run_id


def test_a_recovered_dead_members_finished_log_is_dropped(pg_url: str, tmp_path: Path) -> None:
    rt, log, _ = _dead_member(pg_url, tmp_path, adapter=False)
    assert rt.membership is not None and not _gone(pg_url, log)
    done, left = recover_coordinator(pg_url, lease=0.5)
    assert [(r.member, r.compensated, r.log) for r in done] == [(rt.membership.member, True, log.location)]
    assert left == [] and _gone(pg_url, log)  # before: the schema stayed for ever


def test_a_dead_runs_keys_keep_its_log_until_key_retention_then_a_sweep_drops_it(
    pg_url: str, tmp_path: Path
) -> None:
    _, log, run = _dead_member(pg_url, tmp_path, adapter=True)
    swept: list[SweptLog] = []
    done, left = recover_coordinator(pg_url, lease=0.5, swept=swept)
    assert len(done) == 1 and done[0].compensated and left == []
    # Recovered: the process may still be applying (cut off from the database only), so its
    # run's applied keys stay for key_retention, and the log with them.
    assert not _gone(pg_url, log)
    assert [(s.log, s.waits_for_pruning, s.needs_work) for s in swept] == [(log.location, True, False)]
    rows = SQLiteStore(tmp_path / "db.sqlite")
    try:
        assert [k for k in rows.applied_keys() if k.startswith(f"{run}:")]
    finally:
        rows.close()
    status = _status(pg_url)
    assert status.exit_code == 0 and "nothing pending" in status.output, status.output
    # key_retention (a day by default) has passed since the run ended.
    _sql(pg_url, f"UPDATE atomix_log_{log.number}.finished_runs SET at = at - 2 * 86400")
    swept.clear()
    recover_coordinator(pg_url, lease=0.5, swept=swept)
    assert [(s.log, s.dropped) for s in swept] == [(log.location, True)] and _gone(pg_url, log)
    rows = SQLiteStore(tmp_path / "db.sqlite")
    try:
        assert rows.get("t", 1) == "kept"
        assert not [k for k in rows.applied_keys() if k.startswith(f"{run}:")]
    finally:
        rows.close()


def test_the_sweep_drops_an_orphaned_finished_log_and_never_a_live_one(pg_url: str) -> None:
    # A clean close that died before its drop: the member left, the log's connection went.
    rt = Runtime(coordinator=CoordinatorSettings(pg_url, recover_others=False), log="coordinator")
    orphan = rt.log
    assert isinstance(orphan, CoordinatorLog) and rt.membership is not None
    rt.membership.close()
    orphan._pg.close()
    # A log no member names (a process without a coordinator), alive and holding nothing.
    live = CoordinatorLog(pg_url, "live")
    try:
        swept: list[SweptLog] = []
        recover_coordinator(pg_url, swept=swept)
        assert [(s.log, s.dropped) for s in swept] == [(orphan.location, True)]
        assert _gone(pg_url, orphan) and not _gone(pg_url, live)
        out = runner.invoke(app, ["recover", "--coordinator", pg_url])
        assert out.exit_code == 0 and "coordinator-log://live" not in out.output, out.output
        assert not _gone(pg_url, live)
        listed = _status(pg_url)
        assert listed.exit_code == 0 and "coordinator-log://live" in listed.output
        assert "in use by a live process" in listed.output, listed.output
    finally:
        live.close()
    assert _gone(pg_url, live)


def test_status_coordinator_bad_input(pg_url: str, tmp_path: Path) -> None:
    for url in (f"sqlite://{tmp_path}/c.db", "mysql://x"):
        bad = _status(url)
        assert bad.exit_code == 2 and "--coordinator" in bad.output, bad.output
        assert "postgresql://" in bad.output and "not allowed" in bad.output
    gone = _status(f"postgresql://atomix@/nowhere?host={tmp_path}")
    assert gone.exit_code == 2 and "cannot reach" in gone.output, gone.output
    both = runner.invoke(app, ["recover", "--status", str(tmp_path), "--coordinator", pg_url])
    assert both.exit_code == 2 and "goes without LOGDIR" in both.output
    assert _status(pg_url).exit_code == 0  # an empty database: no log, nothing pending

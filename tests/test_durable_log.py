"""The durable log and recovery through the public API: Runtime(log=...), rt.recover(),
`atomix recover`, with real SQLite, real files and real processes (forked)."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from crash_hooks import Crash, crash_at, reset_crash_hook  # noqa: F401
from typer.testing import CliRunner

import atomix.log as atomix_log
from atomix import Effect, EffectClass, Runtime
from atomix.adapters import FileStore, MailboxSink, SQLiteStore
from atomix.adapters.tools import file_tools, mail_tools, sqlite_tools
from atomix.log import LogBusy, LogError, TxLog
from atomix.recovery import recover
from cli import app

runner = CliRunner()
_FORK = multiprocessing.get_context("fork")


def _abandon(rt: Runtime) -> None:
    atomix_log.crash_hook = None
    assert rt.log is not None
    rt.log.close()  # what the OS does for a dead process: the lock goes, the rows stay


def _program(tmp: Path, rt: Runtime) -> tuple[Any, Any, Any]:
    return (
        file_tools(rt, FileStore(tmp / "root")),
        sqlite_tools(rt, SQLiteStore(tmp / "db.sqlite")),
        mail_tools(rt, MailboxSink(tmp / "outbox.jsonl")),
    )


def _outbox(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "outbox.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------------------------- missing / corrupt
def test_missing_log_is_a_clear_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(LogError, match="nowhere"):
        recover(missing)
    result = runner.invoke(app, ["recover", str(missing)])
    assert result.exit_code == 2
    assert str(missing) in result.output and "no such log directory" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["recover", str(empty)])
    assert result.exit_code == 2 and "atomix-log.sqlite3 is missing" in result.output
    assert not (empty / "atomix-log.sqlite3").exists()  # recover never creates a log


def test_corrupt_log_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "atomix-log.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(LogError, match="corrupt"):
        Runtime(log=bad)
    result = runner.invoke(app, ["recover", str(bad)])
    assert result.exit_code == 2 and "corrupt" in result.output and str(bad) in result.output
    other = tmp_path / "other"
    other.mkdir()
    conn = sqlite3.connect(other / "atomix-log.sqlite3")
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(LogError, match="not an Atomix log"):
        TxLog(other)


# ------------------------------------------------------------------------- recording
def test_read_only_and_finished_transactions_leave_no_rows(tmp_path: Path) -> None:
    rt = Runtime(log=tmp_path / "log")
    fs, db, mail = _program(tmp_path, rt)
    with rt.transaction():
        fs.read_text("a.txt")  # read-only: never logged
    with rt.transaction():
        fs.write_text("a.txt", "A")
        db.put("t", 1, {"v": 1})
        mail.send("a@example.org", "s", "b")
    with pytest.raises(ValueError), rt.transaction():
        fs.write_text("b.txt", "B")
        raise ValueError("abort")
    assert rt.log is not None
    conn = rt.log._conn
    assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM txs").fetchone() == (0,)
    assert (tmp_path / "root" / "a.txt").read_text() == "A"
    rt.close()


def test_intent_and_commit_mark_are_on_disk_before_the_first_apply(tmp_path: Path) -> None:
    rt = Runtime(log=tmp_path / "log")
    fs, db, mail = _program(tmp_path, rt)
    seen: list[tuple[str, list[tuple[str, str]]]] = []

    def hook(at: str, detail: str) -> None:
        if at in ("intent.written", "commit.marked", "step.applied"):
            # Another connection: only what was committed to the database file is visible.
            other = sqlite3.connect(tmp_path / "log" / "atomix-log.sqlite3")
            rows = other.execute("SELECT tool, status FROM effects ORDER BY seq").fetchall()
            state = other.execute("SELECT state FROM txs").fetchall()
            other.close()
            seen.append((at, [*rows, *state, (tmp_path / "root" / "a.txt").exists()]))

    atomix_log.crash_hook = hook
    with rt.transaction():
        fs.write_text("a.txt", "A")
        mail.send("a@example.org", "s", "b")
    at_intent, at_mark, at_step = seen[0], seen[1], seen[2]
    assert at_intent[0] == "intent.written"
    assert at_intent[1] == [("fs.write_text", "staged"), ("mail.send", "staged"), ("intent",), False]
    assert at_mark[0] == "commit.marked" and at_mark[1][-2:] == [("committed",), False]
    assert at_step[0] == "step.applied" and at_step[1][-1] is True  # the first apply came after
    rt.close()


# ------------------------------------------------------------------------- recovery
def test_recovery_finishes_a_committed_transaction_and_twice_is_a_no_op(tmp_path: Path) -> None:
    rt = Runtime(log=tmp_path / "log")
    fs, db, mail = _program(tmp_path, rt)
    crash_at("step.marked")  # the first step (the file) applied, the rest not
    with pytest.raises(Crash), rt.transaction():
        fs.write_text("a.txt", "A")
        db.put("t", 1, {"v": 1})
        mail.send("a@example.org", "s", "b")
    _abandon(rt)
    assert _outbox(tmp_path) == []
    first = recover(tmp_path / "log")
    assert first.clean and len(first.finished) == 1 and first.delivered == 2, str(first)
    snapshot = (FileStore(tmp_path / "root").snapshot(), SQLiteStore(tmp_path / "db.sqlite").snapshot())
    second = recover(tmp_path / "log")
    assert second.clean and not second.finished and not second.aborted
    assert (FileStore(tmp_path / "root").snapshot(), SQLiteStore(tmp_path / "db.sqlite").snapshot()) == snapshot
    assert [m["body"] for m in _outbox(tmp_path)] == ["b"]
    result = runner.invoke(app, ["recover", str(tmp_path / "log")])
    assert result.exit_code == 0 and "nothing left to do" in result.output


def test_an_applied_but_unmarked_effect_is_not_applied_twice(tmp_path: Path) -> None:
    rt = Runtime(log=tmp_path / "log")
    fs, db, mail = _program(tmp_path, rt)
    crash_at("step.applied")  # the mail went out; the log does not know yet
    with pytest.raises(Crash), rt.transaction():
        mail.send("a@example.org", "s", "b")
    _abandon(rt)
    report = recover(tmp_path / "log")
    assert report.clean and report.already == 1 and report.delivered == 0
    assert len(_outbox(tmp_path)) == 1


def test_uncommitted_transaction_aborts_and_compensates_on_rt_recover(tmp_path: Path) -> None:
    made = tmp_path / "made"

    def tools(rt: Runtime) -> Any:
        @rt.tool(
            effect="reversible",
            writes="fs:" + str(made) + "/{name}",
            compensate=lambda call: (made / call.args["name"]).unlink(missing_ok=True),
        )
        def make(name: str) -> str:
            made.mkdir(exist_ok=True)
            (made / name).write_text(name)
            return name

        return make

    rt = Runtime(log=tmp_path / "log")
    fs, _, mail = _program(tmp_path, rt)
    make = tools(rt)
    crash_at("intent.written")
    with pytest.raises(Crash), rt.transaction():
        make("x")
        fs.write_text("a.txt", "A")
        mail.send("a@example.org", "s", "b")
    _abandon(rt)
    assert (made / "x").exists()
    cli = runner.invoke(app, ["recover", str(tmp_path / "log")])
    assert cli.exit_code == 1 and "call rt.recover()" in cli.output, cli.output
    assert (made / "x").exists()  # the CLI does not guess
    rt2 = Runtime(log=tmp_path / "log")
    assert rt2.recovery is not None and len(rt2.recovery.pending) == 1
    tools(rt2)
    report = rt2.recover()
    assert report.clean and report.compensated == 1, str(report)
    assert not (made / "x").exists()
    assert not (tmp_path / "root" / "a.txt").exists() and _outbox(tmp_path) == []
    rt2.close()


def test_unredoable_effects_are_reported_as_needing_a_human(tmp_path: Path) -> None:
    rt = Runtime(log=tmp_path / "log")
    got: list[Any] = []

    @rt.tool(effect="bufferable", writes="kv:{name}")
    def put_set(name: str, items: set[int]) -> None:
        got.append(items)

    with pytest.raises(Crash), rt.transaction() as tx:
        put_set("a", {1, 2})  # a set is not JSON
        tx.stage(Effect("by-hand", EffectClass.BUFFERABLE, ("kv:b",), "k-b", apply=lambda: None))
        crash_at("commit.marked")
    _abandon(rt)
    rt2 = Runtime(log=tmp_path / "log", recover=False)
    rt2.tool(put_set, effect="bufferable", writes="kv:{name}")
    report = rt2.recover()
    assert not report.clean and len(report.needs_human) == 2, str(report)
    whys = " ".join(a.why for a in report.needs_human)
    assert "not exactly JSON" in whys and "built by hand" in whys
    assert got == []  # nothing was guessed
    assert "needs a human" in str(report)
    rt2.close()


# ------------------------------------------------------------------------- keys and runs
def test_a_recovered_runs_new_transactions_do_not_collide_with_old_keys(tmp_path: Path) -> None:
    def session(rt: Runtime, version: str) -> None:
        fs, _, mail = _program(tmp_path, rt)
        with rt.transaction():
            fs.write_text("f.txt", version)
            mail.send("me@example.org", "reminder", "same body")

    rt = Runtime(log=tmp_path / "log")
    session(rt, "v1")
    crash_at("commit.marked")
    with pytest.raises(Crash):
        session(rt, "v2")
    _abandon(rt)
    rt2 = Runtime(log=tmp_path / "log")  # recovers v2 at start
    assert rt2.recovery is not None and len(rt2.recovery.finished) == 1
    assert (tmp_path / "root" / "f.txt").read_text() == "v2"
    session(rt2, "v1")  # the same calls as the first run's first transaction
    assert (tmp_path / "root" / "f.txt").read_text() == "v1"
    sent = _outbox(tmp_path)
    assert len(sent) == 3 and len({m["key"] for m in sent}) == 3
    assert rt.coordinator.run_id != rt2.coordinator.run_id
    assert rt.coordinator.run_id.startswith("r1-") and rt2.coordinator.run_id.startswith("r2-")
    rt2.close()


def _hold_log(directory: str, ready: Any, release: Any) -> None:
    rt = Runtime(log=directory)
    ready.set()
    release.wait(30)
    rt.close()


def test_a_second_process_on_a_live_log_is_refused(tmp_path: Path) -> None:
    """Refused, not shared: recovery by a second process could abort the first one's live
    transactions, so the log directory is locked while a process has it open."""
    logdir = tmp_path / "log"
    ready, release = _FORK.Event(), _FORK.Event()
    holder = _FORK.Process(target=_hold_log, args=(str(logdir), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(LogBusy, match=f"pid {holder.pid}"):
            Runtime(log=logdir)
        result = runner.invoke(app, ["recover", str(logdir)])
        assert result.exit_code == 2 and "in use" in result.output
    finally:
        release.set()
        holder.join(30)
    Runtime(log=logdir).close()  # free again once the holder has gone
    rt = Runtime(log=logdir)  # and in one process, a second open is refused too
    with pytest.raises(LogBusy):
        TxLog(logdir)
    rt.close()


def test_non_durable_log_and_a_log_object(tmp_path: Path) -> None:
    log = TxLog(tmp_path / "log", durable=False)
    rt = Runtime(log=log)
    fs, _, _ = _program(tmp_path, rt)
    crash_at("commit.marked")
    with pytest.raises(Crash), rt.transaction():
        fs.write_text("a.txt", "A")
    _abandon(rt)
    assert recover(tmp_path / "log").delivered == 1
    assert (tmp_path / "root" / "a.txt").read_text() == "A"


def test_atomix_recover_console_script_end_to_end(tmp_path: Path) -> None:
    rt = Runtime(log=tmp_path / "log")
    fs, db, _ = _program(tmp_path, rt)
    crash_at("commit.marked")
    with pytest.raises(Crash), rt.transaction():
        fs.write_text("a.txt", "A")
        db.put("t", "k", [1, 2])
    _abandon(rt)
    exe = Path(sys.executable).with_name("atomix")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cli"]
    done = subprocess.run(
        [*cmd, "recover", str(tmp_path / "log")],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1],
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 committed transaction(s) finished (2 effect(s) delivered" in done.stdout
    assert SQLiteStore(tmp_path / "db.sqlite").get("t", "k") == [1, 2]


def test_async_transactions_are_logged_too(tmp_path: Path) -> None:
    import asyncio

    rt = Runtime(log=tmp_path / "log")
    _, _, mail = _program(tmp_path, rt)

    async def body() -> None:
        async with rt.atransaction():
            mail.send("a@example.org", "s", "async")

    crash_at("commit.marked")
    with pytest.raises(Crash):
        asyncio.run(body())
    _abandon(rt)
    assert _outbox(tmp_path) == []
    report = recover(tmp_path / "log")
    assert report.clean and report.delivered == 1
    assert [m["body"] for m in _outbox(tmp_path)] == ["async"]


def test_the_log_benchmark_runs_and_checks_its_results() -> None:
    from harness.bench import runtime as bench

    for mode in bench.LOG_MODES:
        assert bench.bench_log_commit(mode, 3).n == 3
    assert bench.bench_log_commit("log, no fsync", 2, files=True).n == 2

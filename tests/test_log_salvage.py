"""A damaged durable log: one bad record is quarantined and the rest recovers; a log whose
body or WAL was lost is refused loudly, never read as clean.

Each test leaves a committed-but-unfinished transaction behind in a forked child that dies
at the committed mark (os._exit: no close, no checkpoint, the WAL keeps its records), then
damages the log and recovers through the public API (`Runtime(log=)`, `atomix recover`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import atomix.log as atomix_log
from atomix import Runtime
from atomix.adapters import FileStore, MailboxSink
from atomix.adapters.tools import file_tools, mail_tools
from atomix.log import LogError, TxLog
from cli import app

runner = CliRunner()
_FORK = multiprocessing.get_context("fork")


def _child(base: str, names: list[str], durable: bool) -> None:
    """Commit one transaction per name (a file and a mail each); die at the last one's
    committed mark, before anything of it is applied."""
    root = Path(base)
    try:
        rt = Runtime(log=TxLog(root / "log", durable=durable), recover=False)
        fs = file_tools(rt, FileStore(root / "files", durable=durable))
        mail = mail_tools(rt, MailboxSink(root / "outbox.jsonl"))
        for i, name in enumerate(names):
            if i == len(names) - 1:
                atomix_log.crash_hook = lambda at, detail: os._exit(0) if at == "commit.marked" else None
            with rt.transaction():
                fs.write_text(f"{name}.txt", name)
                mail.send(f"{name}@example.org", "hello", name)
    except BaseException as exc:  # noqa: BLE001 - the parent reads it
        (root / "child-error").write_text(repr(exc))
        os._exit(3)
    os._exit(4)  # the crash point was never reached


def _crash(base: Path, names: list[str], *, durable: bool = True) -> None:
    proc = _FORK.Process(target=_child, args=(str(base), names, durable))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0, (base / "child-error").read_text() if (base / "child-error").exists() else proc.exitcode


def _outbox(base: Path) -> list[str]:
    path = base / "outbox.jsonl"
    return [json.loads(x)["body"] for x in path.read_text().splitlines()] if path.exists() else []


def _committed_unfinished(base: Path, names: list[str]) -> None:
    """Two crashed runs: each leaves one committed, unfinished transaction in the log."""
    _crash(base, names[:1])
    _crash(base, names[1:])


def test_one_corrupt_record_is_quarantined_and_the_rest_recovers(tmp_path: Path) -> None:
    _committed_unfinished(tmp_path, ["alpha", "beta"])
    log = tmp_path / "log" / "atomix-log.sqlite3"
    conn = sqlite3.connect(log)
    # Corrupt the redo record of alpha's file write (its JSON), and nothing else.
    rows = conn.execute("SELECT key, redo FROM effects WHERE tool = 'fs.write_text'").fetchall()
    bad = next(key for key, redo in rows if json.loads(redo)["path"] == "alpha.txt")
    conn.execute("UPDATE effects SET redo = '{\"kind\": \"fs.write\", \"path\": ' WHERE key = ?", (bad,))
    conn.commit()
    conn.close()

    rt = Runtime(log=tmp_path / "log")  # before: LogError("corrupt redo record ...")
    report = rt.recovery
    assert report is not None
    assert len(report.finished) == 2, str(report)  # both transactions finished, but ...
    assert (tmp_path / "files" / "beta.txt").read_text() == "beta"
    assert not (tmp_path / "files" / "alpha.txt").exists()  # ... the quarantined write is not guessed
    assert sorted(_outbox(tmp_path)) == ["alpha", "beta"]
    assert not report.clean and len(report.needs_human) == 1
    assert "quarantined" in str(report) and "not JSON" in str(report)
    rt.close()
    status = runner.invoke(app, ["recover", "--status", str(tmp_path / "log")])
    assert status.exit_code == 1 and "1 quarantined" in status.output, status.output
    assert all(len(line) <= 80 for line in status.output.splitlines()), status.output
    data = json.loads(runner.invoke(app, ["recover", "--status", "--json", str(tmp_path / "log")]).output)
    assert len(data["quarantined"]) == 1 and bad in data["quarantined"][0]["record"]
    again = runner.invoke(app, ["recover", str(tmp_path / "log")])
    assert again.exit_code == 0 and "1 record(s) in quarantine" in again.output, again.output


def test_a_corrupt_transaction_record_does_not_stop_the_others(tmp_path: Path) -> None:
    _committed_unfinished(tmp_path, ["alpha", "beta"])
    conn = sqlite3.connect(tmp_path / "log" / "atomix-log.sqlite3")
    conn.execute("UPDATE txs SET state = 'garbled' WHERE rowid = (SELECT min(rowid) FROM txs)")
    conn.commit()
    conn.close()
    result = runner.invoke(app, ["recover", str(tmp_path / "log")])  # before: exit 0, one silently kept
    assert result.exit_code == 1 and "quarantined" in result.output, result.output
    assert "1 committed transaction(s) finished" in result.output
    assert len(_outbox(tmp_path)) == 1


def test_a_zero_length_log_is_refused_not_reported_clean(tmp_path: Path) -> None:
    _crash(tmp_path, ["alpha"])
    log = tmp_path / "log"
    for suffix in ("", "-wal", "-shm"):
        path = log / ("atomix-log.sqlite3" + suffix)
        if path.exists():
            path.write_bytes(b"")  # truncated to 0
    result = runner.invoke(app, ["recover", str(log)])  # before: exit 0, "nothing left to do"
    assert result.exit_code == 2, result.output
    assert "atomix-log.sqlite3" in result.output and "lost" in result.output
    with pytest.raises(LogError, match="lost"):
        Runtime(log=log)
    assert not (tmp_path / "files" / "alpha.txt").exists()


def test_a_deleted_wal_is_refused_not_reported_clean(tmp_path: Path) -> None:
    _crash(tmp_path, ["alpha"], durable=False)  # the committed mark lives in the WAL only
    log = tmp_path / "log"
    wal = log / "atomix-log.sqlite3-wal"
    assert wal.exists() and wal.stat().st_size > 0
    wal.unlink()
    (log / "atomix-log.sqlite3-shm").unlink(missing_ok=True)
    result = runner.invoke(app, ["recover", str(log)])  # before: exit 0, "nothing left to do"
    assert result.exit_code == 2, result.output
    assert "WAL" in result.output and "atomix-log.sqlite3-wal" in result.output
    with pytest.raises(LogError, match="WAL"):
        Runtime(log=log)
    status = runner.invoke(app, ["recover", "--status", str(log)])
    assert status.exit_code == 2 and "WAL" in status.output


def test_a_missing_log_body_with_its_sidecar_is_refused(tmp_path: Path) -> None:
    _crash(tmp_path, ["alpha"])
    for path in (tmp_path / "log").glob("atomix-log.sqlite3*"):
        path.unlink()
    with pytest.raises(LogError, match="missing or empty"):
        Runtime(log=tmp_path / "log")  # before: a fresh, empty log


def test_normal_ends_are_not_taken_for_a_lost_wal(tmp_path: Path) -> None:
    """No false alarms: a closed log; a program that exits without closing it; a crashed
    log that another SQLite connection opened and closed (which folds the WAL into the
    database and deletes it) all reopen."""
    rt = Runtime(log=tmp_path / "a")
    fs = file_tools(rt, FileStore(tmp_path / "files"))
    with rt.transaction():
        fs.write_text("x.txt", "x")
    rt.close()
    Runtime(log=tmp_path / "a").close()

    program = (
        "from atomix import Runtime\n"
        "from atomix.adapters import FileStore\n"
        "from atomix.adapters.tools import file_tools\n"
        f"rt = Runtime(log={str(tmp_path / 'b')!r})\n"
        f"fs = file_tools(rt, FileStore({str(tmp_path / 'files')!r}))\n"
        "with rt.transaction():\n"
        "    fs.write_text('y.txt', 'y')\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)
    Runtime(log=tmp_path / "b").close()

    _crash(tmp_path / "c", ["gamma"])
    conn = sqlite3.connect(tmp_path / "c" / "log" / "atomix-log.sqlite3")
    assert conn.execute("SELECT count(*) FROM txs").fetchone() == (1,)
    conn.close()
    assert not (tmp_path / "c" / "log" / "atomix-log.sqlite3-wal").exists()
    rt = Runtime(log=tmp_path / "c" / "log")
    assert rt.recovery is not None and len(rt.recovery.finished) == 1, str(rt.recovery)
    rt.close()

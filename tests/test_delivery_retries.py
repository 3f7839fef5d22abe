"""A delivery that fails at commit is kept in the durable log with its key and attempt count,
retried with backoff by the runtime and by `atomix recover`, and dead-lettered at the
configured limit; `atomix recover --status` lists pending, retried and dead entries.
Keyed delivery means a retry never sends twice. Also the log's housekeeping: temporary files
left by a killed writer and the applied keys of finished runs are cleaned up."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from atomix import Runtime
from atomix.adapters import FileStore, MailboxSink, SQLiteStore
from atomix.adapters.tools import file_tools, mail_tools, sqlite_tools
from atomix.errors import CommitIncomplete
from atomix.log import TxLog
from cli import app

runner = CliRunner()
_FORK = multiprocessing.get_context("fork")


class Flaky:
    """A mail gateway that is down for its first `down` sends (it raises), then up."""

    def __init__(self, sink: MailboxSink, down: int) -> None:
        self.sink = sink
        self.down = down
        self.calls = 0

    def __call__(self, to: str, subject: str, body: str, idempotency_key: str) -> bool:
        self.calls += 1
        if self.calls <= self.down:
            raise ConnectionError(f"gateway down (call {self.calls})")
        return self.sink.send(to, subject, body, key=idempotency_key)


def _wait(predicate: Any, what: str, limit: float = 20.0) -> None:
    end = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for: {what}"
        time.sleep(0.02)


def _rows(log: Path, sql: str) -> list[Any]:
    conn = sqlite3.connect(f"file:{log / 'atomix-log.sqlite3'}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_a_failed_delivery_is_retried_by_the_runtime_until_it_lands(tmp_path: Path) -> None:
    sink = MailboxSink(tmp_path / "outbox.jsonl")
    gateway = Flaky(sink, down=2)
    rt = Runtime(log=TxLog(tmp_path / "log", retry_backoff=0.05), apply_attempts=1)
    send = rt.tool(gateway, effect="irreversible", writes="mail:{to}", name="notify")
    with pytest.raises(CommitIncomplete):  # the commit itself could not deliver it
        with rt.transaction():
            send("ann@example.org", "hi", "one")
    _wait(lambda: len(sink.messages()) == 1, "the retried delivery")  # before: never
    assert gateway.calls == 3  # the commit's attempt, a failed retry, the one that landed
    _wait(lambda: not _rows(tmp_path / "log", "SELECT * FROM txs"), "the transaction done")
    assert _rows(tmp_path / "log", "SELECT * FROM deliveries") == []
    time.sleep(0.3)
    assert len(sink.messages()) == 1 and gateway.calls == 3  # landed once, not retried again
    rt.close()


def test_a_delivery_that_keeps_failing_is_dead_lettered_and_listed(tmp_path: Path) -> None:
    sink = MailboxSink(tmp_path / "outbox.jsonl")
    gateway = Flaky(sink, down=10**6)
    log = TxLog(tmp_path / "log", retry_backoff=0.02, max_delivery_attempts=3)
    rt = Runtime(log=log, apply_attempts=1)
    send = rt.tool(gateway, effect="irreversible", writes="mail:{to}", name="notify")
    with pytest.raises(CommitIncomplete):
        with rt.transaction():
            send("ann@example.org", "hi", "one")
    _wait(lambda: _rows(tmp_path / "log", "SELECT count(*) FROM dead_letters") == [(1,)], "a dead letter")
    assert gateway.calls == 3 and sink.messages() == []
    (key, attempts, error), = _rows(tmp_path / "log", "SELECT key, attempts, last_error FROM dead_letters")
    assert attempts == 3 and "gateway down (call 3)" in error and "notify" in key
    assert _rows(tmp_path / "log", "SELECT * FROM txs") == []  # nothing left to recover
    status = runner.invoke(app, ["recover", "--status", str(tmp_path / "log")])  # while live
    assert status.exit_code == 1, status.output
    assert "1 dead" in status.output and "gateway down" in status.output and "in use" in status.output
    assert all(len(line) <= 80 for line in status.output.splitlines()), status.output
    rt.close()
    data = json.loads(runner.invoke(app, ["recover", "--status", "--json", str(tmp_path / "log")]).output)
    assert [d["attempts"] for d in data["dead"]] == [3] and data["pending"] == data["retried"] == []


def _child_outage(base_text: str) -> None:
    """Commit a mail whose outbox cannot be written (a directory stands in its way), and end
    without the retry landing: the delivery stays in the log for `atomix recover`."""
    base = Path(base_text)
    try:
        (base / "outbox.jsonl").mkdir()
        sink = MailboxSink(base / "outbox.jsonl.real")  # a valid sink object for the tool ...
        sink._path = base / "outbox.jsonl"  # ... whose writes fail (IsADirectoryError)
        rt = Runtime(log=TxLog(base / "log", retry_backoff=3600), apply_attempts=2)
        mail = mail_tools(rt, sink)
        db = sqlite_tools(rt, SQLiteStore(base / "db.sqlite"))
        try:
            with rt.transaction():
                db.put("orders", 1, {"state": "paid"})
                mail.send("ann@example.org", "receipt", "paid")
        except CommitIncomplete:
            pass
        rt.close()
    except BaseException as exc:  # noqa: BLE001
        (base / "child-error").write_text(repr(exc))
        os._exit(3)
    os._exit(0)


def test_atomix_recover_retries_a_failed_delivery_once_the_outage_is_over(tmp_path: Path) -> None:
    proc = _FORK.Process(target=_child_outage, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0, (tmp_path / "child-error").read_text()
    status = runner.invoke(app, ["recover", "--status", str(tmp_path / "log")])
    assert status.exit_code == 1 and "1 retried" in status.output, status.output  # before: 0
    assert "IsADirectoryError" in status.output
    (tmp_path / "outbox.jsonl").rmdir()  # the outage is over
    result = runner.invoke(app, ["recover", str(tmp_path / "log")])
    assert result.exit_code == 0 and "1 effect(s) delivered" in result.output, result.output
    assert [m["body"] for m in MailboxSink(tmp_path / "outbox.jsonl").messages()] == ["paid"]
    assert SQLiteStore(tmp_path / "db.sqlite").get("orders", 1) == {"state": "paid"}
    again = runner.invoke(app, ["recover", str(tmp_path / "log")])
    assert again.exit_code == 0 and len(MailboxSink(tmp_path / "outbox.jsonl").messages()) == 1
    status = runner.invoke(app, ["recover", "--status", str(tmp_path / "log")])
    assert status.exit_code == 0 and "nothing pending" in status.output, status.output


def test_atomix_recover_counts_attempts_and_dead_letters_at_the_limit(tmp_path: Path) -> None:
    proc = _FORK.Process(target=_child_outage, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0, (tmp_path / "child-error").read_text()
    # The commit's delivery was the first attempt; each recovery adds one; the fifth is the last.
    outputs = [runner.invoke(app, ["recover", str(tmp_path / "log")]) for _ in range(5)]
    assert [r.exit_code for r in outputs] == [1, 1, 1, 1, 0], [r.output for r in outputs]
    assert "retried by the next recovery" in outputs[2].output
    assert "moved to the dead letters" in outputs[3].output and "IsADirectoryError" in outputs[3].output
    assert "nothing left to do" in outputs[4].output
    dead = _rows(tmp_path / "log", "SELECT tool, attempts FROM dead_letters")
    assert dead == [("mail.send", 5)]  # the default limit: 5 deliveries in all


# ----------------------------------------------------------------------------- housekeeping
def _child_killed_mid_write(base_text: str) -> None:
    """Die inside the file store's atomic write: the temporary file is written, not renamed."""
    base = Path(base_text)
    try:
        rt = Runtime(log=base / "log")
        fs = file_tools(rt, FileStore(base / "root"))
        with rt.transaction():
            fs.write_text("a.txt", "first")
        os.replace = lambda *args, **kwargs: os._exit(0)  # type: ignore[assignment]
        with rt.transaction():
            fs.write_text("b.txt", "second")
    except BaseException as exc:  # noqa: BLE001
        (base / "child-error").write_text(repr(exc))
        os._exit(3)
    os._exit(4)


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".atomix-tmp")]


def test_temporary_files_of_a_killed_writer_are_removed_by_recovery(tmp_path: Path) -> None:
    proc = _FORK.Process(target=_child_killed_mid_write, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0, (tmp_path / "child-error").read_text()
    assert len(_temp_files(tmp_path / "root")) == 1  # the killed write's
    result = runner.invoke(app, ["recover", str(tmp_path / "log")])
    assert result.exit_code == 0 and "1 temporary file(s) removed" in result.output, result.output
    assert _temp_files(tmp_path / "root") == []  # before: still there
    assert (tmp_path / "root" / "b.txt").read_text() == "second"  # and the write was finished


def test_applied_keys_of_finished_runs_are_pruned(tmp_path: Path) -> None:
    def session(retention: float, n: int) -> tuple[FileStore, SQLiteStore]:
        files, db = FileStore(tmp_path / "root"), SQLiteStore(tmp_path / "db.sqlite")
        rt = Runtime(log=TxLog(tmp_path / "log", key_retention=retention))
        fs, rows = file_tools(rt, files), sqlite_tools(rt, db)
        for i in range(n):
            with rt.transaction():
                fs.write_text(f"{i}.txt", str(i))
                rows.put("t", i, {"i": i})
        rt.close()
        return files, db

    def journal_lines() -> int:
        return len((tmp_path / "root" / ".atomix" / "applied").read_text().splitlines())

    session(3600.0, 3)
    assert journal_lines() == 3 and len(SQLiteStore(tmp_path / "db.sqlite").applied_keys()) == 3
    session(3600.0, 2)  # the first run is finished, but within its retention: kept
    assert journal_lines() == 5
    session(0.0, 1)  # now both earlier runs are past it: pruned (before: they stay for ever)
    assert journal_lines() == 1
    keys = SQLiteStore(tmp_path / "db.sqlite").applied_keys()
    assert len(keys) == 1 and all(k.startswith("r3-") for k in keys), keys
    # The stores themselves are untouched.
    assert sorted(p.name for p in (tmp_path / "root").glob("*.txt")) == ["0.txt", "1.txt", "2.txt"]
    assert SQLiteStore(tmp_path / "db.sqlite").get("t", 2) == {"i": 2}

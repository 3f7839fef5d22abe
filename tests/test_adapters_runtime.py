"""The runtime driving the real stores through `atomix.adapters.tools`: files in tmp_path, a real
SQLite file and a real outbox file, each checked on the substrate itself."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from atomix import CommitIncomplete, Runtime, TransactionAborted
from atomix.adapters import FileStore, MailboxSink, OpLog, SQLiteStore, row_effect
from atomix.adapters.tools import file_tools, mail_tools, sqlite_tools
from atomix.effects import Effect


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".atomix-tmp")]


def _raw_rows(db: Path, table: str) -> dict[str, Any]:
    """Rows read through a separate plain connection: the database file's own truth."""
    conn = sqlite3.connect(db)
    try:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)
        ).fetchone()
        if not exists:
            return {}
        return {k: json.loads(v) for k, v in conn.execute(f'SELECT k, v FROM "{table}"')}
    finally:
        conn.close()


def _outbox(path: Path) -> list[dict[str, Any]]:
    """The outbox file's records, parsed from the file."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


class Ambiguous(RuntimeError):
    """The call took effect, but its answer was lost."""


# ======================================================================================= files
def test_committed_file_appears_atomically_and_aborted_file_never_does(tmp_path: Path) -> None:
    rt = Runtime()
    store = FileStore(tmp_path)
    fs = file_tools(rt, store)
    with pytest.raises(RuntimeError), rt.transaction():
        fs.write_text("src/new.py", "print('never')")
        assert not (tmp_path / "src" / "new.py").exists()
        raise RuntimeError("abort")
    assert not (tmp_path / "src").exists()
    with rt.transaction() as tx:
        ack = fs.write_text("src/app.py", "v1")
        fs.write_text(str(tmp_path / "README"), "hello")
        assert not (tmp_path / "src" / "app.py").exists()  # not before commit
    assert (tmp_path / "src" / "app.py").read_text() == "v1"
    assert (tmp_path / "README").read_text() == "hello"
    assert _temp_files(tmp_path) == []
    assert ack.key in store.applied_keys()  # the effect's key reached the store
    assert tx.settlement is not None and tx.settlement.applied[0] == ack.key
    assert tx.settlement.writes == tuple(sorted([store.scope("src/app.py"), store.scope("README")]))


def test_read_text_sees_own_staged_writes_and_registers_its_scope(tmp_path: Path) -> None:
    rt = Runtime()
    store = FileStore(tmp_path)
    store.write("notes.txt", "committed")
    fs = file_tools(rt, store)
    with rt.transaction() as tx:
        assert fs.read_text("notes.txt") == "committed"
        fs.write_text("notes.txt", "draft 1")
        fs.write_text("./sub/../notes.txt", "draft 2")  # an alias of the same file
        assert fs.read_text("notes.txt") == "draft 2"
        assert fs.read_text("missing.txt") is None
        assert store.read_text("notes.txt") == "committed"
    assert fs.read_text("notes.txt") == "draft 2"
    assert tx.settlement is not None
    assert store.scope("notes.txt") in tx.settlement.reads
    assert store.scope("missing.txt") in tx.settlement.reads


def test_file_write_retried_after_an_ambiguous_failure_lands_once(tmp_path: Path) -> None:
    class FlakyFileStore(FileStore):
        failures = 1

        def write(self, path: Any, data: Any, **kw: Any) -> bool:
            done = super().write(path, data, **kw)
            if self.failures:
                self.failures -= 1
                raise Ambiguous("written, but the answer was lost")
            return done

    log = OpLog()
    rt = Runtime()
    fs = file_tools(rt, FlakyFileStore(tmp_path, oplog=log))
    with rt.transaction() as tx:
        fs.write_text("a.txt", "once")
    assert tx.settlement is not None and tx.settlement.clean
    assert [op.kind for op in log.ops()] == ["write", "dedup"]
    assert (tmp_path / "a.txt").read_text() == "once"


# ====================================================================================== sqlite
def test_all_row_writes_of_a_transaction_commit_in_one_sqlite_transaction(tmp_path: Path) -> None:
    log = OpLog()
    store = SQLiteStore(tmp_path / "shop.db", oplog=log)
    rt = Runtime()
    db = sqlite_tools(rt, store)
    fs = file_tools(rt, FileStore(tmp_path / "files"))
    store.put("orders", 0, {"seed": True})
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)  # every statement the store runs
    with rt.transaction() as tx:
        db.put("orders", 1, {"item": "a"})
        fs.write_text("receipt.txt", "between the rows")
        db.put("orders", "2", {"item": "b"})
        db.delete("orders", 0)
        db.put("Customers", 7, "ann")
        assert statements == []  # nothing before commit
        assert db.get("orders", 2) == {"item": "b"}  # read-your-writes
        assert db.get("orders", 0) is None  # a staged delete reads as absent
    store._conn.set_trace_callback(None)
    assert sum(s.startswith("BEGIN") for s in statements) == 1
    assert sum(s == "COMMIT" for s in statements) == 1
    assert _raw_rows(store.path, "orders") == {"1": {"item": "a"}, "2": {"item": "b"}}
    assert _raw_rows(store.path, "customers") == {"7": "ann"}
    ops = [op for op in log.ops() if op.key is not None and op.key.startswith(tx.session.key_prefix)]
    assert [op.kind for op in ops] == ["upsert", "upsert", "delete", "upsert"]
    assert [op.seq for op in ops] == list(range(ops[0].seq, ops[0].seq + 4))  # contiguous
    assert tx.settlement is not None and len(tx.settlement.applied) == 5
    assert {op.key for op in ops} <= store.applied_keys()


class FailingBatchStore(SQLiteStore):
    """Fails `failures` batches between the row writes and their keys (the store's test hook)."""

    failures = 0
    seen_mid_failure: dict[str, Any] | None = None

    def apply_batch(self, effects: Sequence[Effect], *, _fail_after_rows: bool = False) -> None:
        if self.failures:
            self.failures -= 1
            try:
                super().apply_batch(effects, _fail_after_rows=True)
            finally:
                self.seen_mid_failure = _raw_rows(self.path, "t")
            return
        super().apply_batch(effects)


def test_a_failed_batch_leaves_no_row_and_its_retry_applies_every_row_once(tmp_path: Path) -> None:
    store = FailingBatchStore(tmp_path / "db.sqlite")
    store.failures = 1
    rt = Runtime()
    db = sqlite_tools(rt, store)
    with rt.transaction() as tx:
        for k in range(3):
            db.put("t", k, k * 10)
    assert store.seen_mid_failure == {}  # the failed attempt rolled back every row
    assert _raw_rows(store.path, "t") == {"0": 0, "1": 10, "2": 20}
    assert tx.settlement is not None and tx.settlement.clean and len(tx.settlement.applied) == 3


def test_a_batch_that_keeps_failing_lands_nothing_and_is_reported(tmp_path: Path) -> None:
    store = FailingBatchStore(tmp_path / "db.sqlite")
    store.failures = 99
    rt = Runtime(apply_attempts=3)
    db = sqlite_tools(rt, store)
    with pytest.raises(CommitIncomplete) as raised, rt.transaction() as tx:
        db.put("t", 1, "a")
        db.put("t", 2, "b")
    s = tx.settlement
    assert s is not None and s.committed and not s.clean and raised.value.settlement is s
    assert len(s.failed_applies) == 2 and s.applied == ()
    assert set(s.errors) == set(s.failed_applies)  # each one's exception is kept
    assert "did not land" in str(raised.value)
    assert store.failures == 96 and _raw_rows(store.path, "t") == {}


def test_aborted_rows_never_land(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    rt = Runtime()
    db = sqlite_tools(rt, store)
    db.put("t", 1, "committed")  # outside a transaction: one of its own
    with pytest.raises(ValueError), rt.transaction() as tx:
        db.put("t", 1, "overwritten?")
        db.put("t", 2, "new?")
        db.delete("t", 1)
        raise ValueError("abort")
    assert _raw_rows(store.path, "t") == {"1": "committed"}
    assert tx.settlement is not None and len(tx.settlement.dropped) == 3
    assert db.get("t", 1) == "committed"


def test_row_writes_are_rejected_on_bad_input_and_abort_the_transaction(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    rt = Runtime()
    db = sqlite_tools(rt, store)
    with pytest.raises(ValueError), rt.transaction():
        db.put("t", 1, "fine")
        db.put("t", 2, None)
    with pytest.raises(ValueError), rt.transaction():
        db.put("bad table!", 1, "x")
    assert _raw_rows(store.path, "t") == {}


def test_a_stale_row_read_is_retried_by_run(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    rt = Runtime()
    db = sqlite_tools(rt, store)
    db.put("stock", "apples", 5)
    earlier = rt.transaction()
    attempts: list[int] = []

    def body(tx: Any) -> int:
        attempts.append(tx.epoch)
        have = db.get("stock", "apples")
        if len(attempts) == 1:
            earlier.stage(_row(rt, store, earlier, 9))
            earlier.commit()
        db.put("stock", "apples", have - 1)
        return have

    assert rt.run(body) == 9
    assert len(attempts) == 2 and _raw_rows(store.path, "stock") == {"apples": 8}


def _row(rt: Runtime, store: SQLiteStore, tx: Any, value: int) -> Effect:
    return row_effect(store, "stock", "apples", value, key=tx.session.key("manual", "1"))


# ===================================================================================== mailbox
def test_gated_message_leaves_only_at_commit_exactly_once_despite_a_retry(tmp_path: Path) -> None:
    class AmbiguousSink(MailboxSink):
        failures = 1

        def send(self, to: str, subject: str, body: str, **kw: Any) -> bool:
            sent = super().send(to, subject, body, **kw)
            if self.failures:
                self.failures -= 1
                raise Ambiguous("sent, but the answer was lost")
            return sent

    outbox = tmp_path / "outbox.jsonl"
    sink = AmbiguousSink(outbox)
    rt = Runtime()
    mail = mail_tools(rt, sink)
    with rt.transaction() as tx:
        ack = mail.send("Ann@Example.org", "hello", "body")
        assert ack.status == "queued"
        assert _outbox(outbox) == []  # held at the gate
    records = _outbox(outbox)
    assert len(records) == 1 and sink.failures == 0  # the release was retried, under its key
    assert records[0]["key"] == ack.key and records[0]["to"] == "ann@example.org"
    s = tx.settlement
    assert s is not None and s.released == (ack.key,) and s.clean
    assert s.writes == (MailboxSink.scope("ann@example.org"),)


def test_aborted_message_is_never_sent(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox.jsonl"
    rt = Runtime()
    mail = mail_tools(rt, MailboxSink(outbox))
    with pytest.raises(TransactionAborted), rt.transaction() as tx:
        mail.send("bob@example.org", "s", "b")
        tx.seal()
        mail.send("bob@example.org", "late", "b")  # after seal: the transaction aborts
    assert _outbox(outbox) == []
    assert tx.settlement is not None and tx.settlement.abort_source == "seal_violation"


# ================================================================================= all at once
def test_one_transaction_over_three_substrates_is_all_or_nothing(tmp_path: Path) -> None:
    rt = Runtime()
    fs = file_tools(rt, FileStore(tmp_path / "repo"))
    store = SQLiteStore(tmp_path / "shop.db")
    db = sqlite_tools(rt, store)
    outbox = tmp_path / "outbox.jsonl"
    mail = mail_tools(rt, MailboxSink(outbox))

    def order(tx: Any, fail: bool) -> None:
        db.put("orders", 42, {"status": "paid"})
        fs.write_text("invoices/42.txt", "invoice 42")
        mail.send("ann@example.org", "paid", "order 42")
        if fail:
            raise RuntimeError("payment declined after all")

    with pytest.raises(RuntimeError), rt.transaction() as tx:
        order(tx, fail=True)
    assert _raw_rows(store.path, "orders") == {}
    assert not (tmp_path / "repo" / "invoices").exists() and _outbox(outbox) == []
    rt.run(lambda tx: order(tx, fail=False))
    assert _raw_rows(store.path, "orders") == {"42": {"status": "paid"}}
    assert (tmp_path / "repo" / "invoices" / "42.txt").read_text() == "invoice 42"
    assert len(_outbox(outbox)) == 1


def test_speculative_branches_over_real_files(tmp_path: Path) -> None:
    rt = Runtime()
    fs = file_tools(rt, FileStore(tmp_path))
    outbox = tmp_path / "outbox.jsonl"
    mail = mail_tools(rt, MailboxSink(outbox))
    branches = [rt.branch("fix", i) for i in range(3)]
    for i, branch in enumerate(branches):
        with branch:
            fs.write_text("app.py", f"candidate {i}")
            assert fs.read_text("app.py") == f"candidate {i}"  # each branch sees its own draft
            mail.send("reviewer@example.org", "patch", f"candidate {i}")
    assert not (tmp_path / "app.py").exists() and _outbox(outbox) == []
    winner, losers = rt.resolve("fix", branches[1])
    assert (tmp_path / "app.py").read_text() == "candidate 1"
    assert [r["body"] for r in _outbox(outbox)] == ["candidate 1"]
    assert winner.committed and all(s.abort_source == "losing_speculation" for s in losers)
    assert _temp_files(tmp_path) == []


# ============================================================================= keys and repeats
def test_writing_a_then_b_then_a_again_leaves_a(tmp_path: Path) -> None:
    rt = Runtime()
    fs = file_tools(rt, FileStore(tmp_path / "files"))
    store = SQLiteStore(tmp_path / "db.sqlite")
    db = sqlite_tools(rt, store)
    with rt.transaction() as tx:
        keys = [fs.write_text("f.txt", v).key for v in ("A", "B", "A")]
        keys += [db.put("t", 1, v).key for v in ("A", "B", "A")]
        assert fs.read_text("f.txt") == "A" and db.get("t", 1) == "A"
    assert len(set(keys)) == 6  # a returning value is a new write, not a duplicate
    assert (tmp_path / "files" / "f.txt").read_text() == "A"
    assert _raw_rows(store.path, "t") == {"1": "A"}
    assert tx.settlement is not None and tx.settlement.duplicates_suppressed == 0


def test_two_identical_sends_are_two_mails(tmp_path: Path) -> None:
    """Sending the same reminder twice on purpose sends it twice: each call has its own key."""
    outbox = tmp_path / "outbox.jsonl"
    rt = Runtime()
    mail = mail_tools(rt, MailboxSink(outbox))
    with rt.transaction() as tx:
        first = mail.send("ann@example.org", "s", "same body")
        again = mail.send("ann@example.org", "s", "same body")
        other = mail.send("ann@example.org", "s", "another body")
    assert len({first.key, again.key, other.key}) == 3
    assert [r["body"] for r in _outbox(outbox)] == ["same body", "same body", "another body"]
    assert tx.settlement is not None and tx.settlement.duplicates_suppressed == 0


def test_the_ready_made_tools_import_from_the_package() -> None:
    """README-style imports: the tools are reachable from `atomix.adapters` itself."""
    from atomix.adapters import file_tools as ft
    from atomix.adapters import mail_tools as mt
    from atomix.adapters import sqlite_tools as st

    assert (ft, st, mt) == (file_tools, sqlite_tools, mail_tools)
    with pytest.raises(ImportError):
        from atomix.adapters import no_such_tool  # noqa: F401

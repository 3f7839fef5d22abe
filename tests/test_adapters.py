"""Stores on real substrates: files in tmp_path, real SQLite files, real append-only files."""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atomix.adapters import FileStore, MailboxSink, Op, OpLog, RowWrite, SQLiteStore, row_effect
from atomix.effects import EffectClass
from atomix.scope_kinds import fs_scope, sqlite_scope


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".atomix-tmp")]


def _raw_rows(db: Path, table: str) -> list[tuple[str, str]]:
    """Rows read with a separate, plain sqlite3 connection: the file's own truth."""
    conn = sqlite3.connect(db)
    try:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)
        ).fetchone()
        if not exists:
            return []
        return conn.execute(f'SELECT k, v FROM "{table}" ORDER BY k').fetchall()
    finally:
        conn.close()


def _raw_keys(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT key FROM _atomix_applied ORDER BY key")]
    finally:
        conn.close()


# =============================================================================== filesystem


def test_fs_write_is_atomic_replace_and_leaves_no_temp_files(tmp_path: Path) -> None:
    fs = FileStore(tmp_path)
    assert fs.write("src/app.py", "v1") is True
    assert fs.write("src/app.py", b"v2") is True
    assert fs.read("src/app.py") == b"v2"
    assert fs.read_text("src/app.py") == "v2"
    assert (tmp_path / "src" / "app.py").read_bytes() == b"v2"
    assert _temp_files(tmp_path) == []
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["app.py"]


def test_fs_failed_write_keeps_previous_content(tmp_path: Path) -> None:
    fs = FileStore(tmp_path)
    fs.write("a.txt", "old")
    with pytest.raises(UnicodeEncodeError):
        fs.write("a.txt", "\ud800 lone surrogate")  # str that UTF-8 cannot encode
    with pytest.raises(TypeError):
        fs.write("a.txt", 12345)  # type: ignore[arg-type]
    assert fs.read_text("a.txt") == "old"
    assert _temp_files(tmp_path) == []


def test_fs_write_failing_after_temp_file_cleans_up(tmp_path: Path) -> None:
    # The target is a directory: the temp file is written and fsynced, then os.replace fails.
    fs = FileStore(tmp_path)
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "keep.txt").write_text("kept")
    with pytest.raises(OSError):
        fs.write("d/sub", "x", key="k")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["keep.txt", "sub"]
    assert (tmp_path / "d" / "sub").is_dir()
    # A failed write records no key: the retry is not deduplicated away.
    assert "k" not in fs.applied_keys()


def test_fs_dedup_by_key_and_across_reopen(tmp_path: Path) -> None:
    fs = FileStore(tmp_path)
    assert fs.write("f.txt", "first", key="t1:e1:b0:f") is True
    assert fs.write("f.txt", "second", key="t1:e1:b0:f") is False
    assert fs.read_text("f.txt") == "first"
    journal = tmp_path / ".atomix" / "applied"
    assert json.loads(journal.read_text().splitlines()[0])["key"] == "t1:e1:b0:f"

    again = FileStore(tmp_path)
    assert again.write("f.txt", "third", key="t1:e1:b0:f") is False
    assert again.read_text("f.txt") == "first"
    assert again.delete("f.txt", key="t1:e1:b0:f") is False
    assert again.exists("f.txt")


def test_fs_key_none_always_applies(tmp_path: Path) -> None:
    log = OpLog()
    fs = FileStore(tmp_path, oplog=log)
    assert fs.write("f.txt", "same") is True
    assert fs.write("f.txt", "same") is True
    assert [op.kind for op in log.ops()] == ["write", "write"]
    assert fs.applied_keys() == frozenset()


def test_fs_delete(tmp_path: Path) -> None:
    log = OpLog()
    fs = FileStore(tmp_path, oplog=log)
    fs.write("x/y.txt", "data")
    assert fs.before_image("x/y.txt") == b"data"
    assert fs.delete("x/y.txt", key="d1") is True
    assert not fs.exists("x/y.txt")
    assert fs.before_image("x/y.txt") is None
    # A late duplicate must not delete a file created afterwards.
    fs.write("x/y.txt", "recreated")
    assert fs.delete("x/y.txt", key="d1") is False
    assert fs.read_text("x/y.txt") == "recreated"
    # Deleting an absent file is a blind write: applied and keyed.
    assert fs.delete("nope.txt", key="d2") is True
    assert "d2" in fs.applied_keys()
    assert [op.kind for op in log.ops()] == ["write", "delete", "write", "dedup", "delete"]


@pytest.mark.parametrize("bad", ["../outside.txt", "a/../../outside.txt", "/etc/passwd", ".", ""])
def test_fs_escaping_root_is_rejected(tmp_path: Path, bad: str) -> None:
    fs = FileStore(tmp_path / "root")
    with pytest.raises(ValueError):
        fs.write(bad, "x")
    assert not (tmp_path / "outside.txt").exists()


def test_fs_symlink_out_of_root_and_meta_dir_are_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fs = FileStore(root)
    (tmp_path / "secret.txt").write_text("s")
    (root / "link").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ValueError):
        fs.write("link", "overwritten")
    assert (tmp_path / "secret.txt").read_text() == "s"
    with pytest.raises(ValueError):
        fs.write(".atomix/applied", "forged")
    with pytest.raises(ValueError):
        fs.read(root / ".atomix" / "applied")


def test_fs_absolute_path_under_root_is_accepted(tmp_path: Path) -> None:
    fs = FileStore(tmp_path)
    fs.write(tmp_path / "abs.txt", "a")
    assert fs.read_text("abs.txt") == "a"


def test_fs_aliases_are_one_scope_and_one_file(tmp_path: Path) -> None:
    fs = FileStore(tmp_path)
    fs.write("src/app.py", "v1")
    (tmp_path / "alias.py").symlink_to(tmp_path / "src" / "app.py")
    canonical = fs.scope("src/app.py")
    assert canonical == str(fs_scope(tmp_path / "src" / "app.py"))
    assert fs.scope("./src/../src/app.py") == canonical
    assert fs.scope("alias.py") == canonical
    fs.write("alias.py", "v2")  # writes the target, keeps the link
    assert (tmp_path / "alias.py").is_symlink()
    assert fs.read_text("src/app.py") == "v2"


def test_fs_casefold_store_matches_names_case_insensitively(tmp_path: Path) -> None:
    fs = FileStore(tmp_path, casefold=True)
    fs.write("Src/App.py", "v1")
    assert fs.scope("src/app.py") == fs.scope("SRC/APP.PY")
    fs.write("SRC/APP.PY", "v2")
    assert fs.snapshot() == {"Src/App.py": b"v2"}  # case-preserving, like a real such disk
    assert fs.read_text("src/app.py") == "v2"
    with pytest.raises(ValueError):
        fs.write(".ATOMIX/applied", "forged")
    # A case-sensitive store keeps them apart.
    plain = FileStore(tmp_path / "plain")
    plain.write("A.txt", "a")
    plain.write("a.txt", "b")
    assert plain.scope("A.txt") != plain.scope("a.txt")
    assert len(plain.snapshot()) == 2


def test_fs_snapshot_excludes_meta_dir(tmp_path: Path) -> None:
    fs = FileStore(tmp_path)
    fs.write("a.txt", "A", key="k1")
    fs.write("d/b.bin", b"\x00\x01", key="k2")
    assert (tmp_path / ".atomix" / "applied").is_file()
    assert fs.snapshot() == {"a.txt": b"A", "d/b.bin": b"\x00\x01"}


def test_fs_oplog_records_writes_dedups_and_requested_reads(tmp_path: Path) -> None:
    log = OpLog()
    fs = FileStore(tmp_path, oplog=log)
    scope = fs.scope("a.txt")
    fs.write("a.txt", "A", key="k", meta={"tx": 1, "epoch": 3})
    fs.write("a.txt", "B", key="k", meta={"tx": 2, "epoch": 4})
    fs.read("a.txt")  # not logged
    fs.read("a.txt", log_read=True, meta={"tx": 5})
    ops = log.ops()
    assert [(o.seq, o.substrate, o.scope, o.kind, o.key) for o in ops] == [
        (1, "fs", scope, "write", "k"),
        (2, "fs", scope, "dedup", "k"),
        (3, "fs", scope, "read", None),
    ]
    assert ops[0].meta == {"tx": 1, "epoch": 3}
    assert ops[1].meta == {"tx": 2, "epoch": 4}


def test_fs_journal_with_torn_tail_is_repaired(tmp_path: Path) -> None:
    fs = FileStore(tmp_path)
    fs.write("a.txt", "A", key="k1")
    journal = tmp_path / ".atomix" / "applied"
    with open(journal, "a") as fh:
        fh.write('{"key": "k2", "ki')  # a crash mid-append: k2 was never acknowledged
    again = FileStore(tmp_path)
    assert again.applied_keys() == {"k1"}
    assert again.write("b.txt", "B", key="k2") is True
    assert FileStore(tmp_path).applied_keys() == {"k1", "k2"}


# =============================================================================== oplog


def test_oplog_persists_json_lines_and_continues_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ops.jsonl"
    with OpLog(path) as log:
        log.append("fs", "fs:/x", "write", key="k", meta={"tx": 1})
        log.append("mail", "mail:a@b", "dedup", key="m")
    assert OpLog.load(path) == [
        Op(1, "fs", "fs:/x", "write", "k", {"tx": 1}),
        Op(2, "mail", "mail:a@b", "dedup", "m", {}),
    ]
    with open(path, "a") as fh:
        fh.write('{"seq": 3, "subs')  # torn by a crash
    with OpLog(path) as log:
        assert len(log) == 2
        op = log.append("sqlite", "sqlite:/db:t:1", "upsert", meta={"obj": object()})
        assert op.seq == 3
    assert [o.seq for o in OpLog.load(path)] == [1, 2, 3]


def test_oplog_is_thread_safe(tmp_path: Path) -> None:
    log = OpLog(tmp_path / "ops.jsonl")

    def worker(n: int) -> None:
        for i in range(100):
            log.append("fs", f"fs:/{n}/{i}", "write")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert [o.seq for o in log.ops()] == list(range(1, 401))
    assert OpLog.load(tmp_path / "ops.jsonl") == log.ops()


# =============================================================================== sqlite


def test_sqlite_wal_and_string_and_int_keys_are_one_row(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    with SQLiteStore(db) as store:
        raw = sqlite3.connect(db)
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        raw.close()
        assert store.put("orders", 42, {"qty": 1}) is True
        assert store.put("orders", "42", {"qty": 2}) is True
        assert store.put("Orders", 42.0, {"qty": 3}) is True  # table names fold too
        assert store.get("orders", "42") == {"qty": 3}
        assert store.scope("orders", 42) == store.scope("orders", "42")
        assert store.scope("orders", 42) == str(sqlite_scope(db, "orders", 42))
        assert store.snapshot() == {"orders": {"42": {"qty": 3}}}
        assert _raw_rows(db, "orders") == [("42", '{"qty": 3}')]
        # "042" is a different (string) key, not the integer 42.
        store.put("orders", "042", "other")
        assert store.get("orders", 42) == {"qty": 3}


def test_sqlite_get_missing_delete_and_bad_input(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "x.db") as store:
        assert store.get("nope", 1) is None
        store.ensure_table("t")
        assert store.get("t", 1) is None
        store.put("t", 1, [1, 2])
        assert store.delete("t", 1, key="del-1") is True
        assert store.get("t", 1) is None
        assert store.delete("t", 1, key="del-1") is False
        with pytest.raises(ValueError):
            store.put("t", 1, None)
        with pytest.raises(ValueError):
            store.put("_atomix_applied", "k", 1)
        with pytest.raises(ValueError):
            store.put('t"; DROP TABLE t; --', 1, 1)
        with pytest.raises(ValueError):
            store.put("t", 1, float("nan"))
        with pytest.raises(TypeError):
            store.put("t", 1, object())
        assert store.snapshot() == {"t": {}}


def test_sqlite_put_dedups_by_key_and_logs(tmp_path: Path) -> None:
    log = OpLog()
    with SQLiteStore(tmp_path / "x.db", oplog=log) as store:
        assert store.put("t", 1, "a", key="k1", meta={"tx": 7}) is True
        assert store.put("t", 1, "b", key="k1", meta={"tx": 8}) is False
        assert store.put("t", 1, "c") is True
        assert store.put("t", 1, "c") is True
        assert store.get("t", 1) == "c"
        store.get("t", 1, log_read=True, meta={"tx": 9})
        scope = store.scope("t", 1)
    assert [(o.kind, o.key, o.scope, o.meta) for o in log.ops()] == [
        ("upsert", "k1", scope, {"tx": 7}),
        ("dedup", "k1", scope, {"tx": 8}),
        ("upsert", None, scope, {}),
        ("upsert", None, scope, {}),
        ("read", None, scope, {"tx": 9}),
    ]


def test_sqlite_keys_are_durable_across_reopen(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with SQLiteStore(db) as store:
        assert store.put("t", "a", 1, key="k-a") is True
    with SQLiteStore(db) as reopened:
        assert reopened.put("t", "a", 2, key="k-a") is False
        assert reopened.get("t", "a") == 1
        assert reopened.applied_keys() == {"k-a"}
    # Two live stores on one file see each other's keys: the set lives in the database.
    with SQLiteStore(db) as one, SQLiteStore(db) as two:
        assert one.put("t", "b", 1, key="k-b") is True
        assert two.put("t", "b", 2, key="k-b") is False


def test_sqlite_row_effect_shape_and_single_row_fallback(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with SQLiteStore(db) as store:
        eff = row_effect(store, "orders", 7, {"s": "paid"}, key="tr:3:0:orders:7", meta={"tx": 1})
        assert eff.effect_class is EffectClass.BUFFERABLE
        assert eff.batch is store
        assert eff.payload == RowWrite("orders", "7", {"s": "paid"}, {"tx": 1})
        assert eff.scopes == (sqlite_scope(db, "orders", 7),)
        assert eff.tool == "sqlite.put"
        assert eff.compensate is None
        assert store.get("orders", 7) is None  # staging applies nothing
        assert eff.apply is not None
        assert eff.apply() is True
        assert eff.apply() is False
        store.apply_batch([eff])  # same key through the batch path: still once
        assert store.snapshot() == {"orders": {"7": {"s": "paid"}}}
        gone = row_effect(store, "orders", "7", None, key="tr:3:0:orders:7:del", tool="sqlite.del")
        assert gone.payload.value is None
        store.apply_batch([gone])
        assert store.get("orders", 7) is None
        with pytest.raises(TypeError):
            row_effect(store, "orders", 8, {1, 2}, key="bad")  # not JSON: fails at staging


def test_sqlite_apply_batch_is_all_or_nothing_and_retry_applies_once(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    log = OpLog()
    with SQLiteStore(db, oplog=log) as store:
        store.put("accounts", "seed", 0)
        effects = [
            row_effect(store, "accounts", i, {"balance": i * 10}, key=f"t1:e5:b0:{i}")
            for i in range(3)
        ]
        effects.append(row_effect(store, "ledger", 1, "entry", key="t1:e5:b0:ledger"))
        with pytest.raises(RuntimeError, match="injected"):
            store.apply_batch(effects, _fail_after_rows=True)
        # Neither rows nor keys: checked on the file through a separate connection.
        assert _raw_rows(db, "accounts") == [("seed", "0")]
        assert _raw_rows(db, "ledger") == []
        assert _raw_keys(db) == []
        assert [o.kind for o in log.ops()] == ["upsert"]  # the failed batch logged nothing

        store.apply_batch(effects)  # the retry
        store.apply_batch(effects)  # and a duplicate delivery of it
        assert store.snapshot() == {
            "accounts": {
                "0": {"balance": 0},
                "1": {"balance": 10},
                "2": {"balance": 20},
                "seed": 0,
            },
            "ledger": {"1": "entry"},
        }
        assert store.applied_keys() == {e.key for e in effects}
    kinds = [o.kind for o in log.ops()]
    assert kinds == ["upsert"] + ["upsert"] * 4 + ["dedup"] * 4


def test_sqlite_apply_batch_rejects_foreign_payloads_before_writing(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "a.db") as a, SQLiteStore(tmp_path / "b.db") as b:
        good = row_effect(a, "t", 1, "x", key="k1")
        foreign = row_effect(b, "t", 2, "y", key="k2")
        with pytest.raises(ValueError):
            a.apply_batch([good, foreign])
        assert a.snapshot() == {}
        assert b.snapshot() == {}


def test_sqlite_repeated_key_inside_one_batch_applies_once(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "x.db") as store:
        first = row_effect(store, "t", 1, "first", key="same")
        second = row_effect(store, "t", 1, "second", key="same")
        store.apply_batch([first, second])
        assert store.get("t", 1) == "first"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3), st.integers()), max_size=12))
def test_sqlite_each_key_applies_at_most_once(calls: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        log = OpLog()
        with SQLiteStore(Path(d) / "x.db", oplog=log) as store:
            applied = [store.put("t", row, value, key=k) for k, row, value in calls]
            expected: dict[int, int] = {}
            for (_k, row, value), ok in zip(calls, applied, strict=True):
                if ok:
                    expected[row] = value  # among applied writes, the last to a row wins
            assert sum(applied) == len({k for k, _, _ in calls})
            assert store.snapshot().get("t", {}) == {str(r): v for r, v in expected.items()}
        kinds = [o.kind for o in log.ops()]
        assert kinds.count("upsert") == sum(applied)
        assert kinds.count("dedup") == len(calls) - sum(applied)


def test_sqlite_concurrent_writers_all_land(tmp_path: Path) -> None:
    log = OpLog()
    db = tmp_path / "x.db"
    errors: list[BaseException] = []
    with SQLiteStore(db, oplog=log) as store:

        def worker(n: int) -> None:
            try:
                for i in range(50):
                    assert store.put("rows", f"{n}-{i}", {"n": n, "i": i}, key=f"w{n}:{i}")
            except BaseException as exc:  # surfaced below: a thread's assert is otherwise lost
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert len(_raw_rows(db, "rows")) == 200
    assert len(_raw_keys(db)) == 200
    assert [o.seq for o in log.ops()] == list(range(1, 201))


# =============================================================================== mailbox


def test_mailbox_send_appends_a_record_and_messages_come_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "out" / "mail.jsonl"
    path.parent.mkdir()
    sink = MailboxSink(path)
    assert sink.messages() == []
    assert sink.send("Alice@Example.com", "hi", "body 1", key="m1", meta={"tx": 1}) is True
    before = path.read_bytes()
    assert sink.send("bob@example.com", "re", "body 2") is True
    after = path.read_bytes()
    assert after.startswith(before)  # append-only: earlier bytes untouched
    lines = after.decode().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == {
        "seq": 1,
        "to": "alice@example.com",
        "subject": "hi",
        "body": "body 1",
        "key": "m1",
        "meta": {"tx": 1},
    }
    # A record that reached the file some other way is visible: messages() reads the file.
    with open(path, "a") as fh:
        fh.write(json.dumps({"seq": 3, "to": "c@x", "subject": "", "body": "", "key": None}) + "\n")
    assert [m["to"] for m in sink.messages()] == ["alice@example.com", "bob@example.com", "c@x"]


def test_mailbox_dedup_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "mail.jsonl"
    assert MailboxSink(path).send("a@x", "s", "b", key="k1") is True
    reopened = MailboxSink(path)
    assert reopened.send("a@x", "s", "b", key="k1") is False
    assert reopened.send("a@x", "s", "b") is True  # key None always sends
    assert reopened.send("a@x", "s", "b") is True
    msgs = reopened.messages()
    assert [m["seq"] for m in msgs] == [1, 2, 3]
    assert [m["key"] for m in msgs] == ["k1", None, None]


def test_mailbox_oplog_and_scope(tmp_path: Path) -> None:
    log = OpLog()
    sink = MailboxSink(tmp_path / "mail.jsonl", oplog=log)
    assert sink.scope(" Alice@Example.COM ") == "mail:alice@example.com"
    sink.send("Alice@Example.COM", "s", "b", key="k", meta={"tx": 1})
    sink.send("alice@example.com", "s", "b", key="k", meta={"tx": 2})
    assert [(o.substrate, o.scope, o.kind, o.key, o.meta) for o in log.ops()] == [
        ("mail", "mail:alice@example.com", "append", "k", {"tx": 1}),
        ("mail", "mail:alice@example.com", "dedup", "k", {"tx": 2}),
    ]
    with pytest.raises(ValueError):
        sink.send("", "s", "b")
    with pytest.raises(ValueError):
        sink.send("a:b@x", "s", "b")
    assert len(sink.messages()) == 1


def test_mailbox_torn_tail_is_cut_and_api_cannot_remove(tmp_path: Path) -> None:
    path = tmp_path / "mail.jsonl"
    MailboxSink(path).send("a@x", "s", "b", key="k1")
    with open(path, "a") as fh:
        fh.write('{"seq": 2, "to": "b@x", "key": "k2"')  # a crash mid-append
    sink = MailboxSink(path)
    assert [m["key"] for m in sink.messages()] == ["k1"]
    assert sink.send("b@x", "s", "b", key="k2") is True
    assert [m["key"] for m in sink.messages()] == ["k1", "k2"]
    public = {n for n in dir(sink) if not n.startswith("_")}
    assert public == {"path", "scope", "send", "messages", "applied_keys"}
    with pytest.raises(AttributeError):
        sink.path = tmp_path / "other.jsonl"  # type: ignore[misc]


def test_mailbox_unserialisable_meta_appends_nothing(tmp_path: Path) -> None:
    path = tmp_path / "mail.jsonl"
    sink = MailboxSink(path)
    with pytest.raises(TypeError):
        sink.send("a@x", "s", "b", key="k", meta={"obj": object()})
    assert not path.exists() or path.read_bytes() == b""
    assert sink.send("a@x", "s", "b", key="k") is True
    assert os.path.getsize(path) > 0

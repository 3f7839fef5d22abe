"""What a real agent needs to trust the runtime, through the public API only: keys unique
across processes, calls from worker threads, loud failures, nested transactions as
savepoints. Each test failed on an earlier runtime that lacked the behaviour it checks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from atomix import (
    AtomixError,
    Call,
    CommitIncomplete,
    OutsideTransaction,
    Runtime,
    Savepoint,
    TransactionAborted,
)
from atomix.adapters import FileStore, MailboxSink
from atomix.adapters.tools import file_tools, mail_tools


def _outbox(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------ keys across processes

_PROGRAM = textwrap.dedent(
    """
    import sys
    from atomix import Runtime
    from atomix.adapters import FileStore, MailboxSink
    from atomix.adapters.tools import file_tools, mail_tools

    root, outbox = sys.argv[1], sys.argv[2]
    rt = Runtime()
    fs = file_tools(rt, FileStore(root))
    mail = mail_tools(rt, MailboxSink(outbox))
    with rt.transaction():
        fs.write_text("f.txt", "v1")
        mail.send("ann@example.org", "reminder", "pay the invoice")
    print(open(root + "/f.txt").read())
    with rt.transaction():
        fs.write_text("f.txt", "v2")
    print(open(root + "/f.txt").read())
    """
)


def test_a_new_process_is_never_taken_for_a_duplicate_of_an_old_one(tmp_path: Path) -> None:
    """The stores keep applied keys on disk; transaction numbers restart in every process.
    Run the same program twice: the second run's commits must land like the first's."""
    script = tmp_path / "program.py"
    script.write_text(_PROGRAM)
    root, outbox = tmp_path / "files", tmp_path / "outbox.jsonl"
    seen = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script), str(root), str(outbox)],
            capture_output=True,
            text=True,
            check=True,
        )
        seen.append(done.stdout.split())
    assert seen == [["v1", "v2"], ["v1", "v2"]]  # run 2 wrote v1 again, then v2
    mails = _outbox(outbox)
    assert len(mails) == 2 and len({m["key"] for m in mails}) == 2  # one reminder per run


def test_keys_of_two_runtimes_differ_and_an_explicit_key_keeps_its_part() -> None:
    keys = []
    for _ in range(2):
        rt = Runtime()

        @rt.tool(effect="irreversible", writes="mail:{to}", key="{to}")
        def send(to: str) -> None:
            pass

        with rt.transaction():
            keys.append(send("a@x.org").key)
    assert keys[0] != keys[1]
    assert all(k.endswith(":send:a@x.org") for k in keys)


# ------------------------------------------------------------------------ worker threads


class _World:
    def __init__(self, tmp_path: Path, **options: Any) -> None:
        self.rt = Runtime(timeout=2.0, **options)
        self.outbox = tmp_path / "outbox.jsonl"
        self.fs = file_tools(self.rt, FileStore(tmp_path / "files"))
        self.mail = mail_tools(self.rt, MailboxSink(self.outbox))
        self.root = tmp_path / "files"

    def sent(self) -> list[str]:
        return [m["body"] for m in _outbox(self.outbox)]


def test_a_plain_worker_thread_cannot_escape_the_transaction(tmp_path: Path) -> None:
    """A call from a ThreadPoolExecutor worker used to run as its own auto-committed
    transaction: the mail went out although the enclosing transaction aborted. Now the call
    cannot be attributed, so it raises, and nothing is sent."""
    w = _World(tmp_path)
    with pytest.raises(RuntimeError), w.rt.transaction(), ThreadPoolExecutor(2) as pool:
        future = pool.submit(w.mail.send, "ann@example.org", "s", "from a worker")
        with pytest.raises(OutsideTransaction, match="run_in_executor"):
            future.result()
        raise RuntimeError("the agent gives up")
    assert w.sent() == []


@pytest.mark.parametrize("how", ["run_in_executor", "executor"])
def test_worker_calls_submitted_through_the_runtime_join_the_transaction(
    tmp_path: Path, how: str
) -> None:
    w = _World(tmp_path)

    def submit(fn: Any, *args: Any) -> Any:
        if how == "run_in_executor":
            return w.rt.run_in_executor(fn, *args)
        with w.rt.executor(2) as pool:
            return pool.submit(fn, *args)

    with pytest.raises(RuntimeError), w.rt.transaction() as aborted:
        submit(w.mail.send, "ann@example.org", "s", "never").result()
        raise RuntimeError("abort")
    assert w.sent() == [] and aborted.settlement is not None
    assert len(aborted.settlement.dropped) == 1  # the worker's send was the transaction's

    with w.rt.transaction() as tx:
        futures = [submit(w.mail.send, "ann@example.org", "s", f"m{i}") for i in range(4)]
        futures.append(submit(w.fs.write_text, "a.txt", "from a worker"))
        for f in futures:
            f.result()
        assert w.sent() == []  # gated until commit
    assert sorted(w.sent()) == ["m0", "m1", "m2", "m3"]
    assert (w.root / "a.txt").read_text() == "from a worker"
    assert tx.settlement is not None and len(tx.settlement.released) == 4


def test_tasks_started_inside_an_async_transaction_join_it() -> None:
    rt = Runtime(timeout=2.0)
    sent: list[str] = []

    @rt.tool(effect="irreversible", writes="mail:{to}")
    async def send(to: str) -> None:
        sent.append(to)

    async def main() -> Any:
        with pytest.raises(RuntimeError):
            async with rt.atransaction():
                await asyncio.gather(*(asyncio.create_task(send(f"u{i}@x.org")) for i in range(3)))
                raise RuntimeError("abort")
        assert sent == []
        async with rt.atransaction() as tx:
            await asyncio.gather(*(asyncio.create_task(send(f"u{i}@x.org")) for i in range(3)))
        return tx.settlement

    settlement = asyncio.run(main())
    assert sorted(sent) == ["u0@x.org", "u1@x.org", "u2@x.org"]
    assert settlement is not None and len(settlement.released) == 3


def test_strict_runtime_forbids_auto_commit(tmp_path: Path) -> None:
    w = _World(tmp_path, strict=True)
    with pytest.raises(OutsideTransaction, match="strict"):
        w.mail.send("ann@example.org", "s", "alone")
    with pytest.raises(OutsideTransaction, match="strict"):
        w.fs.write_text("x.txt", "alone")
    assert w.sent() == [] and not (w.root / "x.txt").exists()
    with w.rt.transaction():
        w.mail.send("ann@example.org", "s", "inside")
    assert w.sent() == ["inside"]


def test_without_any_open_transaction_a_call_still_commits_on_its_own(tmp_path: Path) -> None:
    w = _World(tmp_path)
    w.mail.send("ann@example.org", "s", "alone")
    done = threading.Thread(target=w.fs.write_text, args=("t.txt", "from a thread"))
    done.start()
    done.join()
    assert w.sent() == ["alone"] and (w.root / "t.txt").read_text() == "from a thread"


# ------------------------------------------------------------------------- loud failures


def test_an_effect_that_cannot_be_delivered_raises_commit_incomplete() -> None:
    rt = Runtime(apply_attempts=3)
    store: dict[str, str] = {}
    attempts: list[str] = []

    @rt.tool(effect="bufferable", writes="kv:{k}")
    def put(k: str, v: str) -> None:
        store[k] = v

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def send(to: str) -> None:
        attempts.append(to)
        raise ConnectionError("smtp down")

    with pytest.raises(CommitIncomplete, match="smtp down") as raised, rt.transaction() as tx:
        put("x", "1")
        queued = send("a@x.org")
    s = raised.value.settlement
    assert s is tx.settlement and s.committed and not s.clean
    assert s.failed_applies == (queued.key,) and store == {"x": "1"}
    assert isinstance(s.errors[queued.key], ConnectionError) and len(attempts) == 3


def test_a_reversible_tool_that_acts_then_raises_is_compensated() -> None:
    rt = Runtime()
    seats: set[int] = set()
    seen: list[Call] = []

    def cancel(call: Call) -> None:
        seen.append(call)
        seats.discard(call.args["seat"])

    @rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
    def book(seat: int) -> str:
        seats.add(seat)  # it acted...
        raise TimeoutError("the answer was lost")  # ...and then failed

    with pytest.raises(TimeoutError), rt.transaction() as tx:
        book(7)
    s = tx.settlement
    assert s is not None and not s.committed and s.clean
    assert len(s.compensated) == 1 and seats == set()
    assert isinstance(seen[0].error, TimeoutError) and seen[0].result is None


def test_a_failed_compensation_keeps_its_exception_on_the_settlement() -> None:
    rt = Runtime()

    def cancel(call: Call) -> None:
        raise PermissionError(f"cannot cancel seat {call.args['seat']}")

    @rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
    def book(seat: int) -> str:
        return f"seat {seat}"

    with pytest.raises(KeyError), rt.transaction() as tx:
        book(3)
        raise KeyError("stop")
    s = tx.settlement
    assert s is not None and not s.clean and len(s.residue) == 1
    error = s.errors[s.residue[0]]
    assert isinstance(error, PermissionError) and "seat 3" in str(error)


# ------------------------------------------------------------------ nested transactions


class _Nest:
    def __init__(self) -> None:
        self.rt = Runtime(timeout=0.5)
        self.store: dict[str, str] = {}
        self.sent: list[str] = []
        self.log: list[str] = []

        @self.rt.tool(effect="bufferable", writes="kv:{k}")
        def put(k: str, v: str) -> None:
            self.store[k] = v

        @self.rt.tool(effect="irreversible", writes="mail:{to}")
        def send(to: str) -> None:
            self.sent.append(to)

        def cancel(call: Call) -> None:
            self.log.append(f"cancel {call.args['seat']}")

        @self.rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
        def book(seat: int) -> None:
            self.log.append(f"book {seat}")

        self.put, self.send, self.book = put, send, book


def test_an_inner_write_to_the_outer_scope_does_not_wait_and_settles_with_the_outer() -> None:
    n = _Nest()
    with n.rt.transaction() as outer:
        n.put("x", "outer")
        with n.rt.transaction() as inner:
            assert isinstance(inner, Savepoint) and inner.txid == outer.txid
            n.put("x", "inner")  # the outer's scope: used to wait until the time-out
            n.send("a@x.org")
        assert n.store == {} and n.sent == []  # nothing settles when the inner block ends
    assert n.store == {"x": "inner"} and n.sent == ["a@x.org"]
    assert outer.settlement is not None and outer.settlement.committed
    assert len(outer.settlement.applied) == 2 and len(outer.settlement.released) == 1


def test_an_inner_send_never_leaves_when_the_outer_block_aborts() -> None:
    n = _Nest()
    with pytest.raises(RuntimeError), n.rt.transaction() as outer:
        with n.rt.transaction():
            n.send("a@x.org")
            n.book(1)
        raise RuntimeError("outer fails")
    assert n.sent == [] and n.log == ["book 1", "cancel 1"]
    assert outer.settlement is not None and not outer.settlement.committed


def test_an_inner_abort_undoes_only_the_inner_block() -> None:
    n = _Nest()
    with n.rt.transaction() as outer:
        n.put("a", "kept")
        n.book(1)
        with pytest.raises(ValueError), n.rt.transaction():
            n.put("b", "undone")
            n.send("undone@x.org")
            n.book(2)
            n.book(3)
            raise ValueError("inner fails")
        assert n.log == ["book 1", "book 2", "book 3", "cancel 3", "cancel 2"]
        with n.rt.transaction():  # a second savepoint after the first rolled back
            n.send("kept@x.org")
    assert n.store == {"a": "kept"} and n.sent == ["kept@x.org"]
    s = outer.settlement
    assert s is not None and s.committed and s.clean
    assert len(s.accepted) == 1 and len(s.compensated) == 2 and len(s.dropped) == 2
    assert n.log[-1] == "cancel 2"  # book 1 was never compensated


def test_explicit_rollback_and_nested_savepoints() -> None:
    n = _Nest()
    with n.rt.transaction():
        n.put("a", "1")
        with n.rt.transaction() as sp:
            n.put("b", "2")
            with pytest.raises(LookupError), n.rt.transaction():
                n.put("c", "3")
                raise LookupError("innermost")
            sp.rollback()  # undoes b (c is gone already)
            n.put("d", "4")  # still inside sp, kept when the block ends cleanly
    assert n.store == {"a": "1", "d": "4"}


def test_nested_blocks_that_cannot_be_savepoints_say_so() -> None:
    n = _Nest()
    with n.rt.transaction() as outer:
        with pytest.raises(AtomixError, match="savepoint"):
            n.rt.transaction(timeout=1.0)
        with pytest.raises(AtomixError, match="speculative branches"):
            n.rt.branch("g", 0)
        with pytest.raises(AtomixError, match="savepoint"), n.rt.transaction() as sp:
            sp.commit()
        n.put("x", "1")
    assert outer.settlement is not None and outer.settlement.committed


def test_run_inside_a_transaction_is_a_savepoint() -> None:
    n = _Nest()
    with n.rt.transaction() as outer:
        n.put("x", "outer")
        n.rt.run(lambda tx: n.put("x", "1"))  # the outer's scope: an independent one waits
        with pytest.raises(ZeroDivisionError):
            n.rt.run(lambda tx: (n.put("y", "2"), 1 / 0))
    assert n.store == {"x": "1"}
    assert outer.settlement is not None and outer.settlement.committed


def test_async_nested_transaction_is_a_savepoint() -> None:
    rt = Runtime(timeout=0.5)
    store: dict[str, str] = {}

    @rt.tool(effect="bufferable", writes="kv:{k}")
    async def put(k: str, v: str) -> None:
        store[k] = v

    async def main() -> None:
        async with rt.atransaction():
            await put("x", "outer")
            async with rt.atransaction():
                await put("x", "inner")
            try:
                async with rt.atransaction():
                    await put("y", "undone")
                    raise ValueError("inner")
            except ValueError:
                pass

    asyncio.run(main())
    assert store == {"x": "inner"}


def test_a_nested_failure_after_the_outer_aborted_does_not_roll_back_twice() -> None:
    n = _Nest()
    with pytest.raises(TransactionAborted), n.rt.transaction() as outer:
        n.book(1)
        with n.rt.transaction():
            outer.abort(detail="veto")  # the outer settles from inside the nested block
            n.put("x", "1")  # raises TransactionAborted
    assert n.log == ["book 1", "cancel 1"] and n.store == {}


def test_stores_opened_with_relative_paths_work_and_recover_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's scope names its database file absolutely; a store opened with a relative path
    used to fail at the first put, and a log recording it could not be recovered elsewhere."""
    from atomix.adapters import SQLiteStore
    from atomix.adapters.tools import sqlite_tools

    monkeypatch.chdir(tmp_path)
    rt = Runtime()
    db = sqlite_tools(rt, SQLiteStore("shop.db"))
    mail = mail_tools(rt, MailboxSink("outbox.jsonl"))
    with rt.transaction():
        db.put("orders", 1, "paid")
        mail.send("ann@example.org", "s", "paid")
    assert db.get("orders", 1) == "paid"
    monkeypatch.chdir("/")
    assert SQLiteStore(tmp_path / "shop.db").get("orders", 1) == "paid"
    assert len(_outbox(tmp_path / "outbox.jsonl")) == 1

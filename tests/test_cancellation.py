"""Cancellation, deadlines, and sync tools in async transactions, through the public API.
Each test failed on an earlier runtime that lacked the behaviour it checks: an interrupted
commit wait left its transaction waiting and its scopes wedged, a closed event loop made
another thread's commit raise, an abandoned waiter made every later transaction on its
scopes time out, and sync tools (all the adapters) raised inside `rt.atransaction()`."""

from __future__ import annotations

import asyncio
import inspect
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import await_until, wait_until

from atomix import AtomixError, Call, Runtime, TransactionAborted
from atomix.adapters import FileStore, MailboxSink, SQLiteStore
from atomix.adapters.tools import file_tools, mail_tools, sqlite_tools
from atomix.handles import current_transaction
from atomix.transaction import TxState

TIMEOUT = 0.3  # seconds: the commit-wait timeout of these runtimes; every wait is bounded by it
JOIN = 10.0  # seconds: generous, only a hung test ever waits this long


def _acquire_lines() -> set[int]:
    """The lines of threading.Condition.wait (what Event.wait blocks in) where it blocks:
    the lock acquires inside its try block, whose finally clears up after whatever is raised
    there (a KeyboardInterrupt raised a line earlier would leave the condition's lock
    released and the next line fails on it)."""
    lines, first = inspect.getsourcelines(threading.Condition.wait)
    found, in_try = set(), False
    for i, line in enumerate(lines):
        if line.strip().startswith("try:"):
            in_try = True
        elif line.strip().startswith("finally:"):
            break
        elif in_try and "waiter.acquire(" in line:
            found.add(first + i)
    assert found, "threading.Condition.wait has changed: update _acquire_lines"
    return found


def _blocked_in_a_wait(thread: threading.Thread) -> bool:
    """Whether `thread` is blocked in a threading wait (Event.wait, Condition.wait) now."""
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    return (
        frame is not None
        and frame.f_code is threading.Condition.wait.__code__
        and frame.f_lineno in _acquire_lines()
    )


class World:
    """One tool of each class over in-memory state, sync and async."""

    def __init__(self, timeout: float = TIMEOUT) -> None:
        self.rt = rt = Runtime(timeout=timeout)
        self.store: dict[str, Any] = {}
        self.outbox: list[str] = []
        self.seats: set[int] = set()
        self.threads: list[str] = []

        @rt.tool(effect="bufferable", writes="mem:{k}")
        def put(k: str, v: Any) -> None:
            self.store[k] = v

        @rt.tool(effect="irreversible", writes="mail:{to}")
        def send(to: str) -> None:
            self.outbox.append(to)

        def unbook(call: Call) -> None:
            self.seats.discard(call.args["n"])

        @rt.tool(effect="reversible", writes="seat:{n}", compensate=unbook)
        def book(n: int) -> int:
            self.threads.append(threading.current_thread().name)
            self.seats.add(n)
            return n

        async def aunbook(call: Call) -> None:
            self.seats.discard(call.args["n"])

        @rt.tool(effect="reversible", writes="seat:{n}", compensate=aunbook)
        async def abook(n: int) -> int:
            self.seats.add(n)
            return n

        @rt.tool(reads="mem:{k}")
        def get(k: str) -> Any:
            return self.store.get(k)

        # Async twins: the cancellation tests use them, so that they exercise only part 3.
        @rt.tool(effect="bufferable", writes="mem:{k}")
        async def aput(k: str, v: Any) -> None:
            self.store[k] = v

        @rt.tool(effect="irreversible", writes="mail:{to}")
        async def asend(to: str) -> None:
            self.outbox.append(to)

        self.put, self.send, self.book, self.abook, self.get = put, send, book, abook, get
        self.aput, self.asend = aput, asend


@pytest.fixture()
def w() -> World:
    return World()


def _hold(w: World, scope_key: str, started: threading.Event, release: threading.Event) -> threading.Thread:
    """A thread whose transaction writes `scope_key` and commits only once `release` is set."""

    def body() -> None:
        with w.rt.transaction(timeout=JOIN):
            w.put(scope_key, "holder")
            started.set()
            release.wait(JOIN)

    thread = threading.Thread(target=body, name="holder")
    thread.start()
    assert started.wait(JOIN)
    return thread


# ============================================================================ cancellation
def test_cancelled_async_commit_waiter_aborts_as_cancelled_and_frees_its_scope(w: World) -> None:
    async def main() -> None:
        holding, release = asyncio.Event(), asyncio.Event()
        box: dict[str, Any] = {}

        async def holder() -> None:
            async with w.rt.atransaction(timeout=JOIN):
                await w.aput("s", "holder")
                holding.set()
                await release.wait()

        async def waiter() -> None:
            async with w.rt.atransaction() as tx:
                box["tx"] = tx
                await w.abook(7)  # reversible: runs now, compensated at abort
                await w.aput("s", "waiter")
                await w.asend("ann@example.org")  # gated: must never leave
            raise AssertionError("the commit wait was cancelled")

        h = asyncio.create_task(holder())
        await asyncio.wait_for(holding.wait(), JOIN)
        task = asyncio.create_task(waiter())
        await await_until(lambda: "tx" in box and box["tx"].state is TxState.WAITING, "it waits")
        assert w.seats == {7}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()  # the cancellation propagated unchanged
        s = box["tx"].settlement
        assert s is not None and s.outcome == "aborted" and s.abort_source == "cancelled"
        assert len(s.compensated) == 1 and len(s.dropped) == 2 and s.clean
        assert w.seats == set() and w.outbox == []

        release.set()
        await h
        # The cancelled waiter is gone from the core: the next writer of "s" commits at once.
        async with w.rt.atransaction() as later:
            await w.aput("s", "later")
        assert later.settlement is not None and later.settlement.committed

    asyncio.run(main())
    assert w.store == {"s": "later"}


def test_ctrl_c_while_a_sync_commit_waits_aborts_it_as_cancelled(w: World) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a real SIGINT is delivered to the main thread")
    started, release = threading.Event(), threading.Event()
    holder = _hold(w, "s", started, release)
    box: dict[str, Any] = {}

    def interrupt() -> None:
        # A real Ctrl-C: SIGINT to the main thread while its commit blocks, in the wait
        # itself (not just before it).
        main = threading.main_thread()
        wait_until(lambda: "tx" in box and box["tx"].state is TxState.WAITING, "it waits")
        wait_until(lambda: _blocked_in_a_wait(main), "the main thread blocks in the wait")
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    killer = threading.Thread(target=interrupt)
    try:
        killer.start()
        with pytest.raises(KeyboardInterrupt), w.rt.transaction(timeout=JOIN) as tx:
            box["tx"] = tx
            w.book(3)
            w.put("s", "waiter")
            w.send("bob@example.org")
    finally:
        killer.join(JOIN)
        signal.signal(signal.SIGINT, previous)
    s = tx.settlement
    assert s is not None and s.abort_source == "cancelled"
    assert len(s.compensated) == 1 and len(s.dropped) == 2
    assert w.seats == set() and w.outbox == []

    release.set()
    holder.join(JOIN)
    with w.rt.transaction() as later:  # not behind the interrupted one: commits at once
        w.put("s", "later")
    assert later.settlement is not None and later.settlement.committed
    assert w.store == {"s": "later"}


def test_cancelled_read_wait_aborts_as_cancelled(w: World) -> None:
    """A read that waits (behind an earlier unsettled reversible effect) is a wait too."""
    started, release = threading.Event(), threading.Event()

    def body() -> None:
        with w.rt.transaction(timeout=JOIN):
            w.book(5)
            started.set()
            release.wait(JOIN)

    holder = threading.Thread(target=body)
    holder.start()
    assert started.wait(JOIN)
    read_seat = w.rt.tool(lambda n: n in w.seats, reads="seat:{n}", name="has_seat")

    async def main() -> Any:
        box: dict[str, Any] = {}

        async def reader() -> None:
            async with w.rt.atransaction() as tx:
                box["tx"] = tx
                await w.aput("r", 1)
                await tx.call(read_seat.spec, 5)  # waits for the holder's booking to settle

        task = asyncio.create_task(reader())
        await await_until(
            lambda: "tx" in box and box["tx"].txid in w.rt.coordinator._wakers, "the read waits"
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return box["tx"].settlement

    try:
        s = asyncio.run(main())
    finally:
        release.set()
        holder.join(JOIN)
    assert s is not None and s.abort_source == "cancelled" and len(s.dropped) == 1
    assert w.store == {}


# =============================================================================== deadlines
def test_a_closed_loop_waiter_neither_breaks_other_commits_nor_wedges_its_scopes(w: World) -> None:
    """A waits at commit in an event loop (in another thread) that is stopped and closed
    without cancelling it. Z's commit must not touch that loop, and B, behind A, proceeds
    once A's deadline passes (B's own deadline is later: it must not time out because of A)."""
    z = w.rt.transaction(timeout=JOIN)
    z.call(w.put.spec, "x", "z")  # Z holds x, open
    box: dict[str, Any] = {}

    def loop_thread() -> None:
        loop = asyncio.new_event_loop()

        async def a() -> None:
            async with w.rt.atransaction() as tx:
                box["a"] = tx
                await w.aput("x", "a")
                await w.aput("y", "a")  # commit waits on Z (x)

        box["task"] = loop.create_task(a())  # kept: never garbage-collected during the test
        loop.run_until_complete(
            await_until(lambda: "a" in box and box["a"].state is TxState.WAITING, "A waits")
        )
        loop.close()  # stopped with A still waiting, and closed: A's driver is gone

    t = threading.Thread(target=loop_thread)
    t.start()
    t.join(JOIN)
    assert box["a"].state is TxState.WAITING

    settlement = z.commit()  # wakes A's signal, whose loop is closed: must not raise
    assert settlement.committed

    with w.rt.transaction() as b:  # behind A on y; A's deadline passes first
        w.put("y", "b")
    assert b.settlement is not None and b.settlement.committed
    a = box["a"].settlement
    assert a is not None and a.outcome == "aborted" and a.abort_source == "timeout"
    assert len(a.dropped) == 2
    assert w.store == {"x": "z", "y": "b"}
    box["task"].get_coro().close()  # (the abandoned coroutine: nothing left to settle)


class _VanishingDriver:
    """A driver that blocks its waiter once and is never heard of again (a killed thread)."""

    timeout = TIMEOUT

    def new_signal(self) -> threading.Event:
        return threading.Event()

    def now(self) -> float:
        return time.monotonic()  # the runtime's clock


@pytest.fixture()
def abandoned(w: World) -> Iterator[tuple[Any, Any, Any]]:
    """Z holds x open; A (x, y, and a reversible booking) waits at commit behind Z, and its
    driver vanishes there. Yields (z, a, a's suspended steps)."""
    z = w.rt.transaction(timeout=JOIN)
    z.call(w.put.spec, "x", "z")
    a = w.rt.transaction()
    a.call(w.book.spec, 9)
    a.call(w.put.spec, "x", "a")
    a.call(w.put.spec, "y", "a")
    a.call(w.send.spec, "carol@example.org")
    steps = a.commit_steps(_VanishingDriver())
    assert type(next(steps)).__name__ == "Block" and a.state is TxState.WAITING
    yield z, a, steps
    steps.close()


def test_an_abandoned_waiter_is_expired_by_the_waiter_behind_it(
    w: World, abandoned: tuple[Any, Any, Any]
) -> None:
    z, a, steps = abandoned
    assert w.seats == {9}
    with w.rt.transaction() as b:  # waits on A, wakes at A's deadline, aborts A, commits
        w.put("y", "b")
    assert b.settlement is not None and b.settlement.committed and w.store == {"y": "b"}
    s = a.settlement  # A's handle sees its settlement
    assert s is not None and s.abort_source == "timeout" and "deadline" in s.detail
    assert len(s.compensated) == 1 and len(s.dropped) == 3
    assert w.seats == set() and w.outbox == []  # B carried out A's abort plan
    with pytest.raises(TransactionAborted) as exc:  # and anyone touching A's steps learns it
        steps.send(False)
    assert exc.value.settlement is s
    assert z.commit().committed and w.store == {"x": "z", "y": "b"}


def test_several_waiters_behind_an_abandoned_one_all_proceed(
    w: World, abandoned: tuple[Any, Any, Any]
) -> None:
    z, a, _ = abandoned
    errors: list[BaseException] = []

    def writer(v: str) -> None:
        try:
            with w.rt.transaction(timeout=JOIN):
                w.put("y", v)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN)
    assert errors == [] and w.store["y"] in {"w0", "w1", "w2"}
    assert a.settlement is not None and a.settlement.abort_source == "timeout"
    assert len(a.settlement.compensated) == 1 and w.seats == set()  # compensated once
    z.commit()


def test_a_live_waiter_still_times_out_itself(w: World) -> None:
    """The deadline moved into the core; the meaning of `timeout` did not."""
    started, release = threading.Event(), threading.Event()
    holder = _hold(w, "s", started, release)
    try:
        with pytest.raises(TransactionAborted) as exc, w.rt.transaction(timeout=0.05):
            w.put("s", "late")
    finally:
        release.set()
        holder.join(JOIN)
    assert exc.value.source == "timeout" and "still waiting on" in exc.value.detail
    assert exc.value.settlement is not None and exc.value.settlement.waited >= 0.05


# ================================================================ sync tools in async code
def test_every_adapter_works_in_an_async_transaction(tmp_path: Path) -> None:
    rt = Runtime(timeout=TIMEOUT)
    files, outbox = FileStore(tmp_path / "files"), MailboxSink(tmp_path / "outbox.jsonl")
    rows = SQLiteStore(tmp_path / "d.db")
    fs, db, mail = file_tools(rt, files), sqlite_tools(rt, rows), mail_tools(rt, outbox)

    async def main() -> Any:
        async with rt.atransaction() as tx:
            fs.write_text("a.txt", "hello")
            db.put("orders", 1, {"total": 3})
            mail.send("ann@example.org", "shipped", "order 1")
            assert fs.read_text("a.txt") == "hello"  # direct: nothing to wait for
            assert await tx.call(fs.read_text, "a.txt") == "hello"  # in a worker thread
            assert db.get("orders", 1) == {"total": 3}
            assert await tx.call(db.get, "orders", 1) == {"total": 3}
            assert not (tmp_path / "files" / "a.txt").exists() and outbox.messages() == []
        with pytest.raises(RuntimeError):
            async with rt.atransaction():
                fs.write_text("b.txt", "never")
                db.put("orders", 2, {"total": 4})
                db.delete("orders", 1)
                mail.send("bob@example.org", "never", "sent")
                raise RuntimeError("abort")
        return tx.settlement

    s = asyncio.run(main())
    assert s is not None and s.committed and len(s.applied) == 2 and len(s.released) == 1
    assert (tmp_path / "files" / "a.txt").read_text() == "hello"
    assert not (tmp_path / "files" / "b.txt").exists()
    assert rows.get("orders", 1) == {"total": 3} and rows.get("orders", 2) is None
    assert [m["to"] for m in outbox.messages()] == ["ann@example.org"]


def test_sync_reversible_tool_joins_an_async_transaction(w: World) -> None:
    loop_thread: list[str] = []

    async def main() -> None:
        loop_thread.append(threading.current_thread().name)
        with pytest.raises(RuntimeError):
            async with w.rt.atransaction():
                assert w.book(1) == 1  # direct: runs now, on the loop's thread
                w.put("k", "v")
                raise RuntimeError("abort")
        assert w.seats == set()  # compensated at the abort
        async with w.rt.atransaction() as tx:
            assert await tx.call(w.book, 2) == 2  # a shim: runs in a worker thread
            assert await tx.call(w.book.spec, 3) == 3  # a ToolSpec, as before
            seen = await tx.call(w.rt.tool(lambda: current_transaction(), name="whoami"))
            assert seen is tx  # the worker thread runs in this transaction's context
        with pytest.raises(TypeError, match="not a tool"):
            async with w.rt.atransaction() as tx:
                await tx.call(print, "x")

    asyncio.run(main())
    assert w.seats == {2, 3}
    assert w.threads[0] == loop_thread[0]
    assert loop_thread[0] not in w.threads[1:]


def test_sync_tool_that_must_wait_names_await_tx_call_and_that_waits(w: World) -> None:
    started, release = threading.Event(), threading.Event()

    def body() -> None:
        with w.rt.transaction(timeout=JOIN):
            w.book(4)  # externalised: a later booking of seat 4 must wait for its settlement
            started.set()
            release.wait(JOIN)

    holder = threading.Thread(target=body)
    holder.start()
    assert started.wait(JOIN)

    async def main() -> Any:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        beat = asyncio.create_task(heartbeat())
        async with w.rt.atransaction(timeout=JOIN) as tx:
            with pytest.raises(AtomixError, match=r"await tx\.call"):
                w.book(4)  # would have to wait: refuses rather than block the loop
            asyncio.get_running_loop().call_later(0.05, release.set)
            before = ticks
            assert await tx.call(w.book, 4) == 4  # waits without blocking the loop
            assert ticks > before
        beat.cancel()
        return tx.settlement

    try:
        s = asyncio.run(main())
    finally:
        release.set()
        holder.join(JOIN)
    assert s is not None and s.committed and len(s.accepted) == 1 and w.seats == {4}

"""The public runtime's waits: an overlapping later transaction waits for the earlier one to
settle (or times out), a disjoint one never waits, in threads and under asyncio, where a wait
does not block the event loop and a thread's commit wakes a task."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from runtime_world import JOIN, AsyncWorld, World
from support import await_until, wait_until

from atomix import AbortSource, Runtime, Settlement, TransactionAborted
from atomix.transaction import TxState


# ===================================================================================== threads
def test_overlapping_later_epoch_waits_for_the_earlier_to_settle(w: World) -> None:
    began, release = threading.Event(), threading.Event()
    handles: dict[str, Any] = {}
    errors: list[BaseException] = []

    def early() -> None:
        try:
            with w.rt.transaction() as tx:
                handles["early"] = tx
                w.put("s", "early")
                began.set()
                assert release.wait(JOIN)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def late() -> None:
        try:
            with w.rt.transaction() as tx:
                handles["late"] = tx
                w.put("s", "late")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    a = threading.Thread(target=early)
    a.start()
    assert began.wait(JOIN)
    b = threading.Thread(target=late)
    b.start()
    wait_until(lambda: "late" in handles, "the late transaction began")
    late_tx, early_tx = handles["late"], handles["early"]
    assert late_tx.epoch > early_tx.epoch
    wait_until(lambda: w.rt.core.get(late_tx.txid).state is TxState.WAITING, "late waits")
    time.sleep(0.02)  # it stays blocked: nothing applied while the earlier one is open
    assert w.store == {} and b.is_alive()
    release.set()
    a.join(JOIN)
    b.join(JOIN)
    assert not errors and not a.is_alive() and not b.is_alive()
    assert w.log == ["put s=early", "put s=late"]  # per-resource commit order = epoch order
    assert w.store == {"s": "late"}
    assert early_tx.settlement.waited == 0.0
    assert late_tx.settlement.committed and late_tx.settlement.waited >= 0.02


def test_overlapping_commit_times_out_with_source_timeout(w: World) -> None:
    early = w.rt.transaction()
    with early:
        w.put("s", "early")
        result: dict[str, Any] = {}

        def late() -> None:
            try:
                with w.rt.transaction(timeout=0.05) as tx:
                    result["tx"] = tx
                    w.put("s", "late")
            except TransactionAborted as exc:
                result["exc"] = exc

        t = threading.Thread(target=late)
        t.start()
        t.join(JOIN)
        assert not t.is_alive()
    exc = result["exc"]
    assert exc.source == AbortSource.TIMEOUT.value and "still waiting on" in exc.detail
    s: Settlement = exc.settlement
    assert s is result["tx"].settlement and s.abort_source == "timeout"
    assert s.waited >= 0.05 and len(s.dropped) == 1
    assert early.settlement.committed and w.store == {"s": "early"}


def test_disjoint_transactions_in_two_threads_never_wait(w: World) -> None:
    release = threading.Event()
    handles: dict[str, Any] = {}

    def first() -> None:
        with w.rt.transaction() as tx:
            handles["first"] = tx
            w.put("a", 1)
            w.book(1)
            assert release.wait(JOIN)

    def second() -> None:
        with w.rt.transaction() as tx:
            handles["second"] = tx
            w.put("b", 2)
            w.send("bob", "x")

    a = threading.Thread(target=first)
    a.start()
    wait_until(lambda: "first" in handles and w.seats == {1}, "first is open")
    b = threading.Thread(target=second)
    b.start()
    b.join(JOIN)
    assert not b.is_alive(), "a disjoint transaction waited for an open one"
    assert handles["second"].epoch > handles["first"].epoch
    assert handles["second"].settlement.waited == 0.0 and w.store == {"b": 2}
    release.set()
    a.join(JOIN)
    assert handles["first"].settlement.committed and w.store == {"a": 1, "b": 2}


# ==================================================================================== asyncio
def test_async_transaction_commits_with_async_tools() -> None:
    aw = AsyncWorld()

    async def main() -> Settlement:
        async with aw.rt.atransaction() as tx:
            ack = await aw.aput("x", 1)
            assert ack.status == "staged" and await aw.aget("x") is None
        assert tx.settlement is not None
        return tx.settlement

    s = asyncio.run(main())
    assert s.committed and aw.store == {"x": 1}


def test_async_abort_awaits_compensations_in_reverse_order() -> None:
    aw = AsyncWorld()

    async def main() -> None:
        async with aw.rt.atransaction():
            await aw.abook(1)
            await aw.abook(2)
            await aw.aput("x", 1)
            raise ValueError("abort")

    with pytest.raises(ValueError):
        asyncio.run(main())
    assert aw.log == ["book 1", "book 2", "cancel 2", "cancel 1"] and aw.store == {}


def test_async_wait_does_not_block_the_event_loop() -> None:
    aw = AsyncWorld()
    ticks: list[int] = []

    async def main() -> tuple[Any, Any, int]:
        release = asyncio.Event()
        began = asyncio.Event()
        handles: dict[str, Any] = {}

        async def early() -> None:
            async with aw.rt.atransaction() as tx:
                handles["early"] = tx
                await aw.aput("s", "early")
                began.set()
                await release.wait()

        async def late() -> None:
            await began.wait()
            async with aw.rt.atransaction() as tx:
                handles["late"] = tx
                await aw.aput("s", "late")

        async def ticker() -> None:
            while not release.is_set():
                ticks.append(1)
                await asyncio.sleep(0.001)

        tasks = [asyncio.create_task(c()) for c in (early, late, ticker)]
        while (
            "late" not in handles
            or aw.rt.core.get(handles["late"].txid).state is not TxState.WAITING
        ):
            await asyncio.sleep(0.001)
        before = len(ticks)
        await asyncio.sleep(0.03)  # late waits at least this long (its `waited` below)
        # Late is waiting; the loop keeps running other tasks meanwhile.
        await await_until(lambda: len(ticks) - before > 3, "the ticker ticked while late waits")
        assert aw.rt.core.get(handles["late"].txid).state is TxState.WAITING
        progressed = len(ticks) - before
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), JOIN)
        return handles["early"], handles["late"], progressed

    early, late, progressed = asyncio.run(main())
    assert progressed > 3
    assert aw.log == ["put s=early", "put s=late"] and aw.store == {"s": "late"}
    assert late.settlement.committed and late.settlement.waited >= 0.03
    assert early.settlement.waited == 0.0


def test_async_wait_times_out() -> None:
    aw = AsyncWorld()

    async def main() -> TransactionAborted:
        release, holding = asyncio.Event(), asyncio.Event()

        async def early() -> None:
            async with aw.rt.atransaction():
                await aw.aput("s", "early")
                holding.set()
                await release.wait()

        task = asyncio.create_task(early())
        await asyncio.wait_for(holding.wait(), JOIN)
        try:
            async with aw.rt.atransaction(timeout=0.03):
                await aw.aput("s", "late")
        except TransactionAborted as exc:
            release.set()
            await task
            return exc
        raise AssertionError("the late transaction should have timed out")

    exc = asyncio.run(main())
    assert exc.source == "timeout" and aw.store == {"s": "early"}


def test_async_waiter_is_woken_by_a_thread_commit() -> None:
    aw = AsyncWorld()
    w = World(aw.rt)  # sync tools on the same runtime
    began, release = threading.Event(), threading.Event()

    def early() -> None:
        with aw.rt.transaction():
            w.put("s", "thread")
            began.set()
            assert release.wait(JOIN)

    thread = threading.Thread(target=early)
    thread.start()
    assert began.wait(JOIN)

    async def main() -> Settlement:
        box: dict[str, Any] = {}

        async def release_once_it_waits() -> None:
            await await_until(
                lambda: "tx" in box and box["tx"].txid in aw.rt.coordinator._wakers,
                "the task's transaction waits for the thread's",
            )
            release.set()

        releaser = asyncio.create_task(release_once_it_waits())
        async with aw.rt.atransaction() as tx:
            box["tx"] = tx
            await aw.aput("s", "task")
        await asyncio.wait_for(releaser, JOIN)
        assert tx.settlement is not None
        return tx.settlement

    s = asyncio.run(main())
    thread.join(JOIN)
    assert s.committed and s.waited > 0 and aw.store == {"s": "task"}
    assert w.store == {"s": "thread"}  # World w wrote to its own dict, first


def test_sync_tool_in_an_async_transaction_of_another_runtime_is_refused(w: World) -> None:
    # (Of its own runtime it joins: tests/test_cancellation.py.)
    other = Runtime(timeout=JOIN)

    async def main() -> None:
        async with other.atransaction():
            w.put("x", 1)

    with pytest.raises(Exception, match="another runtime or driver"):
        asyncio.run(main())
    assert w.store == {}

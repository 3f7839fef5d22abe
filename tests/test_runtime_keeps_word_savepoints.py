"""Savepoints opened at the same time are isolated: a tree of savepoints, each with its own
staged effects. Rolling one back undoes what it (and the blocks nested in it) staged, never a
sibling's effects nor what the enclosing block staged meanwhile. Each test failed on the
runtime whose savepoint was a position in one shared staging order."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from atomix import Call, Runtime
from atomix.handles import Tx


class Agency:
    """Bookings (reversible) and mails (gated) kept in memory, with a barrier that makes
    three workers interleave: every one stages, then the failing one fails."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.seats: set[str] = set()
        self.outbox: list[str] = []
        self.cancelled: list[str] = []

        def cancel(call: Call) -> None:
            self.cancelled.append(call.args["seat"])
            self.seats.discard(call.args["seat"])

        @rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
        def book(seat: str) -> str:
            self.seats.add(seat)
            return seat

        @rt.tool(effect="irreversible", writes="mail:{to}")
        def send(to: str, text: str) -> None:
            self.outbox.append(text)

        @rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
        async def abook(seat: str) -> str:
            self.seats.add(seat)
            return seat

        @rt.tool(effect="irreversible", writes="mail:{to}")
        async def asend(to: str, text: str) -> None:
            self.outbox.append(text)

        self.book, self.send, self.abook, self.asend = book, send, abook, asend


def test_gathered_savepoints_roll_back_alone() -> None:
    rt = Runtime(timeout=10.0)
    a = Agency(rt)

    async def trip(name: str, fail: bool, staged: asyncio.Event, go: asyncio.Event) -> str:
        async with rt.atransaction():
            await a.abook(f"{name}-seat")
            await a.asend(f"{name}@example.org", f"{name} booked")
            staged.set()
            await go.wait()  # every sibling has staged before this one ends
            if fail:
                raise RuntimeError(f"{name} fails")
        return "ok"

    async def main() -> Any:
        async with rt.atransaction() as tx:
            events = [asyncio.Event() for _ in range(3)]
            go = asyncio.Event()
            tasks = [
                asyncio.ensure_future(trip(n, n == "b", e, go))
                for n, e in zip("abc", events, strict=True)
            ]
            for e in events:
                await e.wait()
            await a.asend("parent@example.org", "parent, while they run")
            go.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        return tx, results

    tx, results = asyncio.run(main())
    assert results[0] == "ok" and isinstance(results[1], RuntimeError) and results[2] == "ok"
    assert tx.settlement is not None and tx.settlement.committed
    assert a.seats == {"a-seat", "c-seat"} and a.cancelled == ["b-seat"]
    assert sorted(a.outbox) == ["a booked", "c booked", "parent, while they run"]


def test_executor_workers_savepoints_roll_back_alone() -> None:
    rt = Runtime(timeout=10.0)
    a = Agency(rt)
    staged = threading.Barrier(3, timeout=10.0)

    def trip(name: str) -> str:
        with rt.transaction():
            a.book(f"{name}-seat")
            a.send(f"{name}@example.org", f"{name} booked")
            staged.wait()  # every sibling has staged before any of them ends
            if name == "b":
                raise RuntimeError("b fails")
        return "ok"

    with rt.transaction() as tx, rt.executor(3) as pool:
        futures = [pool.submit(trip, n) for n in "abc"]
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result())
            except RuntimeError as exc:
                outcomes.append(str(exc))
    assert outcomes == ["ok", "b fails", "ok"]
    assert tx.settlement is not None and tx.settlement.committed
    assert a.seats == {"a-seat", "c-seat"} and a.cancelled == ["b-seat"]
    assert sorted(a.outbox) == ["a booked", "c booked"]
    assert len(tx.settlement.compensated) == 1 and len(tx.settlement.dropped) == 1


def test_a_rollback_undoes_its_nested_blocks_and_keeps_the_enclosing_work() -> None:
    rt = Runtime(timeout=10.0)
    a = Agency(rt)
    with rt.transaction() as tx:
        a.book("before")
        with pytest.raises(RuntimeError), rt.transaction():
            a.book("outer")
            with rt.transaction():
                a.book("inner")
                a.send("x@example.org", "inner mail")
            a.send("y@example.org", "outer mail")
            raise RuntimeError("undo the outer block and what it nested")
        a.book("after")
    assert isinstance(tx, Tx) and tx.settlement is not None and tx.settlement.committed
    assert a.seats == {"before", "after"}
    assert sorted(a.cancelled) == ["inner", "outer"] and a.outbox == []


def test_concurrent_savepoints_with_a_durable_log(tmp_path: Path) -> None:
    """The same isolation when each rollback's compensations are marked in the log."""
    rt = Runtime(timeout=10.0, log=tmp_path)
    a = Agency(rt)
    staged = threading.Barrier(3, timeout=10.0)

    def trip(name: str) -> None:
        with rt.transaction():
            a.book(f"{name}-seat")
            staged.wait()
            if name != "a":
                raise RuntimeError(f"{name} fails")

    with rt.transaction(), rt.executor(3) as pool:
        for f in [pool.submit(trip, n) for n in "abc"]:
            try:
                f.result()
            except RuntimeError:
                pass
    rt.close()
    again = Runtime(log=tmp_path)
    Agency(again)
    again.recover()
    again.close()
    assert a.seats == {"a-seat"} and sorted(a.cancelled) == ["b-seat", "c-seat"]

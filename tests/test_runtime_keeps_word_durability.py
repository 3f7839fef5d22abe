"""The runtime keeps its word with a durable log: a commit the application saw is never undone
by the next start's recovery, a result the log cannot describe never loses its compensation,
`close()` never hands a live transaction to another runtime, and asyncio code never waits on
an fsync on its event loop. Each test failed on the runtime before the behaviour it checks."""

from __future__ import annotations

import asyncio
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from atomix import Call, Runtime
from atomix.errors import AtomixError, TransactionAborted
from atomix.log import LogBusy


class Booking:
    """External state that outlives a runtime (as a real booking service does): a second
    runtime on the same log, and its recovery, see what the first one did."""

    def __init__(self) -> None:
        self.seats: dict[int, str] = {}
        self.cancelled: list[int] = []
        self.outbox: list[str] = []

    def tools(self, rt: Runtime, result: Any = None) -> tuple[Any, Any]:
        def cancel(call: Call) -> None:
            self.cancelled.append(call.args["seat"])
            self.seats.pop(call.args["seat"], None)

        @rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
        def book(seat: int, who: str) -> Any:
            self.seats[seat] = who
            return f"seat {seat}" if result is None else result

        @rt.tool(effect="irreversible", writes="mail:{to}")
        def send(to: str, text: str) -> None:
            self.outbox.append(text)

        return book, send


def _failing(times: int | None, real: Any) -> Any:
    """`real`, failing with a full disk the first `times` calls (None: every call)."""
    calls = {"n": 0}

    def write(*args: Any) -> Any:
        calls["n"] += 1
        if times is None or calls["n"] <= times:
            raise OSError(28, "No space left on device")
        return real(*args)

    return write


# ------------------------------------------------------------------- the committed mark
def test_a_committed_mark_that_fails_once_is_retried_and_recovery_keeps_the_booking(
    tmp_path: Path,
) -> None:
    """It used to commit with only a warning while the log still held the transaction as
    uncommitted, and the next start's recovery cancelled the booking the app saw commit."""
    world = Booking()
    rt = Runtime(log=tmp_path)
    book, send = world.tools(rt)
    assert rt.log is not None
    rt.log.committed = _failing(1, rt.log.committed)  # type: ignore[method-assign]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not write the committed mark" warning
        with rt.transaction() as tx:
            book(7, "ann")
            send("ann@example.org", "booked")
    assert tx.settlement is not None and tx.settlement.committed
    rt.close()

    again = Runtime(log=tmp_path)
    world.tools(again)
    report = again.recover()
    again.close()
    assert world.seats == {7: "ann"} and world.cancelled == []
    assert world.outbox == ["booked"]
    assert "0 aborted" in str(report)


def test_a_committed_mark_that_never_lands_refuses_the_commit_loudly(tmp_path: Path) -> None:
    """Never reported committed while the log says otherwise: the transaction aborts with a
    clear error, its booking compensated, its mail never sent; recovery finds nothing."""
    world = Booking()
    rt = Runtime(log=tmp_path)
    book, send = world.tools(rt)
    assert rt.log is not None
    rt.log.committed = _failing(None, rt.log.committed)  # type: ignore[method-assign]
    with pytest.raises(TransactionAborted, match="committed mark could not be written") as info:
        with rt.transaction():
            book(7, "ann")
            send("ann@example.org", "booked")
    settlement = info.value.settlement
    assert settlement is not None and not settlement.committed and settlement.clean
    assert len(settlement.compensated) == 1 and len(settlement.dropped) == 1
    assert world.seats == {} and world.cancelled == [7] and world.outbox == []
    rt.close()

    again = Runtime(log=tmp_path)
    world.tools(again)
    again.recover()
    again.close()
    assert world.cancelled == [7] and world.outbox == []  # not compensated or sent again


# ------------------------------------------------------------------ an unrecordable result
class Detached:
    """A result whose repr raises, as a detached ORM row's does."""

    def __repr__(self) -> str:
        raise RuntimeError("Instance <Row> is not bound to a Session")


@pytest.mark.parametrize("logged", [False, True], ids=["no-log", "log"])
def test_a_result_whose_repr_raises_commits_as_without_a_log(tmp_path: Path, logged: bool) -> None:
    """With log= the transaction used to abort with clean=True, the booking neither kept
    nor compensated, and the log forgot it; without log= the same tool commits."""
    world = Booking()
    rt = Runtime(log=tmp_path if logged else None)
    book, _ = world.tools(rt, result=Detached())
    with rt.transaction() as tx:
        got = book(7, "ann")
    assert isinstance(got, Detached)
    assert tx.settlement is not None and tx.settlement.committed
    assert world.seats == {7: "ann"}
    rt.close()


def test_a_result_whose_repr_raises_is_still_compensated_at_abort(tmp_path: Path) -> None:
    world = Booking()
    rt = Runtime(log=tmp_path)
    book, _ = world.tools(rt, result=Detached())
    with pytest.raises(ValueError), rt.transaction() as tx:
        book(7, "ann")
        raise ValueError("the agent gives up")
    assert world.seats == {} and world.cancelled == [7]
    assert tx.settlement is not None and tx.settlement.clean
    assert len(tx.settlement.compensated) == 1
    rt.close()
    again = Runtime(log=tmp_path)  # and the log holds nothing more to undo
    world.tools(again)
    again.recover()
    again.close()
    assert world.cancelled == [7]


def test_a_crash_after_an_unrecordable_result_is_still_compensated_by_recovery(
    tmp_path: Path,
) -> None:
    """The log keeps the call, with a stand-in for its result, so recovery can undo it."""
    world = Booking()
    rt = Runtime(log=tmp_path)
    book, _ = world.tools(rt, result=Detached())
    tx = rt.transaction()
    with tx.active():
        book(7, "ann")
    assert rt.log is not None
    rt.log.close()  # the process dies with the transaction open: its rows stay
    again = Runtime(log=tmp_path)
    world.tools(again)
    again.recover()
    again.close()
    assert world.seats == {} and world.cancelled == [7]


# ------------------------------------------------------------------------------- close()
def test_close_with_a_transaction_open_is_refused(tmp_path: Path) -> None:
    """close() used to succeed: a new runtime on the log then compensated the live
    transaction, and it was compensated again when it ended."""
    world = Booking()
    rt = Runtime(log=tmp_path)
    book, _ = world.tools(rt)
    with rt.transaction() as tx:
        book(7, "ann")
        with pytest.raises(AtomixError, match=f"still unsettled \\(tx{tx.txid}\\)"):
            rt.close()
        with pytest.raises(LogBusy):  # the log stays this runtime's
            Runtime(log=tmp_path)
    rt.close()  # settled: now it closes
    again = Runtime(log=tmp_path)
    world.tools(again)
    again.recover()
    again.close()
    assert world.seats == {7: "ann"} and world.cancelled == []


# ------------------------------------------------------------------- fsync off the loop
def test_async_transactions_write_the_log_off_the_event_loop(tmp_path: Path) -> None:
    """Every durable write (the call's start and result, the intent, the committed mark,
    each step's and compensation's mark, the end) used to run on the loop's thread."""
    world = Booking()
    rt = Runtime(log=tmp_path)
    log = rt.log
    assert log is not None
    on_loop: list[str] = []
    written: list[str] = []

    def watch(name: str) -> None:
        real = getattr(log, name)

        def write(*args: Any, **kwargs: Any) -> Any:
            written.append(name)
            if threading.get_ident() == loop_thread:
                on_loop.append(name)
            return real(*args, **kwargs)

        setattr(log, name, write)

    for name in ("call_started", "call_returned", "intent", "committed", "mark", "set_status", "done"):
        watch(name)

    @rt.tool(effect="reversible", writes="seat:{seat}", compensate=lambda call: world.seats.pop(call.args["seat"]))
    async def book(seat: int) -> str:
        world.seats[seat] = "x"
        return "ok"

    @rt.tool(effect="irreversible", writes="mail:{to}")
    async def send(to: str) -> None:
        world.outbox.append(to)

    async def main() -> None:
        async with rt.atransaction():
            await book(1)
            await send("a@example.org")
        with pytest.raises(ValueError):
            async with rt.atransaction():
                await book(2)
                raise ValueError("abort")

    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    asyncio.run(main())
    rt.close()
    assert world.seats == {1: "x"} and world.outbox == ["a@example.org"]
    assert {"call_started", "call_returned", "intent", "committed", "mark", "set_status", "done"} <= set(written)
    assert on_loop == []

"""`Tx.active()` / `ATx.active()`: a transaction that outlives one block (a chat task over
several turns, an MCP session), made current per block and settled explicitly."""

from __future__ import annotations

import asyncio
import threading

import pytest

from atomix import OutsideTransaction, Runtime


def _runtime() -> tuple[Runtime, list[str], list[str]]:
    rt = Runtime(timeout=5.0)
    sent: list[str] = []
    booked: list[str] = []

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def send(to: str) -> None:
        sent.append(to)

    @rt.tool(effect="reversible", writes="kv:room/{room}",
             compensate=lambda call: booked.remove(call.args["room"]))
    def book(room: str) -> None:
        booked.append(room)

    rt.send, rt.book = send, book  # type: ignore[attr-defined]
    return rt, sent, booked


def test_blocks_of_one_transaction_settle_together_at_commit() -> None:
    rt, sent, booked = _runtime()
    tx = rt.transaction()
    with tx.active():
        rt.send("a")  # type: ignore[attr-defined]
        rt.book("r1")  # type: ignore[attr-defined]
    assert sent == [] and booked == ["r1"]
    with tx.active():
        rt.send("b")  # type: ignore[attr-defined]
    assert sent == []
    tx.commit()
    assert sent == ["a", "b"] and booked == ["r1"]


def test_abort_after_several_blocks_compensates_and_never_sends() -> None:
    rt, sent, booked = _runtime()
    tx = rt.transaction()
    for room in ("r1", "r2"):
        with tx.active():
            rt.book(room)  # type: ignore[attr-defined]
            rt.send(room)  # type: ignore[attr-defined]
    tx.abort()
    assert sent == [] and booked == []


def test_leaving_the_block_does_not_settle_and_an_exception_does_not_abort() -> None:
    rt, sent, _ = _runtime()
    tx = rt.transaction()
    with pytest.raises(RuntimeError), tx.active():
        rt.send("a")  # type: ignore[attr-defined]
        raise RuntimeError("one turn failed")
    assert tx.settlement is None
    tx.commit()
    assert sent == ["a"]


def test_outside_the_block_a_call_is_its_own_transaction_again() -> None:
    rt, sent, _ = _runtime()
    tx = rt.transaction()
    with tx.active():
        rt.send("in")  # type: ignore[attr-defined]
    # Another thread with no context while the transaction is active elsewhere: refused.
    errors: list[BaseException] = []
    with tx.active():
        worker = threading.Thread(target=lambda: _capture(errors, lambda: rt.send("t")))  # type: ignore[attr-defined]
        worker.start()
        worker.join()
    assert errors and isinstance(errors[0], OutsideTransaction)
    tx.abort()
    assert sent == []


def _capture(errors: list[BaseException], fn) -> None:  # noqa: ANN001
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


def test_async_transaction_active_across_coroutines() -> None:
    rt = Runtime(timeout=5.0)
    sent: list[str] = []

    @rt.tool(effect="irreversible", writes="mail:{to}")
    async def send(to: str) -> None:
        sent.append(to)

    async def main() -> None:
        tx = rt.atransaction()
        with tx.active():
            await send("a")
        with tx.active():
            await send("b")
        assert sent == []
        await tx.commit()

    asyncio.run(main())
    assert sent == ["a", "b"]

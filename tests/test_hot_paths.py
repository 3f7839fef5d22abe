"""The inline paths of a synchronous transaction: a reversible call and a commit run without
driver steps when nothing must wait and no durable log is kept. They must behave exactly as the
steps do; anything else falls back to the steps. Nothing is timed."""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path
from typing import Any

import pytest
from support import HANG_S, wait_until

from atomix.effects import AbortSource
from atomix.errors import TransactionAborted
from atomix.log import TxLog
from atomix.runtime import Runtime
from atomix.session import TxSession
from atomix.tools import Call
from atomix.transaction import Transaction


def booking(rt: Runtime, store: dict[str, Any], log: list[str]) -> Any:
    def book(k: str, v: int) -> int:
        if v < 0:
            store[k] = v  # it acts, then fails: the compensation must still run
            raise RuntimeError("refused after acting")
        store[k] = v
        return v

    def unbook(call: Call) -> None:
        log.append(f"undo {call.args['k']}")
        store.pop(call.args["k"], None)

    return rt.tool(book, effect="reversible", writes="kv:{k}", compensate=unbook, name="book")


def test_a_session_is_made_as_its_transaction_record_is() -> None:
    """TxSession writes the record's fields itself (one frame less per begin): the same
    values as Transaction's own constructor, for every field."""
    plain = Transaction(7, 9, "trace", "g", 2)
    session = TxSession(7, 9, "trace", "g", 2)
    for name in Transaction.__slots__:  # type: ignore[attr-defined]
        assert getattr(session, name) == getattr(plain, name), name


def test_an_inline_reversible_call_runs_stages_and_commits() -> None:
    rt = Runtime()
    store: dict[str, Any] = {}
    log: list[str] = []
    book = booking(rt, store, log)
    with rt.transaction() as tx:
        assert book("a", 1) == 1
        assert book("b", 2) == 2
        assert store == {"a": 1, "b": 2}  # executed at once
        assert [e.tool for e in tx.effects] == ["book", "book"]
    settlement = rt.settlements[-1]
    assert settlement.committed and len(settlement.accepted) == 2 and log == []


def test_an_inline_reversible_call_that_raises_is_compensated_at_abort() -> None:
    rt = Runtime()
    store: dict[str, Any] = {}
    log: list[str] = []
    book = booking(rt, store, log)
    with pytest.raises(RuntimeError), rt.transaction():
        book("a", 1)
        book("b", -1)
    assert store == {} and log == ["undo b", "undo a"]  # reverse order, the failed one too
    settlement = rt.settlements[-1]
    assert settlement.abort_source == AbortSource.TOOL_FAILURE.value
    assert len(settlement.compensated) == 2


def test_an_inline_commit_that_is_stale_aborts_with_its_settlement() -> None:
    """An earlier transaction commits a write after a later one read the old value: the
    later one's commit, decided inline (nothing to wait for any more), aborts as stale."""
    rt = Runtime(timeout=30.0)
    values = {"x": 0}
    read = rt.tool(lambda k: values[k], reads="kv:{k}", name="read")
    write = rt.tool(
        lambda k, v: values.__setitem__(k, v), effect="bufferable", writes="kv:{k}", name="write"
    )
    earlier = rt.transaction()
    earlier.__enter__()
    write("x", 1)  # staged: lands at its commit
    has_read, go_on = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def later() -> None:
        try:
            with rt.transaction():
                assert read("x") == 0
                has_read.set()
                go_on.wait(30)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - examined below
            outcome.append(exc)

    worker = threading.Thread(target=later)
    worker.start()
    assert has_read.wait(30)
    earlier.__exit__(None, None, None)  # commits: it does not wait for a later reader
    go_on.set()
    worker.join(30)
    (caught,) = outcome
    assert isinstance(caught, TransactionAborted), caught
    assert caught.source == AbortSource.STALE_READ.value
    assert caught.settlement is not None and not caught.settlement.committed
    assert values == {"x": 1}


def test_a_reversible_call_that_must_wait_falls_back_to_the_steps() -> None:
    """The core says Wait on the inline path: the call waits (through the steps, as any
    driver does) until the earlier transaction settles, then runs."""
    rt = Runtime(timeout=30.0)
    store: dict[str, Any] = {}
    log: list[str] = []
    book = booking(rt, store, log)
    order: list[str] = []
    started = threading.Event()
    earlier = rt.transaction()
    earlier.__enter__()
    book("x", 1)  # holds kv:x with an unsettled eager effect

    def later() -> None:
        with rt.transaction():
            started.set()
            book("x", 2)
            order.append("later ran")

    worker = threading.Thread(target=later)
    worker.start()
    assert started.wait(HANG_S)
    # The later call is parked until `earlier` settles: nothing it does runs before.
    wait_until(
        lambda: rt.core._parked or not worker.is_alive(),  # noqa: SLF001 - the core's parking
        "the later call is parked",
    )
    assert rt.core._parked, "the later call did not wait"  # noqa: SLF001
    assert order == [] and store == {"x": 1}
    order.append("earlier commits")
    earlier.__exit__(None, None, None)
    worker.join(30)
    assert order == ["earlier commits", "later ran"]
    assert store == {"x": 2}
    assert [s.outcome for s in rt.settlements] == ["committed", "committed"]


def test_with_a_durable_log_a_reversible_call_is_logged_before_it_runs(tmp_path: Path) -> None:
    """The inline path is not taken when a durable log is kept: the steps log each call
    before it runs, so a process that dies inside the transaction leaves what recovery needs
    to compensate it."""
    log_dir = tmp_path / "log"
    store: dict[str, Any] = {}
    undone: list[str] = []
    rt = Runtime(log=TxLog(log_dir, durable=False))
    book = booking(rt, store, undone)

    def dies_inside_a_transaction() -> None:
        rt.transaction().__enter__()  # never left: the process dies in it
        book("a", 1)  # runs at once, logged first
        assert rt.log is not None
        rt.log.close()  # nothing committed, nothing compensated

    # In a context of its own, so that the abandoned block is not this thread's any more.
    contextvars.copy_context().run(dies_inside_a_transaction)
    assert store == {"a": 1}
    again = Runtime(log=TxLog(log_dir, durable=False))
    assert again.recovery is not None and len(again.recovery.pending) == 1
    booking(again, store, undone)
    report = again.recover()
    assert report.clean and report.compensated == 1, str(report)
    assert store == {} and undone == ["undo a"]
    again.close()

"""The public runtime: transactions, threads, asyncio, retries and speculation."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from atomix import AbortSource, Call, Runtime, Settlement, TransactionAborted
from atomix.runtime import Tx
from atomix.transaction import TxState

JOIN = 10.0  # seconds: generous, only a hung test ever waits this long


def _wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + JOIN
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)


class World:
    """A runtime with one tool of each class over in-memory state, and a log of what ran."""

    def __init__(self, rt: Runtime | None = None) -> None:
        self.rt = rt or Runtime(timeout=JOIN)
        self.store: dict[str, Any] = {}
        self.outbox: list[tuple[str, str]] = []
        self.seats: set[int] = set()
        self.log: list[str] = []
        self.fail_cancel: set[int] = set()
        self.cancel_hooks: list[Callable[[], None]] = []
        rt = self.rt

        @rt.tool(effect="bufferable", writes="mem:{k}")
        def put(k: str, v: Any) -> None:
            self.log.append(f"put {k}={v}")
            self.store[k] = v

        @rt.tool(reads="mem:{k}")
        def get(k: str) -> Any:
            return self.store.get(k)

        @rt.tool(effect="irreversible", writes="mail:{to}")
        def send(to: str, text: str) -> None:
            self.log.append(f"send {to}")
            self.outbox.append((to, text))

        def cancel(call: Call) -> None:
            for hook in self.cancel_hooks:
                hook()
            seat = call.args["seat"]
            if seat in self.fail_cancel:
                raise RuntimeError(f"cannot cancel seat {seat}")
            self.log.append(f"cancel {seat}")
            self.seats.discard(seat)

        @rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
        def book(seat: int) -> str:
            self.log.append(f"book {seat}")
            self.seats.add(seat)
            return f"seat {seat}"

        self.put, self.get, self.send, self.book = put, get, send, book


@pytest.fixture
def w() -> World:
    return World()


# ============================================================================= commit / abort
def test_commit_on_exit_applies_releases_and_accepts(w: World) -> None:
    with w.rt.transaction() as tx:
        a = w.put("x", 1)
        m = w.send("ann", "hi")
        assert w.book(7) == "seat 7"
        # Bufferable and gated effects wait for commit; the reversible one ran eagerly.
        assert w.store == {} and w.outbox == [] and w.seats == {7}
        assert (a.status, m.status) == ("staged", "queued")
    s = tx.settlement
    assert s is not None and s.committed and s.clean
    assert (s.outcome, s.abort_source) == ("committed", None)
    assert s.applied == (a.key,) and s.released == (m.key,) and len(s.accepted) == 1
    assert s.compensated == s.dropped == s.residue == s.failed_applies == ()
    assert s.waited == 0.0
    assert w.store == {"x": 1} and w.outbox == [("ann", "hi")] and w.seats == {7}
    assert w.rt.settlements[-1] is s


def test_a_settled_handle_keeps_its_settlement_but_not_its_effects_payloads() -> None:
    """The handle is the core's record, and outlives the core's interest in it: once settled
    it must not keep what its effects carried (closures, arguments) alive."""
    rt = Runtime()

    class Payload:
        pass

    put = rt.tool(lambda k, blob: None, effect="bufferable", writes="mem:{k}", name="put")
    handles = []
    for outcome in ("commit", "abort"):
        blob = Payload()
        alive = weakref.ref(blob)
        with contextlib.suppress(RuntimeError), rt.transaction() as tx:
            put(1, blob)
            if outcome == "abort":
                raise RuntimeError("abort")
        del blob
        gc.collect()
        assert alive() is None, f"after {outcome}, the handle keeps its effect's payload alive"
        assert tx.settlement is not None and len(tx.settlement.applied + tx.settlement.dropped) == 1
        handles.append(tx)
    assert rt.core.active() == [] and rt.core._txs == {}


def test_exception_aborts_drops_and_compensates_in_reverse_order(w: World) -> None:
    with pytest.raises(ValueError, match="boom"), w.rt.transaction() as tx:
        a = w.put("x", 1)
        m = w.send("ann", "hi")
        w.book(1)
        w.book(2)
        w.book(3)
        raise ValueError("boom")
    s = tx.settlement
    assert s is not None and not s.committed and s.clean
    assert s.outcome == "aborted" and s.abort_source == AbortSource.TOOL_FAILURE.value
    assert "boom" in s.detail
    assert s.dropped == (a.key, m.key)
    assert len(s.compensated) == 3 and s.applied == s.released == s.accepted == ()
    assert w.store == {} and w.outbox == [] and w.seats == set()
    assert w.log == ["book 1", "book 2", "book 3", "cancel 3", "cancel 2", "cancel 1"]
    assert list(s.compensated) == [_book_key(w, tx, seat) for seat in (3, 2, 1)]


def _book_key(w: World, tx: Tx, seat: int) -> str:
    """The idempotency key `w.book(seat)` had in `tx`, from its settlement (the core forgets
    finished ones): the run's prefix, the tool, the call's ordinal, then the arguments."""
    s = tx.settlement
    assert s is not None
    part = w.book.spec.key_part({"seat": seat})
    found = [
        k
        for k in s.accepted + s.compensated + s.residue
        if k.startswith(f"{tx.session.key_prefix}book:#") and k.endswith(f":{part}")
    ]
    assert len(found) == 1, found
    return found[0]


def test_an_exception_can_name_its_abort_source(w: World) -> None:
    class Veto(Exception):
        abort_source = AbortSource.PRE_COMMIT_VETO

    with pytest.raises(Veto), w.rt.transaction() as tx:
        w.put("x", 1)
        raise Veto("no")
    assert tx.settlement is not None and tx.settlement.abort_source == "pre_commit_veto"


def test_failed_compensation_is_residue_and_the_rest_still_compensate(w: World) -> None:
    w.fail_cancel.add(2)
    with pytest.raises(KeyError), w.rt.transaction() as tx:
        w.book(1)
        w.book(2)
        w.book(3)
        raise KeyError("stop")
    s = tx.settlement
    assert s is not None and not s.clean
    keys = [_book_key(w, tx, seat) for seat in (1, 2, 3)]
    assert s.residue == (keys[1],)
    assert s.compensated == (keys[2], keys[0])  # reverse order, the failed one left out
    assert w.seats == {2} and w.log[-2:] == ["cancel 3", "cancel 1"]


def test_explicit_commit_or_abort_inside_the_block(w: World) -> None:
    with w.rt.transaction() as tx:
        w.put("x", 1)
        committed = tx.commit()
    assert committed.committed and tx.settlement is committed and w.store == {"x": 1}
    with w.rt.transaction() as tx2:
        w.put("y", 2)
        aborted = tx2.abort(detail="changed my mind")
    assert not aborted.committed and tx2.settlement is aborted and "y" not in w.store
    assert aborted.abort_source == "pre_commit_veto"


def test_call_outside_a_transaction_runs_in_its_own(w: World) -> None:
    ack = w.put("x", 1)
    assert w.store == {"x": 1}
    assert w.rt.settlements[-1].applied == (ack.key,)


def test_duplicate_delivery_of_a_reversible_call_runs_once(w: World) -> None:
    """With an explicit key the key is the call's identity: the same call delivered again
    (a retry by a framework that does not know it landed) runs once."""

    @w.rt.tool(
        effect="reversible",
        writes="seat:{seat}",
        key="{seat}",
        compensate=lambda call: w.log.append(f"cancel {call.args['seat']}"),
    )
    def book_once(seat: int) -> str:
        w.log.append(f"book {seat}")
        return f"seat {seat}"

    with pytest.raises(RuntimeError), w.rt.transaction() as tx:
        assert book_once(5) == "seat 5"
        assert book_once(5) == "seat 5"  # the same call again: a duplicated delivery
        raise RuntimeError("abort")
    assert w.log == ["book 5", "cancel 5"]
    assert tx.settlement is not None and tx.settlement.duplicates_suppressed == 1


def test_two_identical_calls_without_an_explicit_key_are_two_effects(w: World) -> None:
    """The default key includes the call's ordinal: booking seat 5 twice books it twice, and
    an abort cancels both."""
    with pytest.raises(RuntimeError), w.rt.transaction() as tx:
        w.put("x", 1)
        w.put("x", 1)
        w.book(5)
        w.book(5)
        raise RuntimeError("abort")
    s = tx.settlement
    assert s is not None and s.duplicates_suppressed == 0
    assert len(s.dropped) == 2 and len(set(s.dropped)) == 2
    assert w.log == ["book 5", "book 5", "cancel 5", "cancel 5"]


def test_seal_then_late_effect_is_a_seal_violation(w: World) -> None:
    tx = w.rt.transaction()
    with tx:
        w.put("x", 1)
        tx.seal()
        with pytest.raises(TransactionAborted) as info:
            w.put("y", 2)
    assert info.value.source == "seal_violation"
    assert tx.settlement is not None and tx.settlement.abort_source == "seal_violation"
    assert w.store == {}


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
    _wait_until(lambda: "late" in handles, "the late transaction began")
    late_tx, early_tx = handles["late"], handles["early"]
    assert late_tx.epoch > early_tx.epoch
    _wait_until(lambda: w.rt.core.get(late_tx.txid).state is TxState.WAITING, "late waits")
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
    _wait_until(lambda: "first" in handles and w.seats == {1}, "first is open")
    b = threading.Thread(target=second)
    b.start()
    b.join(JOIN)
    assert not b.is_alive(), "a disjoint transaction waited for an open one"
    assert handles["second"].epoch > handles["first"].epoch
    assert handles["second"].settlement.waited == 0.0 and w.store == {"b": 2}
    release.set()
    a.join(JOIN)
    assert handles["first"].settlement.committed and w.store == {"a": 1, "b": 2}


# ============================================================================ stale and retry
def _commit_in_thread(fn: Callable[[], None]) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join(JOIN)
    assert not t.is_alive()


def test_stale_read_aborts(w: World) -> None:
    w.store["x"] = 0
    earlier = w.rt.transaction()  # an earlier epoch, still open
    with pytest.raises(TransactionAborted) as info, w.rt.transaction() as tx:
        assert w.get("x") == 0

        def write() -> None:
            with earlier:
                w.put("x", 1)

        _commit_in_thread(write)  # commits a write to x after tx read it
    assert info.value.source == AbortSource.STALE_READ.value
    assert tx.settlement is not None and tx.settlement.abort_source == "stale_read"


def test_run_retries_a_stale_read_with_a_fresh_epoch(w: World) -> None:
    w.store["x"] = 0
    earlier = w.rt.transaction()
    epochs: list[int] = []

    def write() -> None:
        with earlier:
            w.put("x", 10)

    def body(tx: Any) -> int:
        epochs.append(tx.epoch)
        seen = w.get("x")
        if len(epochs) == 1:
            _commit_in_thread(write)
        w.put("y", seen + 1)
        return seen

    assert w.rt.run(body) == 10
    assert len(epochs) == 2 and epochs[1] > epochs[0] > earlier.epoch
    assert w.store == {"x": 10, "y": 11}
    by_epoch = {s.epoch: s for s in w.rt.settlements}
    first, last = by_epoch[epochs[0]], by_epoch[epochs[1]]
    assert (first.abort_source, len(first.dropped)) == ("stale_read", 1)
    assert last.committed and by_epoch[earlier.epoch].committed


def test_run_does_not_retry_other_aborts(w: World) -> None:
    calls: list[int] = []

    def body(tx: Any) -> None:
        calls.append(tx.epoch)
        raise TransactionAborted(tx.txid, "pre_commit_veto")

    with pytest.raises(TransactionAborted):
        w.rt.run(body)
    assert len(calls) == 1


# ==================================================================================== asyncio
class AsyncWorld:
    def __init__(self) -> None:
        self.rt = Runtime(timeout=JOIN)
        self.store: dict[str, Any] = {}
        self.log: list[str] = []
        rt = self.rt

        @rt.tool(effect="bufferable", writes="mem:{k}")
        async def aput(k: str, v: Any) -> None:
            await asyncio.sleep(0)
            self.log.append(f"put {k}={v}")
            self.store[k] = v

        @rt.tool(reads="mem:{k}")
        async def aget(k: str) -> Any:
            await asyncio.sleep(0)
            return self.store.get(k)

        async def unbook(call: Call) -> None:
            await asyncio.sleep(0)
            self.log.append(f"cancel {call.args['seat']}")

        @rt.tool(effect="reversible", writes="seat:{seat}", compensate=unbook)
        async def abook(seat: int) -> int:
            self.log.append(f"book {seat}")
            return seat

        self.aput, self.aget, self.abook = aput, aget, abook


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
        await asyncio.sleep(0.03)  # late is waiting; the loop keeps running other tasks
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
        release = asyncio.Event()

        async def early() -> None:
            async with aw.rt.atransaction():
                await aw.aput("s", "early")
                await release.wait()

        task = asyncio.create_task(early())
        await asyncio.sleep(0.01)
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
        asyncio.get_running_loop().call_later(0.02, release.set)
        async with aw.rt.atransaction() as tx:
            await aw.aput("s", "task")
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


# ================================================================================ speculation
def _speculate(w: World, group: str, k: int, fail: int | None = None) -> list[Any]:
    branches = [w.rt.branch(group, i) for i in range(k)]
    for i, branch in enumerate(branches):
        try:
            with branch:
                w.put("answer", i)  # every branch stages the same logical write
                w.send(f"user{i}", f"from branch {i}")
                w.book(100 + i)
                w.book(200 + i)
                if i == fail:
                    raise RuntimeError(f"branch {i} failed")
        except RuntimeError:
            pass
    return branches


def test_resolve_commits_the_winner_and_none_of_the_losers(w: World) -> None:
    branches = _speculate(w, "g", 4)
    # Before resolve: only reversible effects ran; nothing staged or gated has left.
    assert w.store == {} and w.outbox == []
    assert w.seats == {100, 101, 102, 103, 200, 201, 202, 203}
    winner, losers = w.rt.resolve("g", branches[2])
    assert winner.committed and winner.group == "g" and winner.waited == 0.0
    assert len(winner.applied) == len(winner.released) == 1 and len(winner.accepted) == 2
    assert w.store == {"answer": 2} and w.outbox == [("user2", "from branch 2")]
    assert w.seats == {102, 202}
    assert [s.txid for s in losers] == [branches[i].txid for i in (0, 1, 3)]
    for branch, s in zip((branches[i] for i in (0, 1, 3)), losers, strict=True):
        assert branch.settlement is s  # the loser's own handle sees its settlement
        assert s.outcome == "aborted" and s.abort_source == "losing_speculation"
        assert len(s.dropped) == 2 and len(s.compensated) == 2 and s.clean
        assert s.applied == s.released == s.accepted == ()
        # Compensated in reverse order: seat 2xx before seat 1xx.
        i = branches.index(branch)
        assert s.compensated == (_book_key(w, branch, 200 + i), _book_key(w, branch, 100 + i))
    for i in (0, 1, 3):
        assert w.log.index(f"cancel {200 + i}") < w.log.index(f"cancel {100 + i}")
    assert not any(line.startswith("send user") and line != "send user2" for line in w.log)
    assert branches[0].abort() is losers[0]  # settled already: abort is a no-op


def test_resolve_with_a_failed_winner_raises_and_still_aborts_the_losers(w: World) -> None:
    branches = _speculate(w, "g", 3, fail=0)
    with pytest.raises(TransactionAborted) as info:
        w.rt.resolve("g", branches[0])
    assert info.value.source == "tool_failure"
    assert info.value.settlement is branches[0].settlement
    assert all(b.settlement is not None and not b.settlement.committed for b in branches)
    assert w.store == {} and w.outbox == [] and w.seats == set()


def test_a_branch_committed_first_wins_and_its_siblings_are_undone_before_it_lands(
    w: World,
) -> None:
    """First to succeed: `branch.commit()` is resolve with itself as the winner, so a live
    sibling's compensation on the same seat runs before, never after, the winner's booking."""
    a, b = w.rt.branch("g", 0), w.rt.branch("g", 1)
    with a:
        w.book(5)  # reversible: seat 5 is taken eagerly by branch 0
    with b:
        w.put("answer", "b")
    s = b.commit()
    assert s.committed and w.store == {"answer": "b"}
    assert a.settlement is not None and a.settlement.abort_source == "losing_speculation"
    assert w.seats == set() and w.log.index("cancel 5") < w.log.index("put answer=b")
    with pytest.raises(TransactionAborted):
        a.commit()  # the loser cannot commit afterwards


def test_branches_that_all_fail_leave_nothing_tracked(w: World) -> None:
    first = _speculate(w, "gone", 3, fail=0)
    for i in (1, 2):  # others fail too, on their own
        with pytest.raises(RuntimeError), w.rt.branch("gone", 10 + i):
            w.book(300 + i)
            raise RuntimeError("failed")
    # only the two sealed, live branches still await resolve
    assert {t.txid for t in w.rt.core.active()} == {first[1].txid, first[2].txid}
    winner, losers = w.rt.resolve("gone", _speculate(w, "gone", 1)[0])
    assert winner.committed and len(losers) == 2  # 2 sealed live ones; the failures settled
    assert w.rt.core.active() == [] and w.rt.core._groups == {} and w.rt.core._txs == {}


@pytest.mark.parametrize("round_", range(5))
def test_branches_committing_at_once_in_threads_leave_exactly_one_winner(round_: int) -> None:
    w = World()
    k = 6
    branches = [w.rt.branch(f"race{round_}", i) for i in range(k)]
    start = threading.Barrier(k)
    outcome: dict[int, str] = {}

    def run(i: int) -> None:
        with branches[i]:
            w.book(10 * round_ + i)  # reversible: runs now, compensated if the branch loses
            w.put("answer", i)
        start.wait(JOIN)
        try:
            outcome[i] = "committed" if branches[i].commit().committed else "?"
        except TransactionAborted as exc:
            outcome[i] = exc.source

    threads = [threading.Thread(target=run, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN)
    assert not any(t.is_alive() for t in threads)
    winners = [i for i, o in outcome.items() if o == "committed"]
    assert len(outcome) == k and len(winners) == 1, outcome
    assert all(o == "losing_speculation" for i, o in outcome.items() if i not in winners)
    (win,) = winners
    assert w.store == {"answer": win} and w.seats == {10 * round_ + win}
    assert all(b.settlement is not None for b in branches)
    assert w.rt.core.active() == [] and w.rt.core._groups == {} and w.rt.core._txs == {}


def test_a_rival_resolving_while_the_winner_compensates_it_loses_cleanly(w: World) -> None:
    """Two first-to-succeed commits race: a resolves and, outside the lock, is running b's
    compensation when b's own resolve arrives. b must lose without settling itself a second
    time, and must not displace a as the winner."""
    a, b = w.rt.branch("g", 0), w.rt.branch("g", 1)
    with b:
        w.book(7)
    with a:
        w.put("answer", "a")
    rival: dict[str, Any] = {}

    def rival_resolves() -> None:
        try:
            w.rt.resolve("g", b)
        except TransactionAborted as exc:
            rival["exc"] = exc

    def cancel_hook() -> None:  # runs inside a's resolve, while b is aborted but unsettled
        t = threading.Thread(target=rival_resolves)
        t.start()
        t.join(JOIN)

    w.cancel_hooks.append(cancel_hook)
    winner, losers = w.rt.resolve("g", a)
    assert winner.committed and w.store == {"answer": "a"} and w.seats == set()
    assert rival["exc"].source == "losing_speculation" and rival["exc"].txid == b.txid
    assert [s.txid for s in losers] == [b.txid] and b.settlement is losers[0]
    assert w.rt.core.active() == [] and w.rt.core._groups == {} and w.rt.core._txs == {}


def test_many_branches_and_a_non_group_transaction(w: World) -> None:
    branches = _speculate(w, "g16", 16)
    winner, losers = w.rt.resolve("g16", branches[15])
    assert len(losers) == 15 and w.store == {"answer": 15}
    with w.rt.transaction() as after:  # a later transaction on the same scope is not blocked
        w.put("answer", "after")
    assert after.settlement is not None and after.settlement.waited == 0.0
    assert w.store == {"answer": "after"}


def test_speculation_without_kept_settlements() -> None:
    w = World(Runtime(keep_settlements=False, timeout=JOIN))
    for round_ in range(3):
        branches = _speculate(w, f"g{round_}", 3)
        winner, losers = w.rt.resolve(f"g{round_}", branches[1])
        assert winner.committed and len(losers) == 2
    assert w.rt.settlements == [] and w.rt.core.active() == []
    assert w.rt.core._txs == {}  # every finished branch was forgotten, none too early


def test_resolve_wakes_a_losing_branch_that_is_still_waiting(w: World) -> None:
    release = threading.Event()
    holding = threading.Event()

    def earlier() -> None:  # an earlier transaction holds seat 1 with an eager effect
        with w.rt.transaction():
            w.book(1)
            holding.set()
            assert release.wait(JOIN)

    holder = threading.Thread(target=earlier)
    holder.start()
    assert holding.wait(JOIN)
    branches = [w.rt.branch("g", i) for i in range(2)]
    outcome: dict[str, Any] = {}

    def loser() -> None:
        try:
            with branches[0]:
                w.book(1)  # waits for the earlier transaction on seat 1
        except TransactionAborted as exc:
            outcome["exc"] = exc

    t = threading.Thread(target=loser)
    t.start()
    _wait_until(lambda: branches[0].txid in w.rt.coordinator._wakers, "the branch waits")
    with branches[1]:
        w.put("answer", 1)
    winner, losers = w.rt.resolve("g", branches[1])
    t.join(2.0)
    alive = t.is_alive()
    release.set()
    holder.join(JOIN)
    t.join(JOIN)
    assert not alive, "the aborted branch stayed blocked after resolve"
    assert outcome["exc"].source == "losing_speculation"
    assert winner.committed and w.store == {"answer": 1} and w.log.count("book 1") == 1

"""The public runtime's transactions: commit and abort (explicit or by an exception), what a
settlement records, compensation and residue, idempotency keys, the seal, stale reads, and
`rt.run`'s retry with a fresh epoch."""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from runtime_world import JOIN, World, _book_key

from atomix import AbortSource, Runtime, TransactionAborted


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

"""The wait path: a settle wakes only the waiters it unblocks, so the work of a settle follows
what changed, not how many transactions wait.

A Wait names every earlier transaction in the way (`blockers`) and parks the waiter on the
latest of them in each queue it waits in (`wake_on`); `finish` lists a waiter once all it is
parked on have settled. Structural checks only (who is woken, how often): nothing is timed.
"""

from __future__ import annotations

import pytest

from atomix.decisions import AbortPlan, CommitPlan, Proceed, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.transaction import Transaction, TxState

X = "kv:t:1"
Y = "kv:u:1"
TABLE = "kv:t"


def put(mgr: TransactionManager, scope: str, key: str) -> Effect:
    return Effect("put", EffectClass.BUFFERABLE, (mgr.scope(scope),), key)


def book(mgr: TransactionManager, scope: str, key: str) -> Effect:
    return Effect("book", EffectClass.REVERSIBLE, (mgr.scope(scope),), key, compensate=lambda: None)


def writer(mgr: TransactionManager, scope: str = X, **begin: object) -> Transaction:
    tx = mgr.begin(**begin)  # type: ignore[arg-type]
    assert isinstance(mgr.stage(tx.txid, put(mgr, scope, f"w{tx.txid}")), Proceed)
    mgr.seal(tx.txid)
    return tx


def test_a_chain_of_writers_wakes_one_waiter_per_settle() -> None:
    """n writers of one scope, all waiting: each commit wakes exactly the next one, never
    the rest, so settling the whole chain costs n wakes, not n^2/2."""
    mgr = TransactionManager()
    chain = [writer(mgr) for _ in range(12)]
    assert isinstance(mgr.try_commit(chain[0].txid), CommitPlan)
    for tx in chain[1:]:
        wait = mgr.try_commit(tx.txid)
        assert isinstance(wait, Wait)
        assert {b.txid for b in wait.blockers} == {t.txid for t in chain if t.epoch < tx.epoch}
        assert wait.wake_on == (chain[chain.index(tx) - 1].txid,)  # the latest only
    wakes = 0
    for this, nxt in zip(chain, chain[1:], strict=False):
        woken = mgr.finish(this.txid)[1]
        assert woken == [nxt.txid]
        wakes += len(woken)
        assert isinstance(mgr.try_commit(nxt.txid), CommitPlan)
    assert mgr.finish(chain[-1].txid)[1] == []
    assert wakes == len(chain) - 1


def test_a_waiter_is_woken_once_its_last_blocker_settles() -> None:
    mgr = TransactionManager()
    a, b = writer(mgr, X), writer(mgr, Y)
    w = mgr.begin()
    mgr.stage(w.txid, put(mgr, X, "wx"))
    mgr.stage(w.txid, put(mgr, Y, "wy"))
    mgr.seal(w.txid)
    wait = mgr.try_commit(w.txid)
    assert isinstance(wait, Wait) and set(wait.wake_on) == {a.txid, b.txid}
    for tx in (a, b):
        assert isinstance(mgr.try_commit(tx.txid), CommitPlan)
    assert mgr.finish(a.txid)[1] == []  # b still holds Y
    assert mgr.finish(b.txid)[1] == [w.txid]
    assert isinstance(mgr.try_commit(w.txid), CommitPlan)


def test_a_waiter_woken_by_a_blocker_that_settled_early_parks_on_all_that_are_left() -> None:
    """Blockers usually settle in epoch order; when the latest aborts first, the waiter is
    woken, finds the earlier ones still there and parks on every one of them."""
    mgr = TransactionManager()
    first, second = writer(mgr), writer(mgr)
    third = writer(mgr)
    w = writer(mgr)
    wait = mgr.try_commit(w.txid)
    assert isinstance(wait, Wait) and wait.wake_on == (third.txid,)
    mgr.abort(third.txid, AbortSource.TOOL_FAILURE)
    assert mgr.finish(third.txid)[1] == [w.txid]
    again = mgr.try_commit(w.txid)
    assert isinstance(again, Wait)
    assert set(again.wake_on) == {first.txid, second.txid}
    assert isinstance(mgr.try_commit(first.txid), CommitPlan)
    assert mgr.finish(first.txid)[1] == []
    mgr.try_commit(second.txid)
    assert mgr.finish(second.txid)[1] == [w.txid]


def test_a_waiter_decided_again_or_aborted_is_not_woken_by_its_old_wait() -> None:
    mgr = TransactionManager()
    a = writer(mgr)
    w = writer(mgr)
    assert isinstance(mgr.try_commit(w.txid), Wait)
    mgr.abort(w.txid, AbortSource.TIMEOUT)
    assert isinstance(mgr.try_commit(a.txid), CommitPlan)
    assert mgr.finish(a.txid)[1] == []


def test_reads_queue_behind_an_earlier_transaction_waiting_to_externalise() -> None:
    """A read does not overtake an earlier transaction queued to write its scope eagerly, as
    no reader overtakes a queued writer in a fair reader-writer lock: the settle of the
    current eager owner wakes the queued writer, not the reader, which would otherwise be
    woken only to find the writer's effect in its way."""
    mgr = TransactionManager()
    owner, queued, reader = mgr.begin(), mgr.begin(), mgr.begin()
    assert isinstance(mgr.externalize(owner.txid, [X]), Proceed)
    mgr.stage(owner.txid, book(mgr, X, "own"))
    wait = mgr.externalize(queued.txid, [X])
    assert isinstance(wait, Wait) and wait.wake_on == (owner.txid,)
    read = mgr.read(reader.txid, [X])
    assert isinstance(read, Wait)
    assert {b.txid for b in read.blockers} == {owner.txid, queued.txid}
    assert try_commit_and_finish(mgr, owner) == [queued.txid]  # not the reader
    assert isinstance(mgr.externalize(queued.txid, [X]), Proceed)
    mgr.stage(queued.txid, book(mgr, X, "queued"))
    assert try_commit_and_finish(mgr, queued) == [reader.txid]
    assert isinstance(mgr.read(reader.txid, [X]), Proceed)


def test_a_later_transaction_queued_to_externalise_does_not_hold_a_read_up() -> None:
    mgr = TransactionManager()
    owner, reader, queued = mgr.begin(), mgr.begin(), mgr.begin()
    mgr.externalize(owner.txid, [Y])
    mgr.stage(owner.txid, book(mgr, Y, "own"))
    mgr.read(queued.txid, [Y])  # only to hold Y: its externalize of X then waits
    mgr.read(reader.txid, [X])  # an earlier holder of X than `queued`
    assert isinstance(mgr.externalize(queued.txid, [X]), Wait)
    assert isinstance(mgr.read(reader.txid, [X]), Proceed)


def try_commit_and_finish(mgr: TransactionManager, tx: Transaction) -> list[int]:
    if tx.state is TxState.OPEN:
        mgr.seal(tx.txid)
    assert isinstance(mgr.try_commit(tx.txid), CommitPlan)
    return mgr.finish(tx.txid)[1]


def test_a_read_modify_write_call_waits_once_and_reads_when_it_runs() -> None:
    """`externalize(scopes, reads=...)`: the read and the eager write are decided together;
    the read is registered only when the call may run, at the position it then has."""
    mgr = TransactionManager()
    earlier, rmw = mgr.begin(), mgr.begin()
    mgr.read(earlier.txid, [X])
    wait = mgr.externalize(rmw.txid, [X], reads=[X])
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [earlier.txid]
    assert mgr.scope(X) not in rmw.reads  # nothing registered while it waits
    try_commit_and_finish(mgr, earlier)
    assert isinstance(mgr.externalize(rmw.txid, [X], reads=[X]), Proceed)
    assert mgr.scope(X) in rmw.reads and mgr.scope(X) in rmw.eager_scopes


def test_a_read_modify_write_call_is_stale_behind_a_later_eager_effect() -> None:
    mgr = TransactionManager()
    early, late = mgr.begin(), mgr.begin()
    assert isinstance(mgr.externalize(late.txid, [X]), Proceed)
    plan = mgr.externalize(early.txid, [X], reads=[X])
    assert isinstance(plan, AbortPlan) and plan.source is AbortSource.STALE_READ


def test_a_committed_branch_still_settling_is_waited_for_by_a_later_sibling() -> None:
    """A branch that joins a group after its winner committed (but before the winner's
    effects landed) must not run an eager effect under them: its compensation would later
    restore the value from before the winner's write."""
    mgr = TransactionManager()
    winner = mgr.begin(group="g")
    mgr.read(winner.txid, [TABLE])
    mgr.stage(winner.txid, put(mgr, TABLE, "win"))
    assert isinstance(mgr.resolve("g", winner.txid).decision, CommitPlan)
    late = mgr.begin(group="g")
    wait = mgr.externalize(late.txid, [TABLE])
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [winner.txid]
    assert mgr.finish(winner.txid)[1] == [late.txid]


@pytest.mark.parametrize("frontier", ["per-resource", "global"])
def test_a_settle_wakes_its_waiters_in_txid_order(frontier: str) -> None:
    """Three readers of what `first` writes, each writing a scope of its own. Per resource
    they wait only for `first`, and its settle wakes all three, in txid order; under one
    global frontier each also waits for the ones before it, so only the next is woken."""
    mgr = TransactionManager(RuntimeOptions(frontier=frontier))  # type: ignore[arg-type]
    first = writer(mgr)
    waiters = []
    for scope in ("kv:a:1", "kv:b:1", "kv:c:1"):
        w = mgr.begin()
        mgr.read(w.txid, [X])
        mgr.stage(w.txid, put(mgr, scope, f"w{w.txid}"))
        mgr.seal(w.txid)
        waiters.append(w)
    for w in reversed(waiters):
        assert isinstance(mgr.try_commit(w.txid), Wait)
    assert isinstance(mgr.try_commit(first.txid), CommitPlan)
    woken = mgr.finish(first.txid)[1]
    if frontier == "global":
        assert woken == [waiters[0].txid]
    else:
        assert woken == [w.txid for w in waiters]


def test_expired_waiters_are_aborted_in_txid_order_and_the_callers_own_is_left() -> None:
    mgr = TransactionManager()
    a, b, c = writer(mgr), writer(mgr), writer(mgr)
    for tx in (b, c):
        assert isinstance(mgr.try_commit(tx.txid), Wait)
    mgr.wait_until(c.txid, 5.0)
    mgr.wait_until(b.txid, 9.0)
    mgr.wait_until(b.txid, 6.0)  # set again: the later value counts
    assert mgr.next_deadline([b.txid, c.txid], 0.0) == 5.0
    assert mgr.expire(5.0) == []  # strictly past only
    plans = mgr.expire(10.0, but=c.txid)
    assert [p.txid for p in plans] == [b.txid]
    assert plans[0].source is AbortSource.TIMEOUT
    assert c.state is TxState.WAITING
    assert [p.txid for p in mgr.expire(10.0)] == [c.txid]
    mgr.done_waiting(a.txid)
    assert mgr.expire(100.0) == []

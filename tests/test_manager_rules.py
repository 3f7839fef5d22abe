"""Tests of atomix.manager.TransactionManager, the protocol rule by rule: who waits for whom,
stale reads and late accesses, the seal, commit and abort plans, residue, eager effects, and
frontiers. (Speculation: test_manager_speculation.py; ablations: test_manager_ablations.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from manager_driver import TABLE, X, book, commit, externalized, kind, put, send, settle

from atomix.decisions import AbortPlan, CommitPlan, Proceed, Wait
from atomix.effects import AbortSource
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.scope_parsing import parse_scope
from atomix.transaction import TxState

# --------------------------------------------------------------------------- waiting

DISJOINT = ["kv:t:1", "kv:t:2", "kv:u:1", "fs:/repo/a", "fs:/repo/b", "mail:x@y", "kv:v"]


@given(order=st.permutations(range(len(DISJOINT))), reads=st.lists(st.booleans(), min_size=7, max_size=7))
def test_disjoint_transactions_never_wait(order: list[int], reads: list[bool]) -> None:
    mgr = TransactionManager()
    txs = [mgr.begin() for _ in DISJOINT]
    for tx, scope, is_read in zip(txs, DISJOINT, reads, strict=True):
        if is_read:
            assert isinstance(mgr.read(tx.txid, [scope]), Proceed)
        else:
            assert isinstance(mgr.stage(tx.txid, put(mgr, scope, f"k{tx.txid}")), Proceed)
    for i in order:  # every commit order, with all the others still unsettled
        assert mgr.blockers(txs[i].txid) == []
        assert isinstance(commit(mgr, txs[i]), CommitPlan)
    for tx in txs:
        mgr.finish(tx.txid)


def test_later_waits_for_earlier_overlapping_and_is_woken_by_its_finish() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))  # a row
    mgr.stage(t2.txid, put(mgr, TABLE, "b"))  # its table
    wait = commit(mgr, t2)
    assert isinstance(wait, Wait)
    assert wait.txid == t2.txid
    assert [(b.txid, b.epoch) for b in wait.blockers] == [(t1.txid, t1.epoch)]
    assert all(b.epoch < t2.epoch for b in wait.blockers)
    assert t2.state is TxState.WAITING
    assert isinstance(mgr.try_commit(t2.txid), Wait)  # still waiting, WAITING -> WAITING
    # the earlier one is never held up by the later one
    assert mgr.blockers(t1.txid) == []
    assert isinstance(commit(mgr, t1), CommitPlan)
    assert isinstance(mgr.try_commit(t2.txid), Wait)  # committed is not settled
    _, woken = mgr.finish(t1.txid)
    assert woken == [t2.txid]
    plan = mgr.try_commit(t2.txid)
    assert isinstance(plan, CommitPlan)
    _, woken = mgr.finish(t2.txid)
    assert woken == []


def test_an_aborted_earlier_transaction_blocks_until_finished() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    mgr.stage(t2.txid, put(mgr, X, "b"))
    mgr.abort(t1.txid, AbortSource.TOOL_FAILURE)
    assert isinstance(commit(mgr, t2), Wait)
    assert mgr.finish(t1.txid)[1] == [t2.txid]
    assert isinstance(mgr.try_commit(t2.txid), CommitPlan)


def test_waits_name_only_earlier_epochs() -> None:
    mgr = TransactionManager()
    txs = [mgr.begin() for _ in range(5)]
    for tx in txs:
        mgr.stage(tx.txid, put(mgr, TABLE if tx.txid % 2 else X, f"k{tx.txid}"))
        mgr.seal(tx.txid)
    for tx in reversed(txs):
        decision = mgr.try_commit(tx.txid)
        if tx is txs[0]:
            assert isinstance(decision, CommitPlan)
        else:
            assert isinstance(decision, Wait)
            assert {b.txid for b in decision.blockers} == {t.txid for t in txs if t.epoch < tx.epoch}
            assert all(b.epoch < tx.epoch for b in decision.blockers)


def test_a_pure_reader_waits_for_an_earlier_writer() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    assert isinstance(mgr.read(t2.txid, [TABLE]), Proceed)  # reads do not wait for a buffer
    assert isinstance(commit(mgr, t2), Wait)


# --------------------------------------------------------------------------- staleness


def test_stale_read_aborts() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    assert isinstance(mgr.read(t2.txid, [TABLE]), Proceed)  # reads the table before t1 lands
    assert isinstance(commit(mgr, t2), Wait)
    settle(mgr, t1)
    plan = mgr.try_commit(t2.txid)
    assert isinstance(plan, AbortPlan)
    assert plan.source is AbortSource.STALE_READ
    assert t2.state is TxState.ABORTED and t2.abort_source is AbortSource.STALE_READ


def test_read_after_the_write_landed_is_not_stale() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    settle(mgr, t1)
    assert isinstance(mgr.read(t2.txid, [X]), Proceed)
    assert isinstance(commit(mgr, t2), CommitPlan)


def test_read_between_commit_and_finish_is_stale() -> None:
    """A buffered write lands while the driver carries out the CommitPlan, before finish.
    A later transaction that read in that window saw the old value."""
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    assert isinstance(commit(mgr, t1), CommitPlan)  # committed, not yet applied
    assert isinstance(mgr.read(t2.txid, [X]), Proceed)  # sees the value before the apply
    assert isinstance(commit(mgr, t2), Wait)
    mgr.finish(t1.txid)  # the driver applied the write
    plan = mgr.try_commit(t2.txid)
    assert kind(plan) == "abort:stale_read"


def test_a_write_by_an_aborted_transaction_does_not_make_readers_stale() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    mgr.read(t2.txid, [X])
    mgr.abort(t1.txid, AbortSource.PRE_COMMIT_VETO)
    mgr.finish(t1.txid)
    assert isinstance(commit(mgr, t2), CommitPlan)


def test_only_the_first_read_position_counts() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    mgr.read(t2.txid, [X])
    settle(mgr, t1)
    assert isinstance(mgr.read(t2.txid, [X]), Proceed)  # a re-read does not refresh the first
    assert kind(commit(mgr, t2)) == "abort:stale_read"


@pytest.mark.parametrize(
    ("later_does", "earlier_does", "expect"),
    [
        ("write", "read", "abort:stale_read"),
        ("write", "write", "abort:stale_read"),
        ("write", "externalize", "abort:stale_read"),
        ("read", "write", "abort:stale_read"),
        ("read", "externalize", "abort:stale_read"),
        ("read", "read", "proceed"),  # reads do not conflict
    ],
)
def test_late_access_aborts(later_does: str, earlier_does: str, expect: str) -> None:
    mgr = TransactionManager()
    early, late = mgr.begin(), mgr.begin()
    if later_does == "write":
        mgr.stage(late.txid, put(mgr, X, "late"))
    else:
        mgr.read(late.txid, [X])
    settle(mgr, late)
    assert mgr.frontier(X) == mgr.frontier(TABLE) == late.epoch
    # the earlier transaction touches the table, which covers the row the later one used
    if earlier_does == "read":
        got = mgr.read(early.txid, [TABLE])
    elif earlier_does == "write":
        got = mgr.stage(early.txid, put(mgr, TABLE, "early"))
    else:
        got = mgr.externalize(early.txid, [TABLE])
    assert kind(got) == expect
    assert early.state is (TxState.ABORTED if expect.startswith("abort") else TxState.OPEN)
    # an even later transaction is not late
    fresh = mgr.begin()
    assert isinstance(mgr.read(fresh.txid, [TABLE]), Proceed)
    assert isinstance(mgr.stage(fresh.txid, put(mgr, X, "fresh")), Proceed)


def test_late_access_to_a_sibling_row_is_fine() -> None:
    mgr = TransactionManager()
    early, late = mgr.begin(), mgr.begin()
    mgr.stage(late.txid, put(mgr, "kv:t:1", "late"))
    settle(mgr, late)
    assert isinstance(mgr.read(early.txid, ["kv:t:2"]), Proceed)
    assert isinstance(mgr.stage(early.txid, put(mgr, "kv:t:2", "e")), Proceed)
    assert isinstance(commit(mgr, early), CommitPlan)


# --------------------------------------------------------------------------- seal


@pytest.mark.parametrize("access", ["read", "stage", "externalize"])
@pytest.mark.parametrize("state", [TxState.SEALED, TxState.WAITING])
def test_access_after_seal_aborts_with_seal_violation(access: str, state: TxState) -> None:
    mgr = TransactionManager()
    holder, tx = mgr.begin(), mgr.begin()
    mgr.stage(holder.txid, put(mgr, X, "h"))
    effect = put(mgr, X, "w")
    mgr.stage(tx.txid, effect)
    mgr.seal(tx.txid)
    if state is TxState.WAITING:
        assert isinstance(mgr.try_commit(tx.txid), Wait)
    assert tx.state is state
    if access == "read":
        plan = mgr.read(tx.txid, ["kv:u:1"])
    elif access == "stage":
        plan = mgr.stage(tx.txid, put(mgr, "kv:u:1", "after"))
    else:
        plan = mgr.externalize(tx.txid, ["kv:u:1"])
    assert isinstance(plan, AbortPlan)
    assert plan.source is AbortSource.SEAL_VIOLATION
    assert plan.drop == (effect,)
    assert tx.state is TxState.ABORTED
    assert parse_scope("kv:u:1") not in tx.footprint()


def test_a_duplicate_after_seal_is_still_a_seal_violation() -> None:
    mgr = TransactionManager()
    tx = mgr.begin()
    mgr.stage(tx.txid, put(mgr, X, "k"))
    mgr.seal(tx.txid)
    assert kind(mgr.stage(tx.txid, put(mgr, X, "k"))) == "abort:seal_violation"


# --------------------------------------------------------------------------- plans


def test_commit_plan_sorts_effects_by_class_in_staging_order() -> None:
    mgr = TransactionManager()
    tx = mgr.begin()
    b1 = put(mgr, "kv:t:1", "b1")
    i1 = send(mgr, "mail:a", "i1")
    mgr.stage(tx.txid, b1)
    r1 = externalized(mgr, tx, "kv:u:1", "r1")
    mgr.stage(tx.txid, i1)
    b2 = put(mgr, "kv:t:2", "b2")
    mgr.stage(tx.txid, b2)
    plan = commit(mgr, tx)
    assert isinstance(plan, CommitPlan)
    assert (plan.txid, plan.epoch) == (tx.txid, tx.epoch)
    assert plan.apply == (b1, b2)
    assert plan.release == (i1,)
    assert plan.accept == (r1,)
    settlement, _ = mgr.finish(tx.txid, failed_applies=[b2])
    assert settlement.committed and settlement.outcome == "committed"
    assert settlement.applied == ("b1",)
    assert settlement.released == ("i1",)
    assert settlement.accepted == ("r1",)
    assert settlement.failed_applies == ("b2",)
    assert not settlement.clean
    assert settlement.writes == tuple(sorted(["kv:t:1", "kv:t:2", "kv:u:1", "mail:a"]))


def test_abort_plan_compensates_in_reverse_order_and_drops_the_rest() -> None:
    mgr = TransactionManager()
    tx = mgr.begin()
    undone: list[str] = []
    b1 = put(mgr, "kv:t:1", "b1")
    mgr.stage(tx.txid, b1)
    assert isinstance(mgr.externalize(tx.txid, ["kv:u:1"]), Proceed)
    r1 = book(mgr, "kv:u:1", "r1", undone)
    mgr.stage(tx.txid, r1)
    i1 = send(mgr, "mail:a", "i1")
    mgr.stage(tx.txid, i1)
    assert isinstance(mgr.externalize(tx.txid, ["kv:u:2"]), Proceed)
    r2 = book(mgr, "kv:u:2", "r2", undone)
    mgr.stage(tx.txid, r2)
    plan = mgr.abort(tx.txid, AbortSource.TIMEOUT, "too slow")
    assert plan.source is AbortSource.TIMEOUT and plan.detail == "too slow"
    assert plan.compensate == (r2, r1)
    assert plan.drop == (b1, i1)
    for effect in plan.compensate:  # the driver's part
        assert effect.compensate is not None
        effect.compensate()
    assert undone == ["r2", "r1"]
    settlement, _ = mgr.finish(tx.txid)
    assert settlement.outcome == "aborted" and settlement.abort_source == "timeout"
    assert settlement.compensated == ("r2", "r1")
    assert settlement.dropped == ("b1", "i1")
    assert settlement.applied == settlement.released == settlement.accepted == ()
    assert settlement.residue == ()
    assert settlement.clean


@pytest.mark.parametrize("classify", [True, False])
def test_residue_is_reported_unless_classification_is_off(classify: bool) -> None:
    mgr = TransactionManager(RuntimeOptions(classify_residue=classify))
    tx = mgr.begin()
    r1 = externalized(mgr, tx, "kv:u:1", "r1")
    r2 = externalized(mgr, tx, "kv:u:2", "r2")
    plan = mgr.abort(tx.txid, AbortSource.TOOL_FAILURE)
    assert plan.compensate == (r2, r1)
    settlement, _ = mgr.finish(tx.txid, residue=[r1])  # r1's compensation failed
    assert settlement.compensated == ("r2",)
    if classify:
        assert settlement.residue == ("r1",)
        assert not settlement.clean
    else:
        assert settlement.residue == ()
        assert settlement.clean  # the ablation: residue silently counted clean


@pytest.mark.parametrize("residue", [True, False])
def test_residue_makes_readers_stale_and_clean_compensation_does_not(residue: bool) -> None:
    mgr = TransactionManager()
    early, late = mgr.begin(), mgr.begin()
    assert isinstance(mgr.read(late.txid, [X]), Proceed)
    effect = externalized(mgr, early, X, "r")  # the later reader does not hold it up
    mgr.abort(early.txid, AbortSource.TOOL_FAILURE)
    mgr.finish(early.txid, residue=[effect] if residue else [])
    assert kind(commit(mgr, late)) == ("abort:stale_read" if residue else "commit")


def test_duplicated_staging_of_one_key_is_suppressed() -> None:
    mgr = TransactionManager()
    tx = mgr.begin()
    first = put(mgr, X, "k")
    assert isinstance(mgr.stage(tx.txid, first), Proceed)
    assert isinstance(mgr.stage(tx.txid, put(mgr, X, "k")), Proceed)
    assert isinstance(mgr.stage(tx.txid, put(mgr, "kv:u:1", "k")), Proceed)  # same key again
    assert tx.duplicates_suppressed == 2
    assert parse_scope("kv:u:1") not in tx.effect_scopes
    plan = commit(mgr, tx)
    assert isinstance(plan, CommitPlan)
    assert plan.apply == (first,)
    settlement, _ = mgr.finish(tx.txid)
    assert settlement.applied == ("k",)
    assert settlement.duplicates_suppressed == 2


def test_reversible_effect_must_be_externalized_first() -> None:
    mgr = TransactionManager()
    tx = mgr.begin()
    with pytest.raises(ValueError, match="externalize"):
        mgr.stage(tx.txid, book(mgr, X, "r"))
    assert tx.state is TxState.OPEN and tx.effects == []


# --------------------------------------------------------------------------- eager effects


def test_externalize_waits_for_an_earlier_holder() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.read(t1.txid, [TABLE])
    wait = mgr.externalize(t2.txid, [X])
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [t1.txid]
    assert parse_scope(X) not in t2.eager_scopes  # nothing reserved while waiting
    settle(mgr, t1)
    assert isinstance(mgr.externalize(t2.txid, [X]), Proceed)


def test_externalize_does_not_wait_for_a_later_holder() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t2.txid, put(mgr, X, "w"))
    assert isinstance(mgr.externalize(t1.txid, [X]), Proceed)


@pytest.mark.parametrize("who", ["later", "sibling-earlier", "sibling-later"])
def test_externalize_aborts_on_a_later_or_sibling_eager_effect(who: str) -> None:
    mgr = TransactionManager()
    group = "g" if who.startswith("sibling") else None
    first, second = mgr.begin(group=group), mgr.begin(group=group)
    owner, tx = (second, first) if who in ("later", "sibling-later") else (first, second)
    externalized(mgr, owner, X, "r")
    assert kind(mgr.externalize(tx.txid, [TABLE])) == "abort:stale_read"


def test_reads_wait_for_an_earlier_eager_effect_and_abort_on_a_later_one() -> None:
    mgr = TransactionManager()
    t1, t2, t3 = mgr.begin(), mgr.begin(), mgr.begin()
    externalized(mgr, t2, X, "r")
    wait = mgr.read(t3.txid, [TABLE])
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [t2.txid]
    assert parse_scope(TABLE) not in t3.reads  # not registered while waiting
    assert kind(mgr.read(t1.txid, [X])) == "abort:stale_read"  # would see a later effect
    assert kind(mgr.stage(mgr.begin().txid, put(mgr, X, "w"))) == "proceed"  # later writer: buffered
    settle(mgr, t2)
    assert isinstance(mgr.read(t3.txid, [TABLE]), Proceed)
    assert isinstance(commit(mgr, t3), CommitPlan)


def test_an_earlier_buffered_write_aborts_on_a_later_eager_effect() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    externalized(mgr, t2, X, "r")
    assert kind(mgr.stage(t1.txid, put(mgr, TABLE, "w"))) == "abort:stale_read"


def test_a_committed_eager_write_makes_earlier_readers_stale() -> None:
    mgr = TransactionManager()
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.read(t2.txid, [X])
    externalized(mgr, t1, X, "r")
    settle(mgr, t1)
    assert kind(commit(mgr, t2)) == "abort:stale_read"


# --------------------------------------------------------------------------- frontiers


def test_frontier_follows_commits_monotonically() -> None:
    mgr = TransactionManager()
    t1, t2, t3 = mgr.begin(), mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    mgr.read(t3.txid, ["kv:t:2"])
    assert mgr.frontier(X) == 0
    settle(mgr, t3)
    assert (mgr.frontier("kv:t:2"), mgr.frontier(TABLE), mgr.frontier(X)) == (t3.epoch, t3.epoch, 0)
    settle(mgr, t1)
    assert mgr.frontier(X) == t1.epoch
    assert mgr.frontier(TABLE) == t3.epoch  # max over the rows: never back to t1
    mgr.stage(t2.txid, put(mgr, X, "b"))
    settle(mgr, t2)
    assert mgr.frontier(X) == t2.epoch
    assert mgr.frontier("kv:t:1") == mgr.frontier(parse_scope(X))  # text and Scope agree


def test_an_aborted_transaction_does_not_move_frontiers() -> None:
    mgr = TransactionManager()
    tx = mgr.begin()
    mgr.read(tx.txid, [X])
    mgr.stage(tx.txid, put(mgr, TABLE, "w"))
    mgr.abort(tx.txid, AbortSource.PRE_COMMIT_VETO)
    mgr.finish(tx.txid)
    assert mgr.frontier(TABLE) == 0

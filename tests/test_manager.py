"""Tests of atomix.manager.TransactionManager: the protocol, rule by rule, and its ablations."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atomix.decisions import AbortPlan, CommitPlan, Proceed, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import IllegalTransition, UnknownTransaction
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.scopes import NAIVE, Scope, parse_scope
from atomix.transaction import Transaction, TxState

X = "kv:t:1"
TABLE = "kv:t"


def put(mgr: TransactionManager, scope: str, key: str, log: list[str] | None = None) -> Effect:
    return Effect(
        "put",
        EffectClass.BUFFERABLE,
        (mgr.scope(scope),),
        key,
        apply=(lambda: log.append(key)) if log is not None else None,
    )


def send(mgr: TransactionManager, scope: str, key: str) -> Effect:
    return Effect("send", EffectClass.IRREVERSIBLE, (mgr.scope(scope),), key)


def book(mgr: TransactionManager, scope: str, key: str, log: list[str] | None = None) -> Effect:
    return Effect(
        "book",
        EffectClass.REVERSIBLE,
        (mgr.scope(scope),),
        key,
        compensate=(lambda: log.append(key)) if log is not None else (lambda: None),
    )


def externalized(mgr: TransactionManager, tx: Transaction, scope: str, key: str) -> Effect:
    assert isinstance(mgr.externalize(tx.txid, [scope]), Proceed)
    effect = book(mgr, scope, key)
    assert isinstance(mgr.stage(tx.txid, effect), Proceed)
    return effect


def commit(mgr: TransactionManager, tx: Transaction) -> CommitPlan | Wait | AbortPlan:
    if tx.state is TxState.OPEN:
        mgr.seal(tx.txid)
    return mgr.try_commit(tx.txid)


def settle(mgr: TransactionManager, tx: Transaction) -> None:
    """Commit and finish, asserting it goes through."""
    assert isinstance(commit(mgr, tx), CommitPlan)
    mgr.finish(tx.txid)


def kind(decision: object) -> str:
    if isinstance(decision, Proceed):
        return "proceed"
    if isinstance(decision, Wait):
        return "wait"
    if isinstance(decision, CommitPlan):
        return "commit"
    assert isinstance(decision, AbortPlan)
    return f"abort:{decision.source.value}"


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


# --------------------------------------------------------------------------- speculation


def test_siblings_do_not_wait_on_each_other_but_other_groups_do() -> None:
    mgr = TransactionManager()
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    c = mgr.begin(group="h")
    for tx in (a, b, c):
        mgr.read(tx.txid, [X])
        mgr.stage(tx.txid, put(mgr, X, f"k{tx.txid}"))
        mgr.seal(tx.txid)
    assert mgr.blockers(b.txid) == []
    assert {blk.txid for blk in mgr.blockers(c.txid)} == {a.txid, b.txid}


def test_resolve_aborts_the_losers_and_commits_the_winner() -> None:
    mgr = TransactionManager()
    branches = [mgr.begin(group="g", branch=i) for i in range(3)]
    undone: list[str] = []
    for tx in branches:
        mgr.read(tx.txid, ["kv:u:1"])
        mgr.stage(tx.txid, put(mgr, X, f"k{tx.txid}"))
        mgr.stage(tx.txid, send(mgr, "mail:a", f"m{tx.txid}"))
    externalized(mgr, branches[0], "kv:v:1", "r0")
    branches[0].effects[-1].compensate = lambda: undone.append("r0")
    winner = branches[1]  # the middle one: an earlier and a later sibling
    res = mgr.resolve("g", winner.txid)
    # branch 0 externalised an effect: its plan goes to the driver; branch 2 only staged
    # and queued, so resolve settled it on the spot
    assert [p.txid for p in res.compensate] == [branches[0].txid]
    assert [s.txid for s in res.settled] == [branches[2].txid] and res.woken == []
    (plan,) = res.compensate
    assert plan.source is AbortSource.LOSING_SPECULATION
    assert [e.key for e in plan.compensate] == ["r0"]
    assert all(b.state is TxState.ABORTED for b in branches if b is not winner)
    assert branches[2].finished and not branches[0].finished
    (quick,) = res.settled
    assert quick.abort_source == "losing_speculation" and quick.compensated == ()
    assert quick.dropped == (f"k{branches[2].txid}", f"m{branches[2].txid}")
    decision = res.decision
    assert isinstance(decision, CommitPlan)
    assert [e.key for e in decision.apply] == [f"k{winner.txid}"]
    assert [e.key for e in decision.release] == [f"m{winner.txid}"]
    for effect in plan.compensate:  # the driver settles the loser first
        effect.compensate()
    settlement, _ = mgr.finish(plan.txid)
    assert settlement.abort_source == "losing_speculation"
    assert f"m{plan.txid}" in settlement.dropped and settlement.compensated == ("r0",)
    assert undone == ["r0"]
    mgr.finish(winner.txid)
    assert mgr.frontier(X) == winner.epoch


def test_the_winner_still_waits_for_an_earlier_transaction_of_another_group() -> None:
    mgr = TransactionManager()
    other = mgr.begin()
    mgr.stage(other.txid, put(mgr, TABLE, "o"))
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    for tx in (a, b):
        mgr.stage(tx.txid, put(mgr, X, f"k{tx.txid}"))
    res = mgr.resolve("g", a.txid)
    assert [s.txid for s in res.settled] == [b.txid] and res.compensate == []
    decision = res.decision
    assert isinstance(decision, Wait)
    assert [(blk.txid, blk.epoch) for blk in decision.blockers] == [(other.txid, other.epoch)]
    assert a.state is TxState.WAITING and b.finished
    settle_other = commit(mgr, other)
    assert isinstance(settle_other, CommitPlan)
    _, woken = mgr.finish(other.txid)
    assert a.txid in woken
    assert isinstance(mgr.try_commit(a.txid), CommitPlan)


def test_resolve_of_an_aborted_winner_aborts_the_whole_group() -> None:
    mgr = TransactionManager()
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    mgr.abort(a.txid, AbortSource.TOOL_FAILURE)
    res = mgr.resolve("g", a.txid)
    assert [s.txid for s in res.settled] == [b.txid]
    assert isinstance(res.decision, AbortPlan) and res.decision.source is AbortSource.TOOL_FAILURE


def test_a_loser_settled_by_resolve_wakes_what_waited_on_it() -> None:
    mgr = TransactionManager()
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    mgr.stage(a.txid, put(mgr, X, "ka"))
    later = mgr.begin()  # another group's later transaction on the same scope
    mgr.stage(later.txid, put(mgr, X, "kl"))
    mgr.seal(later.txid)
    wait = mgr.try_commit(later.txid)
    assert isinstance(wait, Wait) and {blk.txid for blk in wait.blockers} == {a.txid}
    res = mgr.resolve("g", b.txid)
    assert [s.txid for s in res.settled] == [a.txid] and res.woken == [later.txid]
    assert isinstance(res.decision, CommitPlan)
    mgr.finish(b.txid)
    assert isinstance(mgr.try_commit(later.txid), CommitPlan)


def test_resolving_an_aborted_member_keeps_the_winner_picked_before() -> None:
    """A rival's late resolve (its branch already aborted by the first resolve) must not
    make the picked winner, still waiting for an earlier transaction, lose."""
    mgr = TransactionManager()
    other = mgr.begin()
    mgr.stage(other.txid, put(mgr, X, "o"))
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    mgr.stage(a.txid, put(mgr, X, "ka"))
    first = mgr.resolve("g", a.txid)
    assert isinstance(first.decision, Wait) and b.finished  # b lost and is settled
    late = mgr.resolve("g", b.txid)  # the rival's resolve arrives late
    assert isinstance(late.decision, AbortPlan) and late.settled == late.compensate == []
    assert mgr.winner("g") == a.txid
    mgr.seal(other.txid)
    assert isinstance(mgr.try_commit(other.txid), CommitPlan)
    mgr.finish(other.txid)
    assert isinstance(mgr.try_commit(a.txid), CommitPlan)


def test_resolve_rejects_a_non_member() -> None:
    mgr = TransactionManager()
    a = mgr.begin(group="g")
    outsider = mgr.begin()
    with pytest.raises(UnknownTransaction):
        mgr.resolve("g", outsider.txid)
    with pytest.raises(UnknownTransaction):
        mgr.resolve("nope", a.txid)
    assert a.state is TxState.OPEN


def test_resolve_of_a_committed_winner_raises_and_changes_nothing() -> None:
    mgr = TransactionManager()
    a, _, _ = mgr.begin(group="g"), mgr.begin(group="g"), mgr.begin(group="g")
    res = mgr.resolve("g", a.txid)
    assert len(res.settled) == 2 and isinstance(res.decision, CommitPlan)
    late = mgr.begin(group="g")  # joined after the winner committed
    with pytest.raises(IllegalTransition):
        mgr.resolve("g", a.txid)
    assert late.state is TxState.OPEN  # it was not aborted behind the caller's back


def test_only_one_branch_of_a_group_commits() -> None:
    """Once a winner is picked, a branch that joins the group later loses at commit."""
    mgr = TransactionManager()
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    for tx in (a, b):
        mgr.stage(tx.txid, put(mgr, X, f"k{tx.txid}"))
        mgr.seal(tx.txid)
    res = mgr.resolve("g", b.txid)  # the later branch wins
    assert [s.txid for s in res.settled] == [a.txid] and isinstance(res.decision, CommitPlan)
    late = mgr.begin(group="g")
    mgr.seal(late.txid)
    assert kind(mgr.try_commit(late.txid)) == "abort:losing_speculation"
    mgr.finish(b.txid)
    c, d = mgr.begin(group="h"), mgr.begin(group="h")
    mgr.abort(c.txid, AbortSource.TOOL_FAILURE)
    mgr.seal(d.txid)
    assert isinstance(mgr.try_commit(d.txid), CommitPlan)  # no live sibling: it may commit


def test_forgotten_branches_do_not_break_the_group() -> None:
    mgr = TransactionManager()
    a, b, c = (mgr.begin(group="g") for _ in range(3))
    mgr.abort(a.txid, AbortSource.TOOL_FAILURE)
    mgr.finish(a.txid)
    mgr.forget(a.txid)
    res = mgr.resolve("g", b.txid, forget=True)
    assert [s.txid for s in res.settled] == [c.txid]
    assert isinstance(res.decision, CommitPlan)
    with pytest.raises(UnknownTransaction):
        mgr.get(c.txid)  # settled on the spot and forgotten
    settlement, _ = mgr.finish(b.txid)
    assert settlement.committed
    d = mgr.begin(group="g")  # the group name is free again
    assert isinstance(mgr.resolve("g", d.txid).decision, CommitPlan)


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


# --------------------------------------------------------------------------- ablations


def sc_disjoint(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, "kv:t:1", "a"))
    mgr.stage(t2.txid, put(mgr, "kv:u:1", "b"))
    return kind(commit(mgr, t2))


def sc_write_write(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    mgr.stage(t2.txid, put(mgr, X, "b"))
    return kind(commit(mgr, t2))


def sc_earlier_first(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t2.txid, put(mgr, X, "b"))
    mgr.stage(t1.txid, put(mgr, X, "a"))
    return kind(commit(mgr, t1))


def sc_stale_read(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, X, "a"))
    mgr.read(t2.txid, [X])
    settle(mgr, t1)
    return kind(commit(mgr, t2))


def sc_lost_update(mgr: TransactionManager) -> str:
    """Two read-modify-writes of one counter."""
    t1, t2 = mgr.begin(), mgr.begin()
    for tx in (t1, t2):
        mgr.read(tx.txid, [X])
    for tx in (t1, t2):
        mgr.stage(tx.txid, put(mgr, X, f"k{tx.txid}"))
        mgr.seal(tx.txid)
    out = [kind(mgr.try_commit(t2.txid)), kind(mgr.try_commit(t1.txid))]
    mgr.finish(t1.txid)
    if t2.state is TxState.WAITING:
        out.append(kind(mgr.try_commit(t2.txid)))
    return ",".join(out)


def sc_late_read(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t2.txid, put(mgr, X, "b"))
    decision = commit(mgr, t2)
    if not isinstance(decision, CommitPlan):
        return kind(decision)
    mgr.finish(t2.txid)
    return kind(mgr.read(t1.txid, [X]))


def sc_late_write(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.read(t2.txid, [X])
    decision = commit(mgr, t2)
    if not isinstance(decision, CommitPlan):
        return kind(decision)
    mgr.finish(t2.txid)
    return kind(mgr.stage(t1.txid, put(mgr, X, "a")))


def sc_alias(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.stage(t1.txid, put(mgr, "fs:/repo/./a", "a"))
    mgr.read(t2.txid, ["fs:/repo/a"])
    return kind(commit(mgr, t2))


def sc_externalize_waits(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    mgr.read(t1.txid, [X])
    return kind(mgr.externalize(t2.txid, [X]))


def sc_eager_read(mgr: TransactionManager) -> str:
    t1, t2 = mgr.begin(), mgr.begin()
    externalized(mgr, t1, X, "r")
    return kind(mgr.read(t2.txid, [X]))


def sc_residue(mgr: TransactionManager) -> str:
    tx = mgr.begin()
    effect = externalized(mgr, tx, X, "r")
    mgr.abort(tx.txid, AbortSource.TOOL_FAILURE)
    settlement, _ = mgr.finish(tx.txid, residue=[effect])
    return "residue" if settlement.residue == ("r",) else "none"


def sc_residue_stale(mgr: TransactionManager) -> str:
    early, late = mgr.begin(), mgr.begin()
    mgr.read(late.txid, [X])
    effect = externalized(mgr, early, X, "r")
    mgr.abort(early.txid, AbortSource.TOOL_FAILURE)
    mgr.finish(early.txid, residue=[effect])
    return kind(commit(mgr, late))


def sc_speculation(mgr: TransactionManager) -> str:
    other = mgr.begin()
    mgr.stage(other.txid, put(mgr, X, "o"))
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    for tx in (a, b):
        mgr.stage(tx.txid, put(mgr, X, f"k{tx.txid}"))
    res = mgr.resolve("g", b.txid)
    assert [s.txid for s in res.settled] == [a.txid]
    return kind(res.decision)


SCENARIOS: dict[str, Callable[[TransactionManager], str]] = {
    "disjoint": sc_disjoint,
    "write_write": sc_write_write,
    "earlier_first": sc_earlier_first,
    "stale_read": sc_stale_read,
    "lost_update": sc_lost_update,
    "late_read": sc_late_read,
    "late_write": sc_late_write,
    "alias": sc_alias,
    "externalize_waits": sc_externalize_waits,
    "eager_read": sc_eager_read,
    "residue": sc_residue,
    "residue_stale": sc_residue_stale,
    "speculation": sc_speculation,
}

DEFAULT_OUTCOMES = {
    "disjoint": "commit",
    "write_write": "wait",
    "earlier_first": "commit",
    "stale_read": "abort:stale_read",
    "lost_update": "wait,commit,abort:stale_read",
    "late_read": "abort:stale_read",
    "late_write": "abort:stale_read",
    "alias": "wait",
    "externalize_waits": "wait",
    "eager_read": "wait",
    "residue": "residue",
    "residue_stale": "abort:stale_read",
    "speculation": "wait",
}

OPTIONS = {
    "tx-full": RuntimeOptions(),
    "global-frontier": RuntimeOptions(frontier="global"),
    "no-wait": RuntimeOptions(wait_for_frontiers=False),
    "no-scope-on-read": RuntimeOptions(scope_on_read=False),
    "no-abort-on-stale": RuntimeOptions(abort_on_stale=False),
    "naive-scopes": RuntimeOptions(scopes=NAIVE),
    "no-residue-classification": RuntimeOptions(classify_residue=False),
}

# What each ablation changes, and nothing else.
CHANGES: dict[str, dict[str, str]] = {
    "tx-full": {},
    # one ordered lock: everyone waits for every earlier unsettled transaction
    "global-frontier": {"disjoint": "wait", "late_read": "wait", "late_write": "wait"},
    # no waiting for earlier holders: commit at seal, externalise at once (a stale read is
    # still caught once the write is visible)
    "no-wait": {
        "write_write": "commit",
        "lost_update": "commit,abort:stale_read",
        "alias": "commit",
        "speculation": "commit",
        "externalize_waits": "proceed",
    },
    # reads are not registered: no stale reads, no late reads, no waiting on a read
    "no-scope-on-read": {
        "stale_read": "commit",
        "lost_update": "wait,commit,commit",
        "late_read": "proceed",
        "late_write": "proceed",
        "alias": "commit",
        "externalize_waits": "proceed",
        "eager_read": "proceed",
        "residue_stale": "commit",
    },
    "no-abort-on-stale": {
        "stale_read": "commit",
        "lost_update": "wait,commit,commit",
        "late_read": "proceed",
        "late_write": "proceed",
        "residue_stale": "commit",
    },
    "naive-scopes": {"alias": "commit"},
    "no-residue-classification": {"residue": "none"},
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_each_ablation_changes_exactly_what_it_names(option: str, scenario: str) -> None:
    mgr = TransactionManager(OPTIONS[option])
    expected = CHANGES[option].get(scenario, DEFAULT_OUTCOMES[scenario])
    assert SCENARIOS[scenario](mgr) == expected


def test_global_frontier_makes_even_an_empty_transaction_wait() -> None:
    mgr = TransactionManager(RuntimeOptions(frontier="global"))
    t1, t2 = mgr.begin(), mgr.begin()
    wait = commit(mgr, t2)
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [t1.txid]
    mgr.abort(t1.txid, AbortSource.TIMEOUT)
    assert mgr.finish(t1.txid)[1] == [t2.txid]
    assert isinstance(mgr.try_commit(t2.txid), CommitPlan)


def test_naive_scopes_still_see_identical_texts() -> None:
    mgr = TransactionManager(RuntimeOptions(scopes=NAIVE))
    t1, t2 = mgr.begin(), mgr.begin()
    # the effect carries a canonical Scope object (as adapters build them); the naive policy
    # must still name it by its text
    effect = Effect("put", EffectClass.BUFFERABLE, (parse_scope("fs:/repo/a"),), "a")
    mgr.stage(t1.txid, effect)
    mgr.read(t2.txid, ["fs:/repo/a"])
    assert isinstance(commit(mgr, t2), Wait)
    assert mgr.scope("fs:/repo/./a") != mgr.scope("fs:/repo/a")
    assert isinstance(mgr.scope("fs:/repo/a"), Scope)


def test_no_scope_on_read_registers_nothing() -> None:
    mgr = TransactionManager(RuntimeOptions(scope_on_read=False))
    reader, writer = mgr.begin(), mgr.begin()
    assert isinstance(mgr.read(reader.txid, [X]), Proceed)
    assert reader.footprint() == set()  # its registrations follow from its footprint
    mgr.stage(writer.txid, put(mgr, X, "w"))
    assert isinstance(commit(mgr, writer), CommitPlan)  # the earlier reader is not waited for


# --------------------------------------------------------------------------- branches and compensations


def _siblings_on_x(
    mgr: TransactionManager, world: dict[str, object]
) -> tuple[Transaction, Transaction]:
    """Branch a runs a reversible effect on x; branch b buffers a write to x."""
    x = mgr.scope("kv:x")
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    assert isinstance(mgr.externalize(a.txid, [x]), Proceed)
    world["x"] = "a"
    mgr.stage(
        a.txid,
        Effect("book", EffectClass.REVERSIBLE, (x,), "ra", compensate=lambda: world.update(x=None)),
    )
    mgr.stage(
        b.txid, Effect("put", EffectClass.BUFFERABLE, (x,), "wb", apply=lambda: world.update(x="b"))
    )
    return a, b


def _b_wins(mgr: TransactionManager, a: Transaction, b: Transaction) -> tuple[AbortPlan, Wait]:
    res = mgr.resolve("g", b.txid)
    assert isinstance(res.decision, Wait) and res.settled == []
    assert [p.txid for p in res.compensate] == [a.txid]
    return res.compensate[0], res.decision


def _compensate_then_commit(
    mgr: TransactionManager, loser: AbortPlan, wait: Wait, world: dict[str, object]
) -> None:
    """The driver carries out the loser's plan; only then does the winner's commit go on."""
    for effect in loser.compensate:
        effect.compensate()
    _, woken = mgr.finish(loser.txid)
    assert woken == [wait.txid]
    plan = mgr.try_commit(wait.txid)
    assert isinstance(plan, CommitPlan)
    for effect in plan.apply:
        effect.apply()
    mgr.finish(wait.txid)
    assert world == {"x": "b"}


def test_the_winner_waits_for_a_losing_siblings_pending_compensation() -> None:
    # Were the winner's CommitPlan issued now, a driver that applied it before running the
    # loser's compensation would see the committed write rolled back to the before-image.
    mgr, world = TransactionManager(), {"x": None}
    loser, wait = _b_wins(mgr, *_siblings_on_x(mgr, world))
    assert [b.txid for b in wait.blockers] == [loser.txid]
    _compensate_then_commit(mgr, loser, wait, world)


def test_a_sibling_without_reversible_effects_does_not_hold_the_winner_back() -> None:
    mgr = TransactionManager()
    x = mgr.scope("kv:x")
    a, b = mgr.begin(group="g"), mgr.begin(group="g")
    mgr.stage(a.txid, Effect("put", EffectClass.BUFFERABLE, (x,), "wa", apply=lambda: None))
    mgr.stage(b.txid, Effect("put", EffectClass.BUFFERABLE, (x,), "wb", apply=lambda: None))
    assert isinstance(mgr.resolve("g", b.txid).decision, CommitPlan)


def test_a_branch_commits_only_through_resolve_while_a_sibling_is_live() -> None:
    mgr, world = TransactionManager(), {"x": None}
    a, b = _siblings_on_x(mgr, world)
    mgr.seal(b.txid)
    with pytest.raises(IllegalTransition, match="resolve"):
        mgr.try_commit(b.txid)  # a is live: committing b alone could be rolled back by a
    assert b.state is TxState.SEALED and a.state is TxState.OPEN
    loser, wait = _b_wins(mgr, a, b)  # the way a branch commits: a aborts first
    _compensate_then_commit(mgr, loser, wait, world)

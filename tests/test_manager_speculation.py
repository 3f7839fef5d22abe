"""Tests of atomix.manager.TransactionManager's speculation: sibling branches of a group, how
resolve settles the losers and commits the winner, and how a winner waits for a losing
sibling's pending compensations."""

from __future__ import annotations

import pytest
from manager_driver import TABLE, X, commit, externalized, kind, put, send

from atomix.decisions import AbortPlan, CommitPlan, Proceed, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import IllegalTransition, UnknownTransaction
from atomix.manager import TransactionManager
from atomix.transaction import Transaction, TxState

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

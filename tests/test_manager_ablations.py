"""Tests of atomix.manager.TransactionManager's ablations (RuntimeOptions): run on a fixed set
of scenarios, each option changes exactly the outcomes it names and nothing else."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from manager_driver import X, commit, externalized, kind, put, settle

from atomix.decisions import CommitPlan, Proceed, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.scope_parsing import NAIVE, parse_scope
from atomix.scopes import Scope
from atomix.transaction import TxState

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

"""Tests of atomix.manager.TransactionManager's ablations (RuntimeOptions): run on a fixed set
of scenarios, each option changes exactly the outcomes it names and nothing else."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from manager_driver import X, book, commit, externalized, kind, put, send, settle

from atomix.decisions import CommitPlan, Proceed, Settlement, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import IllegalTransition
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.runtime import Runtime
from atomix.scope_parsing import NAIVE, parse_scope
from atomix.scopes import Scope
from atomix.session import Coordinator
from atomix.transaction import Transaction, TxState

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


M = "mail:a@example.com"


def _fate(settlement: Settlement, key: str) -> str:
    """Which list of the settlement holds `key` (what became of the effect)."""
    for name in ("applied", "released", "accepted", "compensated", "dropped", "residue"):
        if key in getattr(settlement, name):
            return name
    return "unreported"


def _send_in(mgr: TransactionManager, tx: Transaction, key: str) -> None:
    """Queue (or, where the core says it runs when called, externalise and stage) a send, as
    a shim does."""
    effect = send(mgr, M, key)
    if mgr.runs_at_call(effect.effect_class):
        assert isinstance(mgr.externalize(tx.txid, [M]), Proceed)
    assert isinstance(mgr.stage(tx.txid, effect), Proceed)


def sc_send_commit(mgr: TransactionManager) -> str:
    tx = mgr.begin()
    _send_in(mgr, tx, "m")
    plan = commit(mgr, tx)
    assert isinstance(plan, CommitPlan)
    where = "release" if plan.release else "accept" if plan.accept else "none"
    return f"{where}:{_fate(mgr.finish(tx.txid)[0], 'm')}"


def sc_send_abort(mgr: TransactionManager) -> str:
    tx = mgr.begin()
    _send_in(mgr, tx, "m")
    plan = mgr.abort(tx.txid, AbortSource.PRE_COMMIT_VETO)
    where = "drop" if plan.drop else "compensate" if plan.compensate else "leave"
    return f"{where}:{_fate(mgr.finish(tx.txid)[0], 'm')}"


def sc_compensate(mgr: TransactionManager) -> str:
    tx = mgr.begin()
    externalized(mgr, tx, X, "r")
    plan = mgr.abort(tx.txid, AbortSource.TOOL_FAILURE)
    where = "compensate" if plan.compensate else "drop" if plan.drop else "leave"
    return f"{where}:{_fate(mgr.finish(tx.txid)[0], 'r')}"  # (every compensation succeeded)


def sc_after_seal(mgr: TransactionManager) -> str:
    tx = mgr.begin()
    mgr.stage(tx.txid, put(mgr, X, "a"))
    mgr.seal(tx.txid)
    return kind(mgr.stage(tx.txid, put(mgr, "kv:u:1", "b")))


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
    "send_commit": sc_send_commit,
    "send_abort": sc_send_abort,
    "compensate": sc_compensate,
    "after_seal": sc_after_seal,
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
    "send_commit": "release:released",
    "send_abort": "drop:dropped",
    "compensate": "compensate:compensated",
    "after_seal": "abort:seal_violation",
}

OPTIONS = {
    "tx-full": RuntimeOptions(),
    "global-frontier": RuntimeOptions(frontier="global"),
    "no-wait": RuntimeOptions(wait_for_frontiers=False),
    "no-scope-on-read": RuntimeOptions(scope_on_read=False),
    "no-abort-on-stale": RuntimeOptions(abort_on_stale=False),
    "naive-scopes": RuntimeOptions(scopes=NAIVE),
    "no-residue-classification": RuntimeOptions(classify_residue=False),
    "no-read-checks": RuntimeOptions(scope_on_read=False, abort_on_stale=False),
    "no-gate": RuntimeOptions(gate_irreversible=False),
    "unkeyed": RuntimeOptions(keyed_delivery=False),
    "no-compensation": RuntimeOptions(compensate_on_abort=False),
    "no-seal": RuntimeOptions(enforce_seal=False),
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
    # both read components at once: what either changes
    "no-read-checks": {
        "stale_read": "commit",
        "lost_update": "wait,commit,commit",
        "late_read": "proceed",
        "late_write": "proceed",
        "alias": "commit",
        "externalize_waits": "proceed",
        "eager_read": "proceed",
        "residue_stale": "commit",
    },
    # a send runs when called: final at commit (not released again), left behind at abort
    "no-gate": {"send_commit": "accept:accepted", "send_abort": "leave:residue"},
    # keys reach substrates through the session (`TxSession.delivery_key`): no core decision
    "unkeyed": {},
    "no-compensation": {"compensate": "leave:residue"},
    "no-seal": {"after_seal": "proceed"},
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


def test_an_ungated_send_must_be_externalised_like_any_call_that_runs_when_made() -> None:
    mgr = TransactionManager(RuntimeOptions(gate_irreversible=False))
    assert mgr.runs_at_call(EffectClass.IRREVERSIBLE) and mgr.runs_at_call(EffectClass.REVERSIBLE)
    assert not mgr.runs_at_call(EffectClass.BUFFERABLE) and not mgr.runs_at_call(None)
    assert not TransactionManager().runs_at_call(EffectClass.IRREVERSIBLE)
    tx = mgr.begin()
    with pytest.raises(ValueError, match="staged without externalize"):
        mgr.stage(tx.txid, send(mgr, M, "m"))


def test_an_ungated_send_is_ordered_as_an_eager_effect() -> None:
    """Without the gate a send has reached the sink once it is staged, so an earlier epoch
    arriving on that scope afterwards is stale (as behind a reversible effect); gated, the
    earlier one just queues its send and commits first."""
    outcomes = {}
    for name, options in (("gated", RuntimeOptions()), ("ungated", RuntimeOptions(gate_irreversible=False))):
        mgr = TransactionManager(options)
        early, late = mgr.begin(), mgr.begin()
        _send_in(mgr, late, "late")
        effect = send(mgr, M, "early")
        decision = (
            mgr.externalize(early.txid, [M]) if mgr.runs_at_call(effect.effect_class)
            else mgr.stage(early.txid, effect)
        )
        outcomes[name] = kind(decision)
    assert outcomes == {"gated": "proceed", "ungated": "abort:stale_read"}


def test_a_savepoint_rollback_keeps_an_ungated_send_it_cannot_undo() -> None:
    mgr = TransactionManager(RuntimeOptions(gate_irreversible=False))
    tx = mgr.begin()
    mark = mgr.savepoint(tx.txid)
    _send_in(mgr, tx, "m")
    plan = mgr.rollback_to(tx.txid, mark)
    assert plan.drop == () and plan.compensate == ()
    assert list(tx.staged) == ["m"]  # still the transaction's: accepted at its commit
    assert isinstance(commit(mgr, tx), CommitPlan)
    assert mgr.finish(tx.txid)[0].accepted == ("m",)


def test_without_compensation_an_abort_leaves_effects_as_residue_readers_must_heed() -> None:
    """The uncompensated effect is residue: reported, and a reader of its scope is stale."""
    mgr = TransactionManager(RuntimeOptions(compensate_on_abort=False))
    early, late = mgr.begin(), mgr.begin()
    mgr.read(late.txid, [X])
    log: list[str] = []
    assert isinstance(mgr.externalize(early.txid, [X]), Proceed)
    mgr.stage(early.txid, book(mgr, X, "r", log))
    plan = mgr.abort(early.txid, AbortSource.TOOL_FAILURE)
    assert plan.compensate == ()
    settlement, _ = mgr.finish(early.txid)
    assert settlement.residue == ("r",) and settlement.compensated == () and log == []
    assert kind(commit(mgr, late)) == "abort:stale_read"


def test_classification_is_its_own_component_even_without_compensation() -> None:
    mgr = TransactionManager(RuntimeOptions(compensate_on_abort=False, classify_residue=False))
    assert sc_compensate(mgr) == "leave:unreported"


def test_without_the_seal_a_late_access_grows_the_footprint_commit_decides_on() -> None:
    """Admitted after seal, a write to a scope an earlier transaction holds makes the commit
    wait for it, as it would have had the write come before seal."""
    y = "kv:u:1"
    mgr = TransactionManager(RuntimeOptions(enforce_seal=False))
    holder, tx = mgr.begin(), mgr.begin()
    mgr.stage(holder.txid, put(mgr, y, "h"))
    mgr.stage(tx.txid, put(mgr, X, "a"))
    mgr.seal(tx.txid)
    assert kind(mgr.stage(tx.txid, put(mgr, y, "b"))) == "proceed"
    assert tx.state is TxState.SEALED
    wait = mgr.try_commit(tx.txid)
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [holder.txid]
    settle(mgr, holder)
    plan = mgr.try_commit(tx.txid)
    assert isinstance(plan, CommitPlan) and [e.key for e in plan.apply] == ["a", "b"]
    mgr.finish(tx.txid)
    with pytest.raises(IllegalTransition):  # after commit, still an illegal step
        mgr.stage(tx.txid, put(mgr, y, "c"))


def test_delivery_keys_are_the_effects_own_unless_delivery_is_unkeyed() -> None:
    for keyed in (True, False):
        co = Coordinator(RuntimeOptions(keyed_delivery=keyed), run_id="")
        tx = co.begin(trace="t")
        key = tx.key("send", "x")
        assert tx.delivery_key(key) == (key if keyed else None)


@pytest.mark.parametrize("switch", ["gate_irreversible", "keyed_delivery"])
def test_runtime_refuses_the_delivery_ablations_its_shims_would_ignore(switch: str) -> None:
    with pytest.raises(ValueError, match=switch):
        Runtime(RuntimeOptions(**{switch: False}))
    Runtime(RuntimeOptions(compensate_on_abort=False, enforce_seal=False))  # core-only: fine

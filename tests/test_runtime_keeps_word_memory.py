"""Memory follows the live work, not the work ever done: the settlement history is capped by
default, and the scopes settled work left are reclaimed once they can no longer change a
decision. Behavioural checks only (counts, decisions); RSS is measured by
`python -m harness.bench.memory`, never asserted here."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atomix import Runtime
from atomix.decisions import AbortPlan, CommitPlan, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import TransactionAborted
from atomix.manager import TransactionManager


def _mailer(rt: Runtime) -> Any:
    @rt.tool(effect="irreversible", writes="mail:{to}", key="{to}")
    def send(to: str, text: str) -> None:
        pass

    return send


def test_the_settlement_history_is_capped_by_default() -> None:
    """It kept every settlement (tens of MB per 100,000 transactions)."""
    rt = Runtime()
    send = _mailer(rt)
    for i in range(3000):
        with rt.transaction() as tx:
            send(f"u{i}@example.org", "hi")
    assert 1000 <= len(rt.settlements) <= 1100
    assert rt.settlements[-1] is tx.settlement
    everything = Runtime(keep_settlements=True)
    send = _mailer(everything)
    for i in range(1500):
        send(f"u{i}@example.org", "hi")
    assert len(everything.settlements) == 1500
    with pytest.raises(ValueError, match="keep_settlements"):
        Runtime(keep_settlements=-1)


def test_scopes_of_settled_work_are_reclaimed() -> None:
    """Every distinct scope ever touched used to be kept for ever."""
    rt = Runtime(keep_settlements=False)
    send = _mailer(rt)
    every = rt.core.reclaim_every
    high = 0
    for i in range(5 * every):
        with rt.transaction():
            send(f"a{i}@example.org", "hi")
            send(f"b{i}@example.org", "hi")
        high = max(high, rt.core.tracked_scopes())
    # Two new scopes per transaction, each a node in two indices (plus the kind's node):
    # without reclamation that is 20 * every nodes by now.
    assert high <= 3 * every
    assert rt.core.tracked_scopes() <= 3 * every


def test_an_older_unfinished_transaction_keeps_what_can_still_judge_it() -> None:
    """A stamp is kept while a transaction that began before it is unfinished: the old
    transaction still aborts as late on a scope a later one committed, however much work
    settled meanwhile; once it has finished, that work's scopes go."""
    rt = Runtime(keep_settlements=False, timeout=5.0)
    rt.core.reclaim_every = 1  # reclaim at every settle
    store: dict[str, int] = {}

    @rt.tool(effect="bufferable", writes="kv:{k}")
    def put(k: str, v: int) -> None:
        store[k] = v

    old = rt.transaction()
    for i in range(200):
        put(f"k{i}", i)  # each its own committed transaction, later than `old`
    kept = rt.core.tracked_scopes()
    assert kept >= 200  # judged still: `old` began before every one of them
    with old.active(), pytest.raises(TransactionAborted) as info:
        put("k7", -1)
    assert info.value.source == AbortSource.STALE_READ and "late access" in info.value.detail
    put("fresh", 1)  # a settle after `old` finished: now everything settled can go
    assert rt.core.tracked_scopes() < 10
    assert store["k7"] == 7


# ------------------------------------------------------------ decisions with and without
SCOPES = ("kv:t", "kv:t:1", "kv:t:2", "kv:u:1", "mail:a", "mail:b")
OPS = ("begin", "read", "put", "book", "commit", "abort")


def _effect(cls: EffectClass, scope: str, key: str) -> Effect:
    return Effect(key.split(":")[0], cls, (scope,), key, apply=lambda: None, compensate=lambda: None)


def _outcome(decision: object) -> tuple[Any, ...]:
    if isinstance(decision, Wait):
        return ("wait", decision.blockers)
    if isinstance(decision, AbortPlan):
        return ("abort", decision.source, decision.detail, tuple(e.key for e in decision.compensate))
    if isinstance(decision, CommitPlan):
        return ("commit", tuple(e.key for e in (*decision.apply, *decision.release, *decision.accept)))
    return (type(decision).__name__,)


class _Lockstep:
    """Two managers fed the same events: one reclaims at every settle, one never."""

    def __init__(self) -> None:
        self.managers = (TransactionManager(), TransactionManager())
        self.managers[0].reclaim_every = 1
        self.managers[1].reclaim_every = 0
        self.live: list[int] = []
        self.fresh = 0
        self.n = 0

    def both(self, event: str, *args: Any) -> tuple[Any, ...]:
        outs = []
        for mgr in self.managers:
            try:
                outs.append(_outcome(getattr(mgr, event)(*args)))
            except Exception as exc:  # noqa: BLE001 - the same error from both, or a bug
                outs.append(("raised", type(exc).__name__, str(exc)))
        assert outs[0] == outs[1], (event, args, outs)
        return outs[0]

    def settle(self, txid: int, outcome: tuple[Any, ...], residue: bool) -> None:
        if outcome[0] not in ("commit", "abort"):
            return
        settlements = []
        for mgr in self.managers:
            tx = mgr.get(txid)
            left = [e for e in tx.staged.values() if e.effect_class is EffectClass.REVERSIBLE]
            settlement, woken = mgr.finish(
                txid, residue=left[:1] if residue and outcome[0] == "abort" else (), forget=True
            )
            settlements.append((settlement.outcome, settlement.abort_source, woken))
        assert settlements[0] == settlements[1]
        self.live.remove(txid)

    def scope(self, pick: int) -> str:
        if pick < len(SCOPES):
            return SCOPES[pick]
        self.fresh += 1
        return f"kv:n:{self.fresh}"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.integers(0, 9), st.booleans()), max_size=80))
def test_reclamation_never_changes_a_decision(steps: list[tuple[str, int, int, bool]]) -> None:
    run = _Lockstep()
    for op, which, pick, flag in steps:
        if op == "begin" or not run.live:
            if len(run.live) < 5:
                txid = run.managers[0].begin().txid
                assert run.managers[1].begin().txid == txid
                run.live.append(txid)
            continue
        txid = run.live[which % len(run.live)]
        states = {mgr.get(txid).state.value for mgr in run.managers}
        assert len(states) == 1
        state = states.pop()
        run.n += 1
        scope = run.scope(pick)
        if op == "read":
            outcome = run.both("read", txid, [scope])
        elif op == "put":
            outcome = run.both("stage", txid, _effect(EffectClass.BUFFERABLE, scope, f"put:{run.n}"))
        elif op == "book":
            outcome = run.both("externalize", txid, [scope])
            if outcome[0] == "Proceed":
                outcome = run.both("stage", txid, _effect(EffectClass.REVERSIBLE, scope, f"book:{run.n}"))
        elif op == "commit":
            if state == "open":
                run.both("seal", txid)
            if state in ("committed", "aborted"):
                continue
            outcome = run.both("try_commit", txid)
        else:
            if state in ("committed", "aborted"):
                continue
            outcome = run.both("abort", txid, AbortSource.TOOL_FAILURE, "test")
        run.settle(txid, outcome, flag)

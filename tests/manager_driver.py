"""Driving a TransactionManager by hand, as the test_manager_*.py files do: an effect of each
class on a scope, a commit that seals first, a settle that must go through, and a decision's
kind as text. Scope X is a row of the table TABLE."""

from __future__ import annotations

from atomix.decisions import AbortPlan, CommitPlan, Proceed, Wait
from atomix.effects import Effect, EffectClass
from atomix.manager import TransactionManager
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

"""Tests of atomix.transaction: the lifecycle table, and the manager's use of it."""

from __future__ import annotations

import copy
import itertools

import pytest

from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import IllegalTransition
from atomix.manager import TransactionManager
from atomix.scope_parsing import parse_scope
from atomix.transaction import TERMINAL, TRANSITIONS, Transaction, TxEvent, TxState, next_state

ALL_PAIRS = list(itertools.product(TxState, TxEvent))
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]
LEGAL = sorted(TRANSITIONS.items())


def _id(pair: tuple[TxState, TxEvent]) -> str:
    return f"{pair[0].value}-{pair[1].value}"


def test_the_table_is_the_documented_lifecycle() -> None:
    # open -> sealed -> waiting -> committed | aborted, abort from any live state.
    assert TRANSITIONS == {
        (TxState.OPEN, TxEvent.SEAL): TxState.SEALED,
        (TxState.OPEN, TxEvent.ABORT): TxState.ABORTED,
        (TxState.SEALED, TxEvent.WAIT): TxState.WAITING,
        (TxState.SEALED, TxEvent.COMMIT): TxState.COMMITTED,
        (TxState.SEALED, TxEvent.ABORT): TxState.ABORTED,
        (TxState.WAITING, TxEvent.WAIT): TxState.WAITING,
        (TxState.WAITING, TxEvent.COMMIT): TxState.COMMITTED,
        (TxState.WAITING, TxEvent.ABORT): TxState.ABORTED,
    }
    assert TERMINAL == {TxState.COMMITTED, TxState.ABORTED}
    assert len(ILLEGAL) == 12


def test_no_transition_leaves_a_terminal_state() -> None:
    assert not [pair for pair in TRANSITIONS if pair[0] in TERMINAL]


def test_every_live_state_can_abort_and_only_sealed_or_waiting_commit() -> None:
    for state in set(TxState) - TERMINAL:
        assert TRANSITIONS[(state, TxEvent.ABORT)] is TxState.ABORTED
    assert {s for (s, e) in TRANSITIONS if e is TxEvent.COMMIT} == {TxState.SEALED, TxState.WAITING}


@pytest.mark.parametrize(("pair", "target"), LEGAL, ids=[_id(p) for p, _ in LEGAL])
def test_legal_transitions(pair: tuple[TxState, TxEvent], target: TxState) -> None:
    assert next_state(7, *pair) is target


@pytest.mark.parametrize("pair", ILLEGAL, ids=[_id(p) for p in ILLEGAL])
def test_next_state_rejects_every_pair_not_in_the_table(pair: tuple[TxState, TxEvent]) -> None:
    state, event = pair
    with pytest.raises(IllegalTransition) as info:
        next_state(7, state, event)
    err = info.value
    assert (err.txid, err.state, err.event) == (7, state.value, event.value)
    assert state.value in str(err) and event.value in str(err)


# --------------------------------------------------------------------------- via the manager

X = parse_scope("kv:t:1")


def _write(key: str) -> Effect:
    return Effect("put", EffectClass.BUFFERABLE, (X,), key, apply=lambda: None)


def _tx_in(state: TxState) -> tuple[TransactionManager, Transaction]:
    """A manager holding a transaction in `state`, reached through the manager's own events."""
    mgr = TransactionManager()
    if state is TxState.WAITING:
        holder = mgr.begin()
        mgr.stage(holder.txid, _write("h"))
    tx = mgr.begin()
    mgr.stage(tx.txid, _write("w"))
    if state is TxState.OPEN:
        return mgr, tx
    mgr.seal(tx.txid)
    if state is TxState.SEALED:
        pass
    elif state is TxState.WAITING:
        mgr.try_commit(tx.txid)
    elif state is TxState.COMMITTED:
        mgr.try_commit(tx.txid)
    elif state is TxState.ABORTED:
        mgr.abort(tx.txid, AbortSource.PRE_COMMIT_VETO, "veto")
    assert tx.state is state
    return mgr, tx


def _snapshot(tx: Transaction) -> dict[str, object]:
    return {
        name: copy.copy(getattr(tx, name))
        for name in (
            "state", "reads", "effect_scopes", "eager_scopes", "staged",
            "abort_source", "abort_detail", "finished",
        )
    }


def _fire(mgr: TransactionManager, tx: Transaction, event: TxEvent) -> None:
    if event is TxEvent.SEAL:
        mgr.seal(tx.txid)
    elif event in (TxEvent.WAIT, TxEvent.COMMIT):
        mgr.try_commit(tx.txid)  # the manager's only way to wait or commit
    else:
        mgr.abort(tx.txid, AbortSource.TIMEOUT, "late")


@pytest.mark.parametrize("pair", ILLEGAL, ids=[_id(p) for p in ILLEGAL])
def test_manager_raises_and_changes_nothing_on_an_illegal_event(
    pair: tuple[TxState, TxEvent],
) -> None:
    state, event = pair
    mgr, tx = _tx_in(state)
    before = _snapshot(tx)
    frontier_before = mgr.frontier(X)
    with pytest.raises(IllegalTransition) as info:
        _fire(mgr, tx, event)
    assert info.value.txid == tx.txid
    assert info.value.state == state.value
    assert _snapshot(tx) == before
    assert mgr.frontier(X) == frontier_before


@pytest.mark.parametrize("state", [TxState.COMMITTED, TxState.ABORTED])
def test_accesses_after_settling_raise_and_change_nothing(state: TxState) -> None:
    mgr, tx = _tx_in(state)
    before = _snapshot(tx)
    for call in (
        lambda: mgr.read(tx.txid, ["kv:u:1"]),
        lambda: mgr.externalize(tx.txid, ["kv:u:1"]),
        lambda: mgr.stage(tx.txid, _write("late")),
    ):
        with pytest.raises(IllegalTransition):
            call()
        assert _snapshot(tx) == before


@pytest.mark.parametrize("state", [TxState.OPEN, TxState.SEALED, TxState.WAITING])
def test_finish_before_settling_raises_and_changes_nothing(state: TxState) -> None:
    mgr, tx = _tx_in(state)
    before = _snapshot(tx)
    with pytest.raises(IllegalTransition):
        mgr.finish(tx.txid)
    assert _snapshot(tx) == before


def test_finish_twice_raises() -> None:
    mgr, tx = _tx_in(TxState.ABORTED)
    mgr.finish(tx.txid)
    with pytest.raises(IllegalTransition):
        mgr.finish(tx.txid)


def test_forget_only_a_finished_transaction() -> None:
    mgr, tx = _tx_in(TxState.COMMITTED)
    with pytest.raises(IllegalTransition):
        mgr.forget(tx.txid)
    mgr.finish(tx.txid)
    mgr.forget(tx.txid)
    with pytest.raises(KeyError):
        mgr.get(tx.txid)


def test_an_invalid_abort_source_changes_nothing() -> None:
    mgr, tx = _tx_in(TxState.OPEN)
    before = _snapshot(tx)
    with pytest.raises(ValueError):
        mgr.abort(tx.txid, "not-a-source")
    assert _snapshot(tx) == before
    # ... and the transaction can still be aborted properly, with a plan.
    plan = mgr.abort(tx.txid, AbortSource.TOOL_FAILURE)
    assert plan.source is AbortSource.TOOL_FAILURE
    assert tx.state is TxState.ABORTED


def test_footprint_is_reads_and_effect_scopes() -> None:
    mgr = TransactionManager()
    tx = mgr.begin()
    mgr.read(tx.txid, ["kv:u:1"])
    mgr.stage(tx.txid, _write("w"))
    assert tx.footprint() == {parse_scope("kv:u:1"), X}
    assert set(tx.reads) == {parse_scope("kv:u:1")}
    assert tx.effect_scopes == {X}

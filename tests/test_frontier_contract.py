"""The frontier-contract negative control (paper Table 18): the faulty-frontier modes and the
one-resource append workload, on real trials (real log file, real op log)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from atomix.decisions import CommitPlan, Wait
from atomix.effects import Effect, EffectClass
from atomix.manager import RuntimeOptions, TransactionManager
from harness.experiment.trial import TrialSpec, run_trial
from harness.modes.registry import get_mode
from harness.modes.tx_frontier_fault import install_frontier_fault
from harness.workloads.frontier_contract import FrontierContractParams, inverted_pairs


def trial(mode: str, *, agents: int = 2, index: int = 0, seed: int = 18) -> dict[str, Any]:
    spec = TrialSpec("t18", "frontier_contract", mode, "c", {}, index, seed,
                     params={"agents": agents})
    return run_trial(spec)


def test_a_correct_frontier_orders_the_log_by_epoch_and_the_later_agent_waits() -> None:
    record = trial("tx-full", agents=3)
    m = record["metrics"]
    assert record["final"]["log"] == ["a0", "a1", "a2"]
    assert (m["out_of_order"], m["invariant_violations"], m["frontier_blocked"]) == (False, 0, False)
    assert m["waited"] and m["committed"] == 3


def test_a_premature_frontier_lets_later_epochs_commit_first() -> None:
    record = trial("tx-frontier-premature", agents=3)
    m = record["metrics"]
    assert record["final"]["log"] == ["a2", "a1", "a0"]
    assert m["out_of_order"] and m["out_of_order_pairs"] == 3
    assert m["invariant_violations"] == 3
    assert not m["waited"] and not m["frontier_blocked"] and m["committed"] == 3


def test_a_stalled_frontier_blocks_the_later_agent_until_its_deadline() -> None:
    record = trial("tx-frontier-stalled")
    m = record["metrics"]
    assert record["final"]["log"] == ["a0"]
    assert m["frontier_blocked"] and m["committed"] == 1 and m["stuck"] == 0
    assert (m["out_of_order"], m["invariant_violations"]) == (False, 0)
    later = next(a for a in record["agents"] if a["agent"] == "a1")
    assert not later["committed"] and set(later["aborts"]) == {"timeout"}


def test_records_are_the_same_for_the_same_seed() -> None:
    one, two = trial("tx-frontier-premature", index=3), trial("tx-frontier-premature", index=3)
    assert one["metrics"] == two["metrics"] and one["final"] == two["final"]


def test_the_faulty_modes_are_registered_as_negative_controls() -> None:
    for name in ("tx-frontier-premature", "tx-frontier-stalled"):
        assert get_mode(name).family == "negative-control"


def _effect(tx_epoch: int) -> Effect:
    return Effect("append", EffectClass.BUFFERABLE, ("fs:/log",), f"k{tx_epoch}")


def test_the_premature_index_lets_a_later_epoch_commit_while_an_earlier_is_open() -> None:
    core = TransactionManager()
    install_frontier_fault(core, "premature")
    first, second = core.begin(), core.begin()
    core.stage(first.txid, _effect(first.epoch))
    core.stage(second.txid, _effect(second.epoch))
    core.seal(second.txid)
    assert isinstance(core.try_commit(second.txid), CommitPlan)
    honest = TransactionManager()
    first, second = honest.begin(), honest.begin()
    honest.stage(first.txid, _effect(first.epoch))
    honest.stage(second.txid, _effect(second.epoch))
    honest.seal(second.txid)
    assert isinstance(honest.try_commit(second.txid), Wait)


def test_the_stalled_index_keeps_a_later_epoch_waiting_after_the_earlier_settled() -> None:
    core = TransactionManager()
    install_frontier_fault(core, "stalled")
    first, second = core.begin(), core.begin()
    core.stage(first.txid, _effect(first.epoch))
    core.stage(second.txid, _effect(second.epoch))
    core.seal(first.txid)
    assert isinstance(core.try_commit(first.txid), CommitPlan)
    core.finish(first.txid)
    core.seal(second.txid)
    decision = core.try_commit(second.txid)
    assert isinstance(decision, Wait) and [b.txid for b in decision.blockers] == [first.txid]


def test_installing_refuses_a_used_or_global_manager_and_an_unknown_fault() -> None:
    used = TransactionManager()
    used.begin()
    with pytest.raises(RuntimeError, match="fresh per-resource"):
        install_frontier_fault(used, "stalled")
    with pytest.raises(RuntimeError, match="fresh per-resource"):
        install_frontier_fault(TransactionManager(RuntimeOptions(frontier="global")), "premature")
    with pytest.raises(ValueError, match="allowed: premature, stalled"):
        install_frontier_fault(TransactionManager(), "late")  # type: ignore[arg-type]
    twice = TransactionManager()
    install_frontier_fault(twice, "premature")
    with pytest.raises(RuntimeError, match="_order"):
        install_frontier_fault(twice, "stalled")


def test_bad_params_are_refused_with_the_key_named() -> None:
    with pytest.raises(ValidationError, match="agents"):
        FrontierContractParams.model_validate({"agents": 1})
    with pytest.raises(ValidationError, match="plan_delay_ms"):
        FrontierContractParams.model_validate({"plan_delay_ms": [30.0, 10.0]})


def test_inverted_pairs_counts_pairs_out_of_order() -> None:
    assert inverted_pairs([1, 2, 3]) == 0
    assert inverted_pairs([3, 2, 1]) == 3
    assert inverted_pairs([2, 1, 3]) == 1

"""tau2 retail under the harness: goal DBs without faults, honest contention numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.experiment.config import ConfigError, load_config
from harness.experiment.trial import TrialSpec, run_trial
from harness.modes.registry import modes
from harness.workloads.retail import goal_db, load_retail
from harness.workloads.retail.workload import TauRetailWorkload

ROOT = Path(__file__).resolve().parents[1]
ALL_MODES = sorted(modes())


def _spec(mode: str, trial: int, **params: object) -> TrialSpec:
    return TrialSpec("tau", "tau_retail", mode, "fp=0", {}, trial, 1, params=params)


def test_without_faults_every_task_reaches_its_goal_db_under_tx_full_and_no_tx() -> None:
    data = load_retail()
    tasks = TauRetailWorkload().tasks({"split": "base", "sample": "all"})
    assert len(tasks) == 114
    for mode in ("tx-full", "no-tx"):
        for trial, task in enumerate(tasks):
            goal = goal_db(data, task)
            record = run_trial(_spec(mode, trial, split="base", sample="all"))
            assert record["final"]["db_sha256"] == goal.sha256, (mode, task["id"])
            assert record["metrics"]["clean"], (mode, task["id"], record["metrics"])


@pytest.mark.parametrize("mode", ALL_MODES)
def test_without_faults_every_mode_reaches_the_goal_on_the_test_split(mode: str) -> None:
    for trial in range(40):
        record = run_trial(_spec(mode, trial, split="test", sample="all"))
        assert record["metrics"]["goal"], (mode, trial, record["agents"])
        assert record["metrics"]["clean"], (mode, trial, record["metrics"])


def test_the_record_carries_the_final_db_hash_and_faults_change_outcomes() -> None:
    from harness.world.faults import FaultConfig

    record = run_trial(_spec("tx-full", 0))
    assert len(record["final"]["db_sha256"]) == 64
    faulted = [
        run_trial(TrialSpec("tau", "tau_retail", "no-tx", "fp=0.5", {}, t, 1, faults=FaultConfig(rate=0.5)))
        for t in range(30)
    ]
    assert sum(len(r["faults"]) for r in faulted) > 30
    assert not all(r["metrics"]["clean"] for r in faulted)


def test_contention_tx_full_keeps_invariants_where_no_tx_loses_updates() -> None:
    totals = {}
    for mode in ("tx-full", "no-tx", "tx-no-abort-on-stale"):
        violations = serial = 0
        for trial in range(15):
            params = {"agents": 8, "contended": 2, "plan_delay_ms": [20, 120]}
            record = run_trial(TrialSpec("c", "tau_contention", mode, "n=8", {}, trial, 4, params=params))
            violations += record["metrics"]["invariant_violations"]
            serial += record["metrics"]["serialisable"]
            assert record["metrics"]["committed"] == 8 or mode == "tx-full"
        totals[mode] = (violations, serial)
    assert totals["tx-full"] == (0, 15)
    assert totals["no-tx"][0] > 0
    assert totals["tx-no-abort-on-stale"][0] > 0


def test_disjoint_orders_never_wait_under_tx_full() -> None:
    params = {"agents": 16, "disjoint": True}
    full = run_trial(TrialSpec("d", "tau_contention", "tx-full", "n=16", {}, 0, 2, params=params))
    glob = run_trial(TrialSpec("d", "tau_contention", "tx-global-frontier", "n=16", {}, 0, 2, params=params))
    assert full["metrics"]["wait_ms"] == 0.0
    assert glob["metrics"]["wait_ms"] > 0.0
    assert full["metrics"]["invariant_violations"] == glob["metrics"]["invariant_violations"] == 0


def test_missing_or_malformed_data_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    config = tmp_path / "tau.yaml"
    config.write_text(json.dumps({"workload": "tau_retail", "trials": 1, "modes": ["tx-full"],
                                  "params": {"data_dir": str(tmp_path / "nope")}}))
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert "params.data_dir" in str(err.value) and str(tmp_path / "nope") in str(err.value)
    bad = tmp_path / "retail"
    bad.mkdir()
    for name in ("db.json", "tasks.json", "split_tasks.json"):
        (bad / name).write_text("{not json")
    config.write_text(json.dumps({"workload": "tau_retail", "trials": 1, "modes": ["tx-full"],
                                  "params": {"data_dir": str(bad)}}))
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert str(bad) in str(err.value)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")))
def test_every_shipped_config_validates(path: Path) -> None:
    load_config(path)

"""The granularity workload (paper Table 13): throughput in transactions per step as the
shared fraction of each transaction's scopes grows, and what the unsafe mode pays for it."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from harness.experiment.config import load_config
from harness.experiment.trial import TrialSpec, run_trial
from harness.workloads.granularity import INITIAL, TABLE, GranularityParams, rows_of, torn_writes
from harness.world.substrates import TrialEnv

CONFIG = "configs/granularity.yaml"
LATENCY = 5.0
NO_THINK = [0.0, 0.0]


def _run(mode: str, trial: int = 0, **params: Any) -> dict[str, Any]:
    spec = TrialSpec("gran", "granularity", mode, "c", {}, trial, 13, params=params,
                     latency_ms=LATENCY, jitter_ms=0.0)
    return run_trial(spec)


@pytest.mark.parametrize("mode", ["tx-full", "tx-global-frontier", "workflow-lock", "no-tx"])
@pytest.mark.parametrize(("access", "calls"), [("write", 4), ("read_modify_write", 8)])
def test_a_step_is_one_transactions_calls_back_to_back(mode: str, access: str, calls: int) -> None:
    m = _run(mode, access=access, plan_delay_ms=NO_THINK)["metrics"]
    assert m["step_ms"] == calls * LATENCY
    assert m["committed"] == 8


@pytest.mark.parametrize("mode", ["tx-full", "workflow-lock", "no-tx"])
def test_disjoint_transactions_all_run_at_once(mode: str) -> None:
    m = _run(mode, overlap=0.0, plan_delay_ms=NO_THINK)["metrics"]
    assert m["throughput"] == 8.0
    assert m["wait_ms"] == 0.0


def test_one_global_frontier_serialises_even_disjoint_commits() -> None:
    m = _run("tx-global-frontier", overlap=0.0, plan_delay_ms=NO_THINK)["metrics"]
    assert m["throughput"] == pytest.approx(1.0)
    assert m["makespan_ms"] == 8 * 4 * LATENCY


def test_throughput_falls_as_overlap_grows_under_tx_full() -> None:
    def mean(overlap: float) -> float:
        return sum(_run("tx-full", t, overlap=overlap)["metrics"]["throughput"] for t in range(4)) / 4

    assert mean(0.0) > mean(0.5) > 1.0


def test_no_tx_loses_updates_that_tx_full_keeps() -> None:
    unsafe = _run("no-tx", overlap=1.0, access="read_modify_write")["metrics"]
    assert unsafe["invariant_violations"] > 0
    assert unsafe["serialisable"] is False
    safe = _run("tx-full", overlap=1.0, access="read_modify_write")["metrics"]
    assert safe["invariant_violations"] == 0
    assert safe["serialisable"] is True
    assert safe["committed"] == 8
    assert safe["aborts"] > 0  # stale reads, retried with a fresh epoch


def test_rows_share_exactly_the_overlap() -> None:
    p = GranularityParams.model_validate({"agents": 3, "scopes": 4, "overlap": 0.5, "pool": 6})
    rng = random.Random(1)
    rows = [rows_of(i, p, rng) for i in range(3)]
    for i, agent_rows in enumerate(rows):
        assert len(agent_rows) == len(set(agent_rows)) == 4
        assert sum(r.startswith("shared-") for r in agent_rows) == 2
        assert all(int(r.split("-")[1]) < 6 for r in agent_rows if r.startswith("shared-"))
        assert sum(r.startswith(f"a{i}-") for r in agent_rows) == 2
    zero = GranularityParams.model_validate({"overlap": 0.0})
    assert not any(r.startswith("shared-") for r in rows_of(0, zero, rng))


def test_torn_writes_are_found_from_the_rows_themselves() -> None:
    rows = [["shared-0", "shared-1"], ["shared-0", "shared-1"]]
    env = TrialEnv.create()
    try:
        env.db.put_many([(TABLE, "shared-0", "a0"), (TABLE, "shared-1", "a0")])
        assert torn_writes(env, rows, [0, 1]) == 0  # a1 then a0: a serial order
        env.db.put(TABLE, "shared-1", "a1")
        assert torn_writes(env, rows, [0, 1]) == 1  # each row's last writer is the other's first
        env.db.put(TABLE, "shared-0", INITIAL)
        assert torn_writes(env, rows, [0, 1]) == 1  # a committed write vanished
    finally:
        env.close()


@pytest.mark.parametrize(
    ("params", "where"),
    [({"overlap": 0.3}, "whole number"), ({"overlap": 1.0, "pool": 2}, "pool"),
     ({"agents": 0}, "agents"), ({"access": "append"}, "access"),
     ({"plan_delay_ms": [3.0, 1.0]}, "plan_delay_ms")],
)
def test_bad_params_are_refused_naming_the_key(params: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError, match=where):
        GranularityParams.model_validate(params)


def test_records_repeat_for_a_seed() -> None:
    assert _run("tx-full", 3, overlap=0.5)["metrics"] == _run("tx-full", 3, overlap=0.5)["metrics"]


def test_the_config_maps_table_13_with_a_labelled_variant() -> None:
    config = load_config(CONFIG)
    assert config.grid["params.overlap"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert config.tool.jitter_ms == 0.0
    primary, variant = config.paper
    assert primary.table == variant.table == 13
    assert not primary.variant and variant.variant
    assert set(primary.rows) == {"Tx-Full", "Tx-GlobalFrontier", "Workflow-Lock", "No-Tx"}

"""The speculation workload (paper Table 12): K branches, one winner, and what the losers
leave on the real substrates under each mode."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from harness.experiment.config import load_config
from harness.experiment.trial import TrialSpec, derive_rng, run_trial
from harness.workloads import get_workload
from harness.workloads.speculation import CLASSES, SpeculationParams, branch_plan, persisted
from harness.workloads.synthetic import TOOLS
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery

CONFIG = "configs/speculation_contamination.yaml"


def _run(mode: str, branches: int, trial: int = 0) -> dict[str, Any]:
    spec = TrialSpec("spec", "speculation", mode, f"K={branches}", {"K": branches}, trial, 12,
                     params={"branches": branches})
    return run_trial(spec)


def _rates(record: dict[str, Any]) -> dict[str, float]:
    return {cls: record["metrics"][f"contamination_{cls}"] for cls in CLASSES}


@pytest.mark.parametrize("branches", [2, 4, 8])
def test_tx_full_losers_leave_nothing_and_the_winner_everything(branches: int) -> None:
    for trial in range(3):
        record = _run("tx-full", branches, trial)
        m = record["metrics"]
        assert _rates(record) == dict.fromkeys(CLASSES, 0.0)
        assert m["losers"] == branches - 1
        assert m["winner_complete"] is True
        assert m["goal"] is True  # the substrates hold exactly the winner's plan
        assert m["leaks"] == 0
        assert sum(a["committed"] for a in record["agents"]) == 1
        # A loser is dropped by the selector, or first by the runtime: a loser of an earlier
        # epoch that reaches the shared mail scope after the winner committed there is stale.
        aborted = [a for a in record["agents"] if not a["committed"]]
        assert all(a["aborts"] in (["losing_speculation"], ["stale_read"]) for a in aborted)


def test_saga_compensates_revocable_effects_but_every_loser_mail_stays_sent() -> None:
    record = _run("saga", 4)
    rates = _rates(record)
    assert rates["mailbox"] == 1000.0
    assert rates["buffer"] == rates["files"] == rates["db"] == rates["booking"] == 0.0
    assert record["metrics"]["loser_effects_mailbox"] == 3
    assert record["metrics"]["leaks"] == 3  # the oracle, from the sink's own file, agrees
    assert record["exercised"]["compensations"] > 0


def test_no_tx_leaves_every_loser_effect_of_every_class() -> None:
    record = _run("no-tx", 4)
    assert _rates(record) == dict.fromkeys(CLASSES, 1000.0)
    assert record["metrics"]["loser_effects"] == 3 * len(CLASSES)
    assert record["metrics"]["goal"] is False


def test_tcc_never_confirms_a_dropped_branch() -> None:
    assert _rates(_run("tcc", 4)) == dict.fromkeys(CLASSES, 0.0)


def test_the_same_branch_wins_under_every_mode_and_records_repeat() -> None:
    workload = get_workload("speculation")
    winners = {
        mode: workload.scenario(derive_rng(12, "scenario", 5), 5, {"branches": 8}).info["winner"]
        for mode in ("tx-full", "saga")
    }
    assert winners["tx-full"] == winners["saga"]
    first, again = _run("occ", 8, 5), _run("occ", 8, 5)
    assert first["metrics"] == again["metrics"]


def test_persisted_reads_each_class_from_the_substrates() -> None:
    env = TrialEnv.create()
    try:
        env.db.put_many([("slots", 3, {"left": 1, "holders": []})])
        assert persisted(env, 3) == dict.fromkeys(CLASSES, False)
        for step in branch_plan(3):
            TOOLS[step.tool].run(env, dict(step.args), Delivery(None, {}))  # type: ignore[arg-type]
        assert persisted(env, 3) == dict.fromkeys(CLASSES, True)
        assert persisted(env, 2)["mailbox"] is False  # another branch's mail is not branch 2's
        env.files.delete("proposals/branch-3.md")
        env.db.delete("proposals", 3)
        assert persisted(env, 3)["files"] is False
        assert persisted(env, 3)["db"] is False
    finally:
        env.close()


@pytest.mark.parametrize(
    ("params", "where"),
    [({"branches": 1}, "branches"), ({"branches": 65}, "branches"),
     ({"plan_delay_ms": [5.0, 1.0]}, "plan_delay_ms"), ({"K": 2}, "K")],
)
def test_bad_params_are_refused_naming_the_key(params: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError, match=where):
        SpeculationParams.model_validate(params)


def test_the_config_maps_table_12_and_runs_the_paper_grid() -> None:
    config = load_config(CONFIG)
    assert config.trials == 200
    assert config.grid["params.branches"] == [2, 4, 8, 16]
    (entry,) = config.paper
    assert entry.table == 12
    assert set(entry.columns) == {"Buffer", "Filesystem", "DB rows", "Mailbox"}
    assert {"tx-full", "tx-global-frontier", "mutex-wal", "tcc", "saga", "occ"} <= set(config.modes)

"""Agent policies (configs/README.md "agent"): validation of the `agent` section, of a cell
that overrides it and of the reaction weights; the tau2 step budget, what a restart costs, and
wrapper retries, which the budget does not pay for.

Trials run on tau2 retail. Tests that need a fault at one exact call, or the op log, drive
`run_agent` on a hand-made rig with a scripted injector (the `rig` fixture, tests/policy_rig.py);
the others use `run_trial`.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from policy_rig import (
    CANCEL,
    CANCEL_THEN_MODIFY,
    DATA,
    INITIAL,
    READS_THEN_CANCEL,
    TASKS,
    TRIAL,
    WEIGHTS,
    ZERO,
    Scripted,
    failing,
    goal_sha,
    gold_args,
    only,
    site,
    spec,
)
from pydantic import ValidationError

from harness.agents.policies import AgentConfig
from harness.agents.task import AgentPolicy, Step
from harness.experiment.cells import expand_cells
from harness.experiment.config import ConfigError, cell_config, validate_config
from harness.experiment.trial import run_trial
from harness.modes.registry import modes
from harness.workloads.retail import gold_actions
from harness.world.faults import FaultClass, FaultConfig, Point

# ------------------------------------------------------------------------------ config


def test_agent_config_rejects_an_unknown_key() -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig.model_validate({"kind": "llm-like", "retires": 0.5})
    assert [e["loc"] for e in err.value.errors()] == [("retires",)]
    assert err.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, -math.inf])
def test_a_negative_or_non_finite_weight_is_rejected_naming_the_field(weight: str, value: float) -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig.model_validate({"kind": "llm-like", weight: value})
    errors = err.value.errors()
    assert [e["loc"] for e in errors] == [(weight,)]
    assert "finite" in errors[0]["msg"] and ">= 0" in errors[0]["msg"]


def test_llm_like_needs_a_step_budget() -> None:
    # Without one, weight only on retry would loop forever on a call that always fails.
    with pytest.raises(ValidationError, match="agent.max_steps"):
        AgentConfig(kind="llm-like", **{**ZERO, "retry": 1.0})


def test_a_failed_re_check_before_commit_is_a_tool_failure_not_a_stale_read(rig: Any) -> None:
    product = sorted(DATA.db["products"])[0]  # read, never written by the plan
    steps = (
        Step("get_product_details", {"product_id": product}, save_as="product"),
        Step("cancel_pending_order", gold_args(CANCEL, 0)),
    )
    recheck = Scripted({(Point.CALL, f"a0/task{CANCEL}/v0"): (FaultClass.F1, {0})})
    run = rig("tx-full", CANCEL, recheck, agent=only("carry_on"), steps=steps, validate=(0,))
    # The first attempt's re-check failed: a tool failure (the agent cannot tell whether its
    # read is stale), so tx-full aborts it cleanly and the fresh attempt commits.
    assert run.outcome.aborts == ["tool_failure"]
    assert run.outcome.committed and run.outcome.attempts == 2
    assert run.sha == goal_sha(CANCEL)


def test_all_zero_llm_like_weights_are_rejected_but_gold_ignores_the_weights() -> None:
    with pytest.raises(ValidationError, match="at least one reaction weight"):
        AgentConfig(kind="llm-like", **ZERO, max_steps=30)
    AgentConfig(kind="llm-like", **{**ZERO, "give_up": 1e-9}, max_steps=30)  # tiny but positive: fine
    assert AgentConfig(kind="gold", **ZERO).kind == "gold"


@pytest.mark.parametrize(
    ("key", "value"),
    [("kind", "gpt"), ("max_steps", 0), ("max_steps", 10_001), ("wrapper_retries", -1),
     ("wrapper_retries", 21), ("replan_depth", 0)],
)
def test_out_of_range_agent_values_are_rejected_naming_the_field(key: str, value: Any) -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig.model_validate({key: value})
    assert [e["loc"][0] for e in err.value.errors()] == [key]


def test_wrapper_retries_by_mode_rejects_an_unknown_mode_naming_the_allowed_ones() -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig(wrapper_retries_by_mode={"tx-full": 1, "tx-fulll": 2})
    message = str(err.value)
    assert "tx-fulll" in message
    assert "allowed:" in message
    for mode in modes():
        assert mode in message.split("allowed:", 1)[1]
    with pytest.raises(ValidationError, match="saga"):
        AgentConfig(wrapper_retries_by_mode={"saga": 21})
    config = AgentConfig(wrapper_retries=1, wrapper_retries_by_mode={"saga": 3})
    assert config.wrapper_retries_for("saga") == 3
    assert config.wrapper_retries_for("tx-full") == 1


def _experiment(**agent: Any) -> dict[str, Any]:
    return {
        "name": "policies",
        "workload": "tau_retail",
        "trials": 2,
        "modes": ["tx-full", "no-tx"],
        "agent": agent,
    }


def test_an_experiment_config_takes_an_agent_section_and_a_cell_can_override_its_kind() -> None:
    data = _experiment(kind="llm-like", max_steps=30)
    config = validate_config(data, "p.yaml")
    assert config.agent.kind == "llm-like"
    assert config.agent.max_steps == 30
    assert config.agent == AgentConfig(kind="llm-like", max_steps=30)

    data["grid"] = {"agent.kind": ["gold", "llm-like"]}
    config = validate_config(data, "p.yaml")
    cells = expand_cells(config)
    assert [c["agent.kind"] for c in cells] == ["gold", "llm-like"]
    kinds = [cell_config(config, c).agent for c in cells]
    assert [a.kind for a in kinds] == ["gold", "llm-like"]
    assert all(a.max_steps == 30 for a in kinds)  # the rest of the section is kept


def test_a_bad_agent_section_or_cell_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        validate_config(_experiment(kind="llm-like", retires=1), "p.yaml")
    assert "agent.retires" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config(_experiment(kind="llm-like", give_up=-1), "p.yaml")
    assert "agent.give_up" in str(err.value)
    data = _experiment(kind="gold")
    data["grid"] = {"agent.kind": ["gold", "gpt"]}
    with pytest.raises(ConfigError) as err:
        validate_config(data, "p.yaml")
    assert "agent.kind" in str(err.value) and "gpt" in str(err.value)
    # A cell that zeroes the last llm-like weight is reported by its label.
    data = _experiment(kind="llm-like", max_steps=30, **{**ZERO, "retry": 1.0})
    data["grid"] = {"agent.retry": [1.0, 0.0]}
    with pytest.raises(ConfigError) as err:
        validate_config(data, "p.yaml")
    assert "agent.retry=0.0" in str(err.value) and "at least one reaction weight" in str(err.value)


# ------------------------------------------------------------------------------ budget


@pytest.mark.parametrize("max_steps", [1, 4, 7])
def test_the_budget_caps_the_calls_issued_and_each_call_is_one_delivery(max_steps: int) -> None:
    # Every call fails and the agent always retries: only the budget stops it.
    record = run_trial(spec("tx-full", CANCEL_THEN_MODIFY, agent=only("retry", max_steps=max_steps),
                            faults=FaultConfig(rate=1.0, classes="F1")))
    (agent,) = record["agents"]
    assert agent["steps"] == record["metrics"]["steps"] == max_steps
    # Deliveries counted below the agent (one injected fault per delivery here).
    assert len([f for f in record["faults"] if f["point"] == "call"]) == max_steps
    assert agent["reactions"] == ["retry"] * max_steps
    assert not agent["committed"]
    assert "step budget" in agent["failure"]
    assert record["metrics"]["budget_exhausted"] == 1


@pytest.mark.parametrize("mode", ["tx-full", "no-tx", "saga", "checkpoint-replay", "retry-only"])
def test_no_agent_ever_issues_more_calls_than_its_budget(mode: str) -> None:
    exhausted = 0
    for trial in range(12):
        record = run_trial(spec(mode, trial=trial, agent=AgentConfig(kind="llm-like", max_steps=6),
                                faults=FaultConfig(rate=0.35)))
        (agent,) = record["agents"]
        assert agent["steps"] <= 6, (trial, agent)
        if record["metrics"]["budget_exhausted"]:
            exhausted += 1
            assert agent["steps"] == 6
            assert "step budget" in agent["failure"]
            assert not agent["committed"]
    assert exhausted > 0  # the budget was exercised


def test_a_budget_equal_to_the_plan_is_enough_and_one_less_is_not() -> None:
    plan = len(gold_actions(TASKS[TRIAL[READS_THEN_CANCEL]]))
    enough = run_trial(spec("tx-full", READS_THEN_CANCEL, agent=AgentConfig(max_steps=plan)))
    assert enough["metrics"]["goal"] and enough["agents"][0]["committed"]
    assert enough["metrics"]["steps"] == plan and enough["metrics"]["budget_exhausted"] == 0
    short = run_trial(spec("tx-full", READS_THEN_CANCEL, agent=AgentConfig(max_steps=plan - 1)))
    assert not short["agents"][0]["committed"]
    assert short["metrics"]["steps"] == plan - 1 and short["metrics"]["budget_exhausted"] == 1
    assert short["final"]["db_sha256"] == INITIAL  # the writes before it were rolled back


@pytest.mark.parametrize("mode", ["tx-full", "saga"])
def test_a_restart_reissues_its_calls_and_pays_for_them(rig: Any, mode: str) -> None:
    # The cancel (step 0) lands every attempt; the modify (step 1) always fails. Gold retries
    # it step_retries=2 times, then restarts: each attempt costs 1 + 3 calls.
    doomed = failing(CANCEL_THEN_MODIFY, 1, times=100)
    run = rig(mode, CANCEL_THEN_MODIFY, doomed)
    attempts = AgentPolicy().max_attempts
    assert run.outcome.attempts == attempts
    assert run.outcome.steps == attempts * 4
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 0)) == attempts
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 1)) == attempts * 3
    assert run.injector.calls() == run.outcome.steps
    assert run.outcome.reactions == ["retry", "retry", "restart"] * attempts
    assert not run.outcome.committed
    assert run.sha == INITIAL  # every attempt was aborted and its cancel undone


@pytest.mark.parametrize("mode", ["tx-full", "saga"])
def test_an_exhausted_budget_ends_the_task_and_aborts_its_transaction(rig: Any, mode: str) -> None:
    doomed = failing(CANCEL_THEN_MODIFY, 1, times=100)
    run = rig(mode, CANCEL_THEN_MODIFY, doomed, agent=AgentConfig(max_steps=10))
    # Attempts 1 and 2 cost 4 calls each; attempt 3 issues the cancel (landed) and one modify.
    assert run.outcome.steps == 10 == run.injector.calls()
    assert run.outcome.attempts == 3
    assert run.outcome.failure is not None and "step budget" in run.outcome.failure
    assert not run.outcome.committed
    assert len(run.outcome.aborts) == 3
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 0)) == 3
    assert run.sha == INITIAL  # the third attempt's cancel was rolled back too
    # In the op log, each attempt's cancel was written and then restored.
    cancels = run.ops(site(CANCEL_THEN_MODIFY, 0), "write")
    assert [op.meta["attempt"] for op in cancels if not op.meta.get("undo")] == [1, 2, 3]
    assert [op.meta["attempt"] for op in cancels if op.meta.get("undo")] == [1, 2, 3]
    assert cancels[-1].meta.get("undo")


def test_without_restarts_the_agent_does_not_start_over(rig: Any) -> None:
    # no-tx cannot undo the cancel, so the gold agent reports the failure instead of repeating it.
    run = rig("no-tx", CANCEL_THEN_MODIFY, failing(CANCEL_THEN_MODIFY, 1, times=100))
    assert run.outcome.attempts == 1
    assert run.outcome.steps == 4 == run.injector.calls()
    assert not run.outcome.committed
    assert run.sha != INITIAL  # the cancel stays: what "aborted" means under tx-full is not free


def test_wrapper_retries_are_not_charged_to_the_budget() -> None:
    agent = only("retry", max_steps=4, wrapper_retries=2)
    record = run_trial(spec("tx-full", CANCEL, agent=agent, faults=FaultConfig(rate=1.0, classes="F1")))
    assert record["metrics"]["steps"] == 4
    assert record["agents"][0]["reactions"] == ["retry"] * 4  # the agent saw 4 failures
    assert len(record["faults"]) == 4 * 3  # each call was delivered three times below it


def test_wrapper_retries_by_mode_apply_to_that_mode_only() -> None:
    agent = only("retry", max_steps=3, wrapper_retries_by_mode={"tx-full": 1})
    faults = FaultConfig(rate=1.0, classes="F1")
    full = run_trial(spec("tx-full", CANCEL, agent=agent, faults=faults))
    plain = run_trial(spec("no-tx", CANCEL, agent=agent, faults=faults))
    assert full["metrics"]["steps"] == plain["metrics"]["steps"] == 3
    assert len(full["faults"]) == 6
    assert len(plain["faults"]) == 3


def test_a_failure_absorbed_by_the_wrapper_is_never_seen_by_the_agent(rig: Any) -> None:
    flaky = failing(CANCEL_THEN_MODIFY, 1, times=2)
    run = rig("tx-full", CANCEL_THEN_MODIFY, flaky, agent=AgentConfig(max_steps=2, wrapper_retries=2))
    assert run.outcome.committed
    assert run.outcome.reactions == []
    assert run.outcome.steps == 2
    assert run.injector.calls() == 4
    assert run.sha == goal_sha(CANCEL_THEN_MODIFY)

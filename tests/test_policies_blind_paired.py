"""What an agent policy may see (docs/design.md, "What a mode may see"): the same failure
under F1 and F2, never the injected class; and that mode comparisons stay paired: modes run on
the same trials meet the same agent, the same fault draws and the same reactions.

Trials run on tau2 retail. Tests that need a fault at one exact call, or the op log, drive
`run_agent` on a hand-made rig with a scripted injector (the `rig` fixture, tests/policy_rig.py);
the others use `run_trial`.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from policy_rig import (
    CANCEL,
    READS_THEN_CANCEL,
    TRIAL,
    WORKLOAD,
    ZERO,
    Recording,
    failing,
    failure,
    spec,
)

from harness.agents.policies import AgentConfig, make_policy
from harness.experiment.trial import TrialSpec, run_trial
from harness.world.faults import FaultClass, FaultConfig

# ------------------------------------------------------------------------------ blind to class


@pytest.mark.parametrize(("task_id", "step"), [(READS_THEN_CANCEL, 2), (READS_THEN_CANCEL, 8), (CANCEL, 0)])
@pytest.mark.parametrize("mode", ["tx-full", "no-tx"])
@pytest.mark.parametrize("kind", ["gold", "llm-like"])
def test_the_policy_sees_the_same_failure_under_f1_and_f2(
    rig: Any, task_id: str, step: int, mode: str, kind: str
) -> None:
    seen = {}
    for fault in (FaultClass.F1, FaultClass.F2):
        scenario = WORKLOAD.scenario(random.Random(0), TRIAL[task_id], {})
        agent = AgentConfig(kind=kind, max_steps=40)  # type: ignore[arg-type]
        recorder = Recording(make_policy(agent, mode, step_retries=scenario.policy.step_retries,
                                         tool_errors_fatal=scenario.policy.tool_errors_fatal))
        rig(mode, task_id, failing(task_id, step, fault), behaviour=recorder)
        assert recorder.seen, fault
        seen[fault] = recorder.seen[0]
    assert seen[FaultClass.F1] == seen[FaultClass.F2]
    first = seen[FaultClass.F1]
    assert first.step == step and first.kind == "error" and first.tries == 1
    assert "F1" not in first.message and "F2" not in first.message


def test_failure_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        failure().kind = "refused"  # type: ignore[misc]


# ------------------------------------------------------------------------------ paired modes


PAIRED = ["tx-full", "no-tx", "saga", "tcc", "checkpoint-replay", "occ"]


def test_modes_compared_without_faults_meet_the_same_agent() -> None:
    # Without faults the only failed calls are the refusals in tau2's gold trajectories (a
    # look-up of an unknown user, an exchange of an order not yet delivered): every mode meets
    # them identically, so reactions, steps and final DB agree.
    agent = AgentConfig(kind="llm-like", max_steps=30)
    empty = 0
    for trial in (0, 2, 8, 17, 21, 27):
        records = [run_trial(spec(mode, trial=trial, agent=agent)) for mode in PAIRED]
        assert len({r["final"]["db_sha256"] for r in records}) == 1, trial
        assert len({tuple(r["agents"][0]["reactions"]) for r in records}) == 1, trial
        assert len({r["metrics"]["steps"] for r in records}) == 1, trial
        assert all(r["exercised"]["faults_total"] == 0 for r in records)
        empty += records[0]["agents"][0]["reactions"] == []
    assert empty >= 3


def test_modes_meet_the_same_first_reaction_on_the_same_fault_draws() -> None:
    # Until the mechanisms diverge, every mode makes the same calls, meets the same faults
    # (Bernoulli draws are per call) and draws the same reactions from its own stream.
    agent = AgentConfig(kind="llm-like", max_steps=30)
    faults = FaultConfig(rate=0.3, classes="F1")
    exercised = 0
    for trial in range(12):
        records = [run_trial(spec(mode, trial=trial, agent=agent, faults=faults))
                   for mode in ("tx-full", "no-tx", "saga")]
        firsts = {tuple(r["agents"][0]["reactions"][:1]) for r in records}
        assert len(firsts) == 1, (trial, [r["agents"] for r in records])
        exercised += bool(next(iter(firsts)))
    assert exercised > 3


def test_reactions_do_not_shift_with_the_agents_think_time() -> None:
    # Reactions draw from their own stream: drawing plan delays must not change them. One
    # agent (no contention), F1 only (no effect lands), so both runs make the same calls.
    agent = AgentConfig(kind="llm-like", **{**ZERO, "retry": 1.0, "alter": 1.0, "carry_on": 1.0}, max_steps=30)
    faults = FaultConfig(rate=0.5, classes="F1")
    several = 0
    for trial in range(12):
        reactions = []
        for delay in ([0.0, 0.0], [20.0, 120.0]):
            params = {"agents": 1, "contended": 1, "plan_delay_ms": delay}
            record = run_trial(TrialSpec("policies", "tau_contention", "tx-full", "cell", {}, trial, 1,
                                         faults=faults, params=params, agent=agent))
            reactions.append(record["agents"][0]["reactions"])
        assert reactions[0] == reactions[1], trial
        several += len(reactions[0]) >= 2
    assert several >= 3

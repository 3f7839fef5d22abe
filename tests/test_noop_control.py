"""The do-nothing control (`agent.kind: noop`) on every shipped config.

On a workload that judges an agent's task, an idle agent may be clean only where doing
nothing IS the task's answer: the goal state equals the state the scenario starts from
(tau2 credits those tasks too: their gold only reads, then refuses). Everywhere else its clean
rate is 0. Which trials those are is computed here from the scenario itself (setup, then
snapshot, against the goal), not from the harness's verdict. On a workload that probes a
mechanism, the control is refused when the config is loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.experiment.config import ConfigError, load_config
from harness.experiment.runner import plan
from harness.experiment.trial import TrialSpec, derive_rng, run_trial
from harness.workloads import WORKLOADS, get_workload
from harness.world.substrates import TrialEnv

CONFIGS = sorted(p for p in Path("configs").glob("*.yaml"))
# A real model's config needs a server; the noop control on its workload is covered by the
# tau_retail configs, which share it.
SKIP = {"tau_retail_llm.yaml"}
TRIALS = 4  # per cell: enough for every cell's scenario kinds, cheap on 2 cores
# tau_retail samples 30 tasks; all of them, so the tasks whose answer is to do nothing come up.
TRIALS_BY_WORKLOAD = {"tau_retail": 30}


def _workload(path: Path) -> str:
    return load_config(path).workload


def _idle_meets_goal(spec: TrialSpec) -> bool | None:
    """Whether the scenario's goal state is the state it starts from; None when the scenario
    has no goal state (judged by invariants only)."""
    workload = get_workload(spec.workload)
    scenario = workload.scenario(derive_rng(spec.seed, "scenario", spec.trial), spec.trial, spec.params)
    if scenario.expected is None:
        return None
    env = TrialEnv.create(durable=spec.durable)
    try:
        scenario.setup(env)
        return dict(env.snapshot()) == dict(scenario.expected())
    finally:
        env.close()


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name not in SKIP], ids=lambda p: p.stem)
def test_noop_is_clean_only_where_idling_is_the_answer(path: Path) -> None:
    workload = _workload(path)
    if getattr(WORKLOADS[workload], "probes_mechanism", False):
        with pytest.raises(ConfigError, match="'noop' does not apply to workload"):
            load_config(path, overrides={"agent.kind": "noop"})
        return
    trials = TRIALS_BY_WORKLOAD.get(workload, TRIALS)
    config = load_config(path, overrides={"agent.kind": "noop", "trials": trials})
    if "agent.kind" in config.grid:  # a config that compares agent kinds runs noop as one
        config = load_config(path, overrides={"trials": trials}, grid={"agent.kind": ["noop"]})
    specs = [s for s in plan(config) if s.mode == config.modes[0]]
    assert specs
    idle_right: dict[tuple[str, int], bool | None] = {}
    for spec in specs:
        record = run_trial(spec)
        key = (spec.cell_id, spec.trial)
        if key not in idle_right:
            idle_right[key] = _idle_meets_goal(spec)
        assert record["metrics"]["steps"] == 0, spec.key
        clean = bool(record["metrics"]["clean"])
        if idle_right[key] is True:
            # The goal is met by doing nothing; the record is clean unless the task's reward
            # asks for something an idle agent cannot give (a message, a hand-over).
            assert record["metrics"]["goal"], spec.key
        else:
            assert not clean, f"{spec.key}: an idle agent was judged clean"
    if workload == "tau_retail":
        # Not vacuous: the sample holds a task whose right answer is to do nothing (task 65).
        assert any(idle_right.values())


def test_noop_is_refused_on_mechanism_probes_with_a_clear_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("configs/leakage.yaml", overrides={"agent.kind": "noop"})
    text = str(info.value)
    assert "configs/leakage.yaml" in text and "agent.kind" in text and "gold, llm-like" in text


def test_clean_tables_say_which_reward_parts_were_not_judged() -> None:
    """tau2's natural-language assertions need an LLM judge; the caption of a `clean` table
    says they were not counted, and in how many trials."""
    from harness.analysis.records import records_frame
    from harness.analysis.table import TableSpec, build_table

    config = load_config("configs/tau_retail.yaml", overrides={"trials": 30, "modes": ["tx-full"]})
    records = [run_trial(s) for s in plan(config) if s.cell_id == plan(config)[0].cell_id]
    unjudged = sum("nl_assertions" in [k for k, v in r["reward"]["components"].items()
                                        if isinstance(v, str)] for r in records)
    assert 0 < unjudged < len(records)
    df = records_frame(records)
    clean = build_table(df, TableSpec(name="c", metric="clean", kind="proportion"))
    assert f"nl_assertions in {unjudged} of {len(records)} trials" in clean.footer
    assert "not counted in clean" in clean.footer
    steps = build_table(df, TableSpec(name="s", metric="steps", kind="mean"))
    assert "not judged" not in steps.footer.lower()

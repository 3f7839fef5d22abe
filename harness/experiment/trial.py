"""One trial: a scenario run under one mode on fresh substrates, judged by the oracle.

Everything random is derived from (seed, cell, trial index), so every mode sees the same
tasks, the same plan delays and the same fault draws on the same trial. The pairing of fault
draws is exact per delivery: with Bernoulli arrival, a delivery's fault depends only on the
trial seed and its key (agent, point, role, site, occurrence) (harness.world.faults), never on
the mode or on the global order of calls, so two modes whose agent makes the same logical
call for the k-th time meet the same fault (bursty arrival advances one chain in the order
asked, so it is not paired per delivery). `TrialTrace.decisions` logs every key and its
decision, so this can be checked (tests/test_common_random_numbers.py).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from harness.agents.loops import make_loop
from harness.agents.policies import AgentConfig
from harness.agents.task import AgentOutcome
from harness.experiment.budget import trial_budget
from harness.experiment.calltrace import CallLog, TracingMode, jsonable, wrap_loop
from harness.experiment.record import (
    AgentRecord,
    Exercised,
    FaultRecord,
    GoalDiffEntry,
    Metrics,
    RewardRecord,
    TrialRecord,
)
from harness.modes.base import AgentContext, ModeSettings
from harness.modes.registry import get_mode
from harness.workloads import get_workload
from harness.world import faults
from harness.world.boundary import Boundary
from harness.world.clock import Sleep, VirtualClock
from harness.world.faults import Decision  # (the name `faults` is a TrialTrace field too)
from harness.world.oracle import judge
from harness.world.statediff import diff_states
from harness.world.substrates import TrialEnv

_EXPECTED: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()


def _expected(spec: TrialSpec, compute: Any) -> dict[str, Any]:
    """The goal state of a trial, computed once per process: it depends only on the
    scenario (workload, seed, trial, params), never on the mode or the faults."""
    key = (spec.workload, spec.seed, spec.trial, json.dumps(dict(spec.params), sort_keys=True, default=str))
    if key in _EXPECTED:
        _EXPECTED.move_to_end(key)
        return _EXPECTED[key]
    value = compute()
    _EXPECTED[key] = value
    if len(_EXPECTED) > 64:
        _EXPECTED.popitem(last=False)
    return value


def derive_rng(seed: int, *parts: Any) -> random.Random:
    blob = "/".join(map(str, (seed, *parts))).encode()
    return random.Random(int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big"))


@dataclass(frozen=True)
class TrialSpec:
    """Everything that determines one trial's record (apart from wall-clock fields)."""

    config: str
    workload: str
    mode: str
    cell_id: str
    cell: Mapping[str, Any]
    trial: int
    seed: int
    faults: faults.FaultConfig = field(default_factory=faults.FaultConfig)
    settings: ModeSettings = field(default_factory=ModeSettings)
    latency_ms: float = 5.0
    jitter_ms: float = 2.0
    params: Mapping[str, Any] = field(default_factory=dict)
    agent: AgentConfig = field(default_factory=AgentConfig)
    durable: bool = False  # the trial's stores on disk, fsynced (config `durable`); same record

    @property
    def key(self) -> str:
        return f"{self.config}/{self.mode}/{self.cell_id}/{self.trial}"


def exercised(
    config: faults.FaultConfig,
    fault_records: Sequence[Mapping[str, Any]],
    outcomes: Sequence[AgentOutcome],
    ops: Sequence[Any],
    messages: Sequence[Any],
) -> Exercised:
    """What a trial exercised: the conditions its cell's tables may be about (docs/design.md,
    "Measuring").

    Counts of injected faults per class (all five, zeros included) and in total; aborts
    summed over agents; compensations (undo deliveries in the op log, so a compensation
    that an F3 stopped is not one); calls agents made to irreversible tools; messages the
    sink holds. `fault_classes` and `faults_armed` say what the cell asked for (classes with
    weight > 0; a nonzero fault rate), so a report can tell "no fault of the cell's class
    was injected" from "the cell injects none". Everything is a count: no clock in it.
    """
    per_class = {str(c): 0 for c in faults.FaultClass}
    for record in fault_records:
        per_class[str(record["fault"])] += 1
    return Exercised(**{
        "faults": per_class,
        "faults_total": len(fault_records),
        "aborts": sum(len(o.aborts) for o in outcomes),
        "compensations": sum(1 for op in ops if op.meta.get("undo")),
        "irreversible_calls": sum(o.irreversible_calls for o in outcomes),
        "sends": len(messages),
        "fault_classes": [str(c) for c, w in config.classes.items() if w > 0],
        "faults_armed": config.marginal_rate() > 0,
    })


@dataclass(frozen=True)
class TrialTrace:
    """What a trial did below the shims, for `atomix show`: the substrates' operation log,
    the sink's messages and the injected faults (the record keeps only counts of these)."""

    ops: list[Any]
    messages: list[Any]
    faults: list[dict[str, Any]]
    workdir: str  # the trial's own temporary directory, which file and SQLite scopes name
    # Every question the fault injector answered, in order, faulted or not: its key and its
    # fault (None), so tests can check that modes issuing the same call met the same fault.
    decisions: list[Decision] = field(default_factory=list)
    # What the agents asked of the mode, call by call (harness.experiment.calltrace), and
    # where the final state differs from the goal ([] when reached or judged by invariants).
    calls: list[dict[str, Any]] = field(default_factory=list)
    goal_diff: list[dict[str, Any]] = field(default_factory=list)


def goal_diff(
    scenario: Any, env: TrialEnv, expected: Mapping[str, Any] | None, final: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Where the final snapshot differs from the goal: the snapshots' own difference, with
    the workload's finer one (`Scenario.goal_diff`) in place of the digests it explains.
    Values are cut to a few hundred characters, so a record stays small."""
    if expected is None:
        return []
    entries = diff_states(expected, final)
    if scenario.goal_diff is not None:
        finer = scenario.goal_diff(env)
        heads = {str(e["path"]).split(".", 1)[0] for e in finer}
        entries = [e for e in entries if str(e["path"]).split(".", 1)[0] not in heads] + finer
    return [{k: jsonable(v, 300) if k in ("gold", "final") else v for k, v in e.items()}
            for e in entries]


def run_trial(
    spec: TrialSpec, *, workdir: Path | None = None, trace: list[TrialTrace] | None = None
) -> TrialRecord:
    """Run one trial and return its record (JSON-ready, see `harness.experiment.record`);
    with `trace`, also append what it did below the shims."""
    wall = time.perf_counter()
    workload = get_workload(spec.workload)
    # The scenario depends on the trial, not the mode or the fault cell: same tasks for all.
    scenario = workload.scenario(derive_rng(spec.seed, "scenario", spec.trial), spec.trial, spec.params)
    loop = make_loop(spec, scenario, workload.tools)  # how agent.kind runs (harness.agents.loops)
    env = TrialEnv.create(workdir, durable=spec.durable)
    try:
        scenario.setup(env)
        clock = VirtualClock()
        injector = faults.FaultInjector(spec.faults, seed=spec.seed, cell=spec.cell_id, trial=spec.trial)
        trial_mode = get_mode(spec.mode).factory(env, clock, spec.settings)
        call_log = (CallLog(clock, lambda: (injector.events, len(env.oplog)))
                    if trace is not None else None)
        if call_log is not None:  # the wrappers log and pass everything through unchanged
            trial_mode = cast(Any, TracingMode(trial_mode, call_log))
            wrap_loop(loop, call_log)
        outcomes: list[AgentOutcome] = []
        tasks = []
        for index, task in enumerate(scenario.tasks):
            agent = f"a{index}"
            rng = derive_rng(spec.seed, "agent", spec.trial, index)
            # Reactions draw from their own stream, so plan delays never shift them.
            reactions = derive_rng(spec.seed, "reactions", spec.trial, index)
            boundary = Boundary(clock, injector, latency_ms=spec.latency_ms, jitter_ms=spec.jitter_ms, rng=rng, agent=agent)

            def make_ctx(attempt: int, agent: str = agent, boundary: Boundary = boundary) -> AgentContext:
                return AgentContext(agent, attempt, f"{spec.key}/{agent}/{attempt}", env, clock, boundary, spec.settings)

            offset = scenario.start_offsets_ms[index] if scenario.start_offsets_ms else 0.0

            async def agent_main(make_ctx: Any = make_ctx, task: Any = task, rng: random.Random = rng, offset: float = offset, reactions: random.Random = reactions) -> AgentOutcome:
                if offset:
                    await Sleep(offset)
                outcome = await loop.run(trial_mode, make_ctx, task, rng, reactions)
                outcomes.append(outcome)
                return outcome

            tasks.append(clock.spawn(agent_main(), agent))
        clock.run()
        for task in tasks:
            if task.error is not None:
                raise task.error
        stuck = [t.name for t in clock.stuck()]
        committed = {(o.agent, o.committed_attempt) for o in outcomes if o.committed_attempt is not None}
        final = env.snapshot()
        expected = _expected(spec, scenario.expected) if scenario.expected is not None else None
        invariants = scenario.invariants(env, outcomes) if scenario.invariants is not None else 0
        ops = env.oplog.ops()
        messages = env.messages()
        fault_records = injector.records()
        verdict = judge(
            final=final,
            expected=expected,
            ops=ops,
            messages=messages,
            committed=committed,
            invariant_violations=invariants,
            reported_residue=sum(o.reported_residue for o in outcomes),
        )  # (the residue a mode reported; see "residue_mismatch" below)
        missed = goal_diff(scenario, env, expected, final) if not verdict.goal else []
        if trace is not None:
            trace.append(TrialTrace(list(ops), list(messages), fault_records, str(env.workdir),
                                    decisions=list(injector.decisions),
                                    calls=call_log.events if call_log is not None else [],
                                    goal_diff=missed))
        outcomes.sort(key=lambda o: o.agent)
        n = max(1, len(outcomes))
        reported = sum(o.reported_residue for o in outcomes)
        metrics = {
            **verdict.as_dict(),
            # Paper Table 16: the oracle's residue status against the mode's own report.
            "residue_free": verdict.residue == 0,
            "reported_residue": reported,
            "residue_mismatch": (verdict.residue == 0) != (reported == 0),
            "leaked": verdict.leaks > 0,
            "committed": sum(o.committed for o in outcomes),
            "agents": len(outcomes),
            "attempts": sum(o.attempts for o in outcomes),
            "steps": sum(o.steps for o in outcomes),
            "budget_exhausted": sum(o.out_of_budget for o in outcomes),
            "aborts": sum(len(o.aborts) for o in outcomes),
            "wait_ms": sum(o.blocked_ms for o in outcomes) / n,
            "blocked": sum(o.blocked_ms > 0 for o in outcomes) / n,
            "makespan_ms": clock.now,
            "stuck": len(stuck),
            # A workload's own measures (a table's column that no generic metric gives).
            **(scenario.metrics(env, outcomes) if scenario.metrics is not None else {}),
        }
        metrics.update(loop.metrics(outcomes))
        reward = scenario.reward(env, outcomes) if scenario.reward is not None else None
        if reward is not None:
            # The workload's task reward (e.g. tau2's: the goal DB and what the agent had to
            # tell): clean only when the oracle found the trial clean and the reward passed.
            metrics["reward"] = bool(reward["passed"])
            metrics["clean"] = bool(metrics["clean"]) and metrics["reward"]
        record = TrialRecord(
            key=spec.key,
            config=spec.config,
            workload=spec.workload,
            mode=spec.mode,
            cell_id=spec.cell_id,
            cell=dict(spec.cell),
            trial=spec.trial,
            seed=spec.seed,
            faults=cast(list[FaultRecord], fault_records),
            metrics=cast(Metrics, metrics),
            exercised=exercised(spec.faults, fault_records, outcomes, ops, messages),
            agents=[
                cast(AgentRecord, {
                    "agent": o.agent, "task": o.task_id, "committed": o.committed,
                    "attempts": o.attempts, "aborts": o.aborts, "failure": o.failure,
                    "blocked_ms": o.blocked_ms, "steps": o.steps, "reactions": o.reactions,
                    **loop.record(o),
                })
                for o in outcomes
            ],
            # What the mode and the agent were allowed (a function of the config alone).
            budget=trial_budget(spec.mode, spec.settings, spec.agent, scenario.policy),
            final=scenario.final(env) if scenario.final is not None else {},
            timings={"wall_s": time.perf_counter() - wall, **loop.timings(outcomes)},
        )
        if reward is not None:
            record["reward"] = cast(RewardRecord, reward)
        if "data_version" in scenario.info:
            record["data_version"] = str(scenario.info["data_version"])
        # Always written ([]: the goal was reached, or the workload judges by invariants).
        record["goal_diff"] = cast(list[GoalDiffEntry], missed)
        return record
    finally:
        env.close()

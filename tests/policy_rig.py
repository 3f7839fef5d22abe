"""The tau2 retail rig of the agent-policy tests (test_policies_*.py): the tasks they use, trial
specs, a fault injector that faults exactly the deliveries a test names, a policy wrapper that
records what the agent loop hands it, and `rig_runs`, behind the `rig` fixture of conftest.py:
one task run through `run_agent` on a hand-made rig, recording the calls that reached the DB.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from typing import Any

from harness.agents.policies import AgentConfig, Decision, Failure, Policy, make_policy
from harness.agents.task import AgentOutcome, AgentPolicy, Step, run_agent
from harness.experiment.trial import TrialSpec
from harness.modes.base import AgentContext, ModeSettings
from harness.modes.registry import get_mode
from harness.workloads.retail import db_sha256, fresh_db, goal_db, gold_actions, load_retail
from harness.workloads.retail.substrate import RETAIL_TOOLS
from harness.workloads.retail.workload import TauRetailWorkload
from harness.world.boundary import Boundary
from harness.world.clock import VirtualClock
from harness.world.faults import FaultClass, FaultConfig, FaultInjector, InjectedFault, Point, Role
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

WORKLOAD = TauRetailWorkload()
TASKS = WORKLOAD.tasks({})  # the default test split sample, as run_trial sees it
TRIAL = {task["id"]: index for index, task in enumerate(TASKS)}
DATA = load_retail()
INITIAL = db_sha256(fresh_db(DATA))

# Tasks the tests use (tau2 retail ids; their gold actions, R = read, W = write):
CANCEL = "90"  # W cancel_pending_order
CANCEL_THEN_MODIFY = "74"  # W cancel_pending_order, W modify_pending_order_items
READS_THEN_CANCEL = "32"  # R x8, W cancel (step 8), R, W cancel, R, W return
ZERO = {"retry": 0.0, "alter": 0.0, "carry_on": 0.0, "replan": 0.0, "give_up": 0.0}
WEIGHTS = tuple(ZERO)


def only(reaction: str, **more: Any) -> AgentConfig:
    """An llm-like agent that always reacts with `reaction`."""
    return AgentConfig(kind="llm-like", **{**ZERO, reaction: 1.0, "max_steps": 30, **more})


def spec(
    mode: str,
    task_id: str | None = None,
    *,
    trial: int | None = None,
    agent: AgentConfig | None = None,
    faults: FaultConfig | None = None,
    seed: int = 1,
) -> TrialSpec:
    index = TRIAL[task_id] if task_id is not None else trial
    assert index is not None
    return TrialSpec(
        "policies", "tau_retail", mode, "cell", {}, index, seed,
        faults=faults or FaultConfig(), agent=agent or AgentConfig(),
    )


def strip(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "timings"}


def goal_sha(task_id: str) -> str:
    return goal_db(DATA, TASKS[TRIAL[task_id]]).sha256


# ------------------------------------------------------------------------------ a rig


class Scripted(FaultInjector):
    """`script[(point, site)]` is the set of occurrences of that event to fault, with a class.

    Occurrences are counted per (point, role, site), as the real injector counts them, and a
    script faults the call's own deliveries (role CALL) only, never an auxiliary round trip.
    """

    def __init__(self, script: dict[tuple[Point, str], tuple[FaultClass, set[int]]] | None = None) -> None:
        super().__init__(FaultConfig(rate=0.0), seed=0, cell="scripted", trial=0)
        self.script = script or {}
        self.asked: dict[tuple[Point, Role, str], int] = {}

    def decide(
        self, point: Point, site: str, *, role: Role = Role.CALL, agent: str = "",
        meta: dict[str, Any] | None = None,
    ) -> FaultClass | None:
        point, role = Point(point), Role(role)
        occurrence = self.asked.get((point, role, site), 0)
        self.asked[(point, role, site)] = occurrence + 1
        index, self.events = self.events, self.events + 1
        fault, when = self.script.get((point, site), (None, set()))
        if fault is None or role is not Role.CALL or occurrence not in when:
            return None
        self.injected.append(InjectedFault(index, point, site, fault, occurrence, {}, agent, role))
        return fault

    def calls(self, site: str | None = None) -> int:
        """Forward deliveries that reached the boundary (of one site, or all; every role)."""
        return sum(n for (p, _, s), n in self.asked.items() if p is Point.CALL and site in (None, s))


@dataclasses.dataclass
class Run:
    outcome: AgentOutcome
    env: TrialEnv
    injector: Scripted
    delivered: list[tuple[str, dict[str, Any]]]  # (tool, args) of calls that reached the DB

    @property
    def sha(self) -> str:
        return self.env.extra["retail"].snapshot()["db_sha256"]

    def ops(self, op_id: str, kind: str) -> list[Any]:
        return [op for op in self.env.oplog.ops() if op.meta.get("op") == op_id and op.kind == kind]


class Recording:
    """A policy wrapper recording every failure the agent loop hands it."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_steps = inner.max_steps
        self.wrapper_retries = inner.wrapper_retries
        self.seen: list[Failure] = []
        self.decided: list[Decision] = []

    def mistake(self, writes: Any, rng: random.Random) -> Any:
        return self.inner.mistake(writes, rng)

    def react(self, failure: Failure, rng: random.Random) -> Decision:
        self.seen.append(failure)
        decision = self.inner.react(failure, rng)
        self.decided.append(decision)
        return decision


def site(task_id: str, step: int) -> str:
    return f"a0/task{task_id}/{step}"


def failing(task_id: str, step: int, fault: FaultClass = FaultClass.F1, times: int = 1) -> Scripted:
    """Fault the first `times` deliveries of one step of the task."""
    return Scripted({(Point.CALL, site(task_id, step)): (fault, set(range(times)))})


def rig_runs() -> Iterator[Any]:
    """The `rig` fixture (conftest.py): yields `run(mode, task_id, injector=None, *, agent,
    behaviour, policy, steps, validate) -> Run`; closes the trial environments afterwards."""
    envs: list[TrialEnv] = []

    def run(
        mode: str,
        task_id: str,
        injector: Scripted | None = None,
        *,
        agent: AgentConfig | None = None,
        behaviour: Policy | None | str = "config",
        policy: AgentPolicy | None = None,
        steps: tuple[Step, ...] | None = None,
        validate: tuple[int, ...] = (),
    ) -> Run:
        scenario = WORKLOAD.scenario(random.Random(0), TRIAL[task_id], {})
        env = TrialEnv.create()
        envs.append(env)
        scenario.setup(env)
        clock = VirtualClock()
        injector = injector or Scripted()
        boundary = Boundary(clock, injector, latency_ms=5.0, jitter_ms=0.0, rng=random.Random(0))
        settings = ModeSettings()
        trial = get_mode(mode).factory(env, clock, settings)
        policy = policy or scenario.policy
        if behaviour == "config":
            behaviour = make_policy(
                agent or AgentConfig(), mode,
                step_retries=policy.step_retries, tool_errors_fatal=policy.tool_errors_fatal,
            )
        delivered: list[tuple[str, dict[str, Any]]] = []

        def recorded(tool: ToolDef) -> ToolDef:
            def run_tool(env: TrialEnv, args: dict[str, Any], d: Delivery, tool: ToolDef = tool) -> Any:
                delivered.append((tool.name, dict(args)))
                return tool.run(env, args, d)

            return dataclasses.replace(tool, run=run_tool)

        tools = {name: recorded(tool) for name, tool in RETAIL_TOOLS.items()}
        task = scenario.tasks[0]
        if steps is not None:
            task = dataclasses.replace(task, steps=steps)
        if validate:
            task = dataclasses.replace(task, validate=validate)

        def make_ctx(attempt: int) -> AgentContext:
            return AgentContext("a0", attempt, f"policies/a0/{attempt}", env, clock, boundary, settings)

        agent_task = clock.spawn(
            run_agent(trial, make_ctx, task, tools, policy, random.Random(1), behaviour,  # type: ignore[arg-type]
                      random.Random(2)),
            "a0",
        )
        clock.run()
        if agent_task.error is not None:
            raise agent_task.error
        return Run(agent_task.result, env, injector, delivered)

    yield run
    for env in envs:
        env.close()


def gold_args(task_id: str, step: int) -> dict[str, Any]:
    return dict(gold_actions(TASKS[TRIAL[task_id]])[step]["arguments"])


def failure(kind: str = "error", tries: int = 1, *, read_only: bool = False, step: int = 3) -> Failure:
    return Failure(step, "cancel_pending_order", kind, "call failed", tries, read_only)  # type: ignore[arg-type]

"""What the scripted proxy workloads (`webshop`, `desktop`) share: a bank of tasks drawn from a
seed, the goal state a task's gold plan leaves, and the one-agent scenario built from them.

A proxy module supplies its task makers (kind -> plan), its substrate setup and its tools;
everything else, and so every rule about what a clean trial is, lives here once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.base import Scenario, WorkloadParams
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

Maker = Callable[[random.Random], tuple[str, list[Step]]]


@dataclass(frozen=True, slots=True)
class ScriptedTask:
    """One task of a bank: its kind, its gold plan and the request in a few words."""

    kind: str
    task: Task
    request: str


class ScriptedParams(WorkloadParams):
    """`params` of a scripted proxy workload: the bank's size and seed, the gold agent's
    retries. Trial t performs task t mod `tasks`."""

    tasks: int = Field(30, ge=20, le=40)
    task_seed: int = Field(0, ge=0, le=2**31 - 1)
    step_retries: int = Field(2, ge=0, le=20)


def draw_bank(
    makers: Mapping[str, Maker], kinds: Sequence[str], size: int, seed: int, *, name: str,
    prefix: str,
) -> list[ScriptedTask]:
    """`size` tasks, the kinds in turn, drawn from `random.Random(f"{name}-tasks/{seed}")`: a
    pure function of (size, seed), so every mode, cell and trial naming a task gets its plan."""
    rng = random.Random(f"{name}-tasks/{seed}")
    bank = []
    for i in range(size):
        kind = kinds[i % len(kinds)]
        request, steps = makers[kind](rng)
        bank.append(ScriptedTask(kind, Task(f"{prefix}{i:02d}-{kind}", tuple(steps)), request))
    return bank


def replay_goal(
    task: Task, setup: Callable[[TrialEnv], None], tools: Mapping[str, ToolDef]
) -> dict[str, Any]:
    """The substrates after the task's gold plan ran once, directly (no faults, no mode):
    where a clean trial ends. A refused gold step raises."""
    env = TrialEnv.create()
    try:
        setup(env)
        for step in task.steps:
            args = dict(step.args) if not callable(step.args) else step.args({})
            tools[step.tool].run(env, args, Delivery(None, {}))
        return env.snapshot()
    finally:
        env.close()


def scripted_scenario(
    scripted: ScriptedTask,
    *,
    setup: Callable[[TrialEnv], None],
    goal: Callable[[Task], dict[str, Any]],
    step_retries: int,
    metrics: Callable[[TrialEnv, list[AgentOutcome]], dict[str, Any]] | None = None,
) -> Scenario:
    """One agent performing one scripted task; it reads a tool's refusal (an error page, an
    error dialog) and goes on, as a UI agent does."""
    task = scripted.task
    return Scenario(
        tasks=[task],
        setup=setup,
        expected=lambda: goal(task),
        policy=AgentPolicy(step_retries=step_retries, tool_errors_fatal=False),
        final=lambda env: {"task": task.task_id, "kind": scripted.kind, "request": scripted.request},
        metrics=metrics,
        info={"task": task.task_id, "kind": scripted.kind},
    )

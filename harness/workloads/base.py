"""What a workload provides: tools, and per trial a scenario (tasks, setup, judgement)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.agent import AgentOutcome, AgentPolicy, Task
from harness.substrates import TrialEnv
from harness.tooling import ToolDef


@dataclass
class Scenario:
    """One trial's work: a task per agent, how to set the substrates up, and how to judge.

    `expected` returns the goal snapshot (None: judged by invariants only); `invariants`
    counts violations from the final substrates and what the agents observed.
    """

    tasks: list[Task]
    setup: Callable[[TrialEnv], None]
    expected: Callable[[], dict[str, Any]] | None = None
    invariants: Callable[[TrialEnv, list[AgentOutcome]], int] | None = None
    policy: AgentPolicy = field(default_factory=AgentPolicy)
    start_offsets_ms: list[float] | None = None
    final: Callable[[TrialEnv], dict[str, Any]] | None = None  # extra facts for the record
    info: dict[str, Any] = field(default_factory=dict)


class Workload(Protocol):
    """A named family of tasks over the trial substrates."""

    name: str
    description: str
    tools: Mapping[str, ToolDef]

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario: ...

"""What a workload provides: tools, and per trial a scenario (tasks, setup, judgement)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from atomix.schemas import ToolSchema
from harness.agents.task import AgentOutcome, AgentPolicy, Task
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolDef


@dataclass
class Scenario:
    """One trial's work: a task per agent, how to set the substrates up, and how to judge.

    `expected` returns the goal snapshot (None: judged by invariants only); `invariants`
    counts violations from the final substrates and what the agents observed.

    For an agent that plans by itself (`agent.kind: llm`): `tool_schemas` are the tools it is
    offered (each names one of the workload's tools), `domain_policy` the rules it is told to
    follow (tau2's policy.md); each task's `ticket` says what to do.
    """

    tasks: list[Task]
    setup: Callable[[TrialEnv], None]
    expected: Callable[[], dict[str, Any]] | None = None
    invariants: Callable[[TrialEnv, list[AgentOutcome]], int] | None = None
    policy: AgentPolicy = field(default_factory=AgentPolicy)
    start_offsets_ms: list[float] | None = None
    final: Callable[[TrialEnv], dict[str, Any]] | None = None  # extra facts for the record
    # Extra metrics of the trial (name -> number or bool), merged into the record's metrics;
    # a name must not shadow a generic one.
    metrics: Callable[[TrialEnv, list[AgentOutcome]], dict[str, Any]] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    tool_schemas: tuple[ToolSchema, ...] = ()
    domain_policy: str = ""
    # The task's own reward beyond the oracle's goal (tau2's components on tau_retail): returns
    # {"passed": bool, "components": {name: True | False | None (not applicable) | str (not
    # judged, and why)}, "failed": [names]}; a trial is clean only when it passed.
    reward: Callable[[TrialEnv, list[AgentOutcome]], dict[str, Any]] | None = None
    # Where the final substrates differ from the goal, for a workload whose snapshot holds only
    # a digest (tau_retail: a DB hash): `harness.world.statediff.diff_states` entries whose
    # paths start with the snapshot key they explain (e.g. "retail."). None: the snapshots'
    # own difference says it.
    goal_diff: Callable[[TrialEnv], list[dict[str, Any]]] | None = None


def _check_delay(v: list[float]) -> list[float]:
    if not 0.0 <= v[0] <= v[1] <= 1e9:
        raise ValueError(f"must be [low, high] with 0 <= low <= high <= 1e9 ms, got {v}")
    return v


#: A `[low, high]` range of simulated milliseconds from which an agent's planning delay is
#: drawn; the type of every workload's `plan_delay_ms`.
DelayRange = Annotated[list[float], Field(min_length=2, max_length=2), AfterValidator(_check_delay)]


class WorkloadParams(BaseModel):
    """Base of every workload's `params` model: what `validate` accepts, the scenario runs.

    Unknown keys are refused; values are taken strictly as written (no "4" for 4, no true
    for 1, no 3.0 for an integer; an integer is a valid float); NaN and infinities are
    refused. A model that needs the workload's data to decide (e.g. a sample larger than its
    split) checks it in a model validator, so a grid cell is refused as early as the file.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class Workload(Protocol):
    """A named family of tasks over the trial substrates; `Params` validates `params`.

    A workload whose trials probe a mechanism rather than judge an agent's task (its goal and
    invariants hold whatever the agent does, as in aliasing or leakage) sets the class
    attribute `probes_mechanism = True`; the do-nothing control (`agent.kind: noop`) is then
    refused for it, since an idle agent there would read as clean.
    """

    name: str
    description: str
    tools: Mapping[str, ToolDef]
    Params: ClassVar[type[WorkloadParams]]

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario: ...

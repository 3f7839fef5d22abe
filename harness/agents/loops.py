"""Agent loops by `agent.kind`: how a trial runs each task's agent and what the agent adds to
the record. A new kind of agent is a class here (or in its own module) plus one registry line;
`harness.experiment.trial` never asks which kind it runs.

- `scripted` (kinds `gold`, `llm-like`): `harness.agents.task.run_agent` with the kind's policy.
- `llm` (`harness.agents.llm`): a real model; imported only when a config asks for it, since it
  is the one agent that needs an SDK.
- `noop` (`harness.agents.noop`): the do-nothing control; any agent-level config runs it with
  `--set agent.kind=noop`, or beside its agent as a grid axis `agent.kind: [llm-like, noop]`.

A row's `meta["needs"]` maps each package the kind imports beyond the main install to how to
install it; `missing_packages` says which of them cannot be imported here.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from harness.agents.policies import make_policy
from harness.agents.task import AgentOutcome, run_agent
from harness.modes.base import AgentContext, TrialMode
from harness.registry import Entry, Registry
from harness.world.tooling import ToolDef

__all__ = ["LOOPS", "AgentLoop", "ScriptedLoop", "make_loop", "missing_packages"]


class AgentLoop(Protocol):
    """Runs one task's agent in a trial; the same loop serves every task of the trial.
    `metrics`, `record` and `timings` add the kind's own facts (nothing for scripted agents);
    `timings` is the only part that may differ between identical runs."""

    async def run(
        self, trial_mode: TrialMode, make_ctx: Callable[[int], AgentContext], task: Any,
        rng: random.Random, reactions: random.Random,
    ) -> AgentOutcome: ...

    def metrics(self, outcomes: list[AgentOutcome]) -> dict[str, Any]: ...

    def record(self, outcome: AgentOutcome) -> dict[str, Any]: ...

    def timings(self, outcomes: list[AgentOutcome]) -> dict[str, Any]: ...


class ScriptedLoop:
    """A task's plan performed step by step; the kind's policy reacts to failed calls."""

    def __init__(self, spec: Any, scenario: Any, tools: Mapping[str, ToolDef]) -> None:
        self.tools = tools
        self.policy = scenario.policy
        self.behaviour = make_policy(
            spec.agent, spec.mode, step_retries=scenario.policy.step_retries,
            tool_errors_fatal=scenario.policy.tool_errors_fatal,
        )

    async def run(
        self, trial_mode: TrialMode, make_ctx: Callable[[int], AgentContext], task: Any,
        rng: random.Random, reactions: random.Random,
    ) -> AgentOutcome:
        return await run_agent(trial_mode, make_ctx, task, self.tools, self.policy, rng,
                               self.behaviour, reactions)

    def metrics(self, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        return {}

    def record(self, outcome: AgentOutcome) -> dict[str, Any]:
        # The wrong action the agent made with no fault (agent.intrinsic_error), when it made
        # one; records of agents that make none stay as they were.
        return {"mistake": outcome.mistake} if outcome.mistake is not None else {}

    def timings(self, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        return {}


#: agent.kind -> its loop class (built once per trial).
LOOPS: Registry[Any] = Registry("agent kind", [
    Entry("gold", "harness.agents.loops:ScriptedLoop", "replays each task's gold actions"),
    Entry("llm-like", "harness.agents.loops:ScriptedLoop",
          "a seeded stochastic model of how LLM agents react to errors (harness.agents.policies)"),
    Entry("llm", "harness.agents.llm:LlmLoop",
          "a real model behind an OpenAI-compatible endpoint (needs pip install '.[llm]')",
          {"needs": {"openai": "pip install '.[llm]'"}}),
    Entry("noop", "harness.agents.noop:NoopLoop",
          "the do-nothing control: stops at once, no call, no message (harness.agents.noop)"),
])


def missing_packages(kind: str) -> dict[str, str]:
    """Package -> how to install it, for each package agent kind `kind` needs (its row's
    `meta["needs"]`) that cannot be imported; {} when none is missing or the kind is unknown
    (loading the config names an unknown kind)."""
    if kind not in LOOPS:
        return {}
    missing: dict[str, str] = {}
    for package, install in LOOPS.entry(kind).meta.get("needs", {}).items():
        try:
            importlib.import_module(package)
        except ImportError:
            missing[package] = install
    return missing


def make_loop(spec: Any, scenario: Any, tools: Mapping[str, ToolDef]) -> AgentLoop:
    """The loop of `spec.agent.kind` for one trial (`spec` a TrialSpec)."""
    loop: AgentLoop = LOOPS[spec.agent.kind](spec, scenario, tools)
    return loop

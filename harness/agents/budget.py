"""The agent's part of a trial's delivery budget: how often the agent (and the integration's
wrapper below it) may try again, whatever the mode does.

A mode declares its own part (`harness.modes.base.RetryBudget`); the trial record holds both
(`budget`), and table captions print them, so a comparison says what each side was allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.agents.policies import AgentConfig

__all__ = ["AgentBudget", "agent_budget"]


@dataclass(frozen=True, slots=True)
class AgentBudget:
    """The agent's retry bounds in one trial under one mode.

    `step_retries`: the gold agent's retries of a failed call before it restarts; None when
    the agent decides each time (llm-like draws its reaction, a real model chooses), whose
    caps are then `max_steps` (tool calls in all, repeats included; None: unlimited) and
    `max_attempts` (attempts at the whole plan: restarts and checkpoint resumes).
    `wrapper_retries`: retries of a failed call made below the agent for this mode
    (`agent.wrapper_retries`, `agent.wrapper_retries_by_mode`).
    """

    kind: str
    step_retries: int | None
    max_attempts: int
    max_steps: int | None
    wrapper_retries: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "step_retries": self.step_retries,
            "max_attempts": self.max_attempts,
            "max_steps": self.max_steps,
            "wrapper_retries": self.wrapper_retries,
        }

    def compact(self) -> str:
        """`llm-like (retries drawn; max_steps 30, 4 attempts)`; the wrapper, which may differ
        between modes, is said with each mode's part."""
        return compact_agent(self.as_dict())


def compact_agent(agent: dict[str, Any]) -> str:
    """The compact text of an agent budget as a record stores it (`AgentBudget.as_dict`)."""
    kind, retries = agent.get("kind", "?"), agent.get("step_retries")
    if retries == 0:
        how = "no retries of a failed call"
    elif retries is not None:
        how = f"retries a failed call {retries}×"
    elif kind == "llm-like":
        how = "retries drawn"
    else:
        how = "retries as it decides"
    steps, attempts = agent.get("max_steps"), agent.get("max_attempts", "?")
    cap = f"max_steps {steps}, " if steps is not None else ""
    return f"{kind} ({how}; {cap}{attempts} attempt{'' if attempts == 1 else 's'})"


def agent_budget(
    config: AgentConfig, mode: str, *, step_retries: int, max_attempts: int
) -> AgentBudget:
    """The agent's part of the budget under `mode`. `step_retries` and `max_attempts` are the
    workload's agent knobs (`harness.agents.task.AgentPolicy`); only `gold` retries a fixed
    number of times."""
    return AgentBudget(
        kind=config.kind,
        step_retries=step_retries if config.kind == "gold" else None,
        max_attempts=max_attempts,
        max_steps=config.max_steps,
        wrapper_retries=config.wrapper_retries_for(mode),
    )

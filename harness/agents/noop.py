"""The do-nothing control (`agent.kind: noop`): an agent that stops at once, as tau2's agent
does when it calls `done` first. It issues no tool call and says nothing to the user; its
transaction is opened and committed empty, so every mode sees an ordinary, finished attempt.

What it scores is the floor a workload's scoring gives to doing nothing: a row of it beside
a real agent says how much of that agent's success an idle agent would get too. On
tau_retail, whose reward also asks for the information a task must communicate
(harness.workloads.retail.reward), that floor is the share of tasks whose correct outcome is
to change nothing and tell nothing checkable; `atomix run` with `--set agent.kind=noop`
measures it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.agents.task import AgentOutcome, Task, settle_attempt
from harness.modes.base import Aborted, AgentContext, TrialMode
from harness.world.tooling import ToolDef

__all__ = ["NoopLoop", "NoopOutcome"]


@dataclass(slots=True)
class NoopOutcome(AgentOutcome):
    """A noop agent's outcome: no call, no message (its messages to the user are none)."""

    def messages_to_user(self) -> list[str]:
        """What the agent told the user: nothing."""
        return []

    def tools_called(self) -> list[str]:
        """The tools whose calls succeeded: none."""
        return []


class NoopLoop:
    """`agent.kind: noop` as a trial runs it: one empty, committed attempt per task."""

    def __init__(self, spec: Any, scenario: Any, tools: Mapping[str, ToolDef]) -> None:
        self.policy = scenario.policy

    async def run(
        self, trial_mode: TrialMode, make_ctx: Callable[[int], AgentContext], task: Task,
        rng: random.Random, reactions: random.Random,
    ) -> AgentOutcome:
        outcome = NoopOutcome(agent="", task_id=task.task_id)
        ctx = make_ctx(1)
        outcome.agent = ctx.agent
        outcome.attempts = 1
        session = trial_mode.session(ctx)
        try:
            await session.begin()
            await settle_attempt(session, task, outcome, 1)
        except Aborted as exc:  # a mode may refuse even an empty transaction
            outcome.aborts.append(exc.source.value)
            outcome.failure = str(exc)
        outcome.reported_residue += getattr(session, "reported_residue", 0)
        outcome.blocked_ms += ctx.blocked_ms
        outcome.finished_at_ms = ctx.clock.now
        return outcome

    def metrics(self, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        return {}

    def record(self, outcome: AgentOutcome) -> dict[str, Any]:
        return {}

    def timings(self, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        return {}

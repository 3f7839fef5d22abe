"""`no-tx`: call tools directly, as most agent orchestrators do today.

Mechanism: every call goes straight to the substrate when the agent makes it; a tool's
return is taken as final settlement. There is no transaction: commit does nothing and an
abort retracts nothing. The agent's own loop retries a failed step.
Known failures: partial effects after a fault, duplicates after an ambiguous failure or a
duplicated delivery (no idempotency keys), leaked irreversible sends, lost updates under
contention.
Measured (seed 2026, llm-like agent with max_steps=30; clean % at fp=0.10/0.30 on
tau_retail and tau_retail_notify, N=30; run-clean % on tau_stress at F2/F4-only 0.10 and
mixed 0.10/0.30, N=100/100/300/300):
Wins: nothing; it is the floor.
Loses: 90/67 on tau_retail (9 effects of abandoned tasks left, none reported), 77/47 with
notifications, 0/0/3/2 on tau_stress.
"""

from __future__ import annotations

from typing import Any

from atomix.effects import AbortSource
from harness.modes.base import AgentContext, ModeSession, TrialMode, register
from harness.world.tooling import ToolCall


class DirectSession(ModeSession):
    """Executes each call at once, without keys; nothing to commit or undo."""

    async def call(self, call: ToolCall) -> Any:
        return await self.call_directly(call)

    async def commit(self) -> None:
        return None

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        return None


class NoTxTrial(TrialMode):
    def session(self, ctx: AgentContext) -> DirectSession:
        return DirectSession(self, ctx)


register("no-tx", "direct tool calls; the agent retries a failed step", NoTxTrial)

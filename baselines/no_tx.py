"""`no-tx`: call tools directly, as most agent orchestrators do today.

Mechanism: every call goes straight to the substrate when the agent makes it; a tool's
return is taken as final settlement. There is no transaction: commit does nothing and an
abort retracts nothing. The agent's own loop retries a failed step.
Known failures: partial effects after a fault, duplicates after an ambiguous failure or a
duplicated delivery (no idempotency keys), leaked irreversible sends, lost updates under
contention.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures):
Wins: nothing; it is the floor.
Loses: on tau_retail the effects of abandoned tasks stay applied, none reported (the
`residue` table); with notifications it leaks and duplicates mails; on tau_stress it loses
updates.
"""

from __future__ import annotations

from typing import Any

from atomix.effects import AbortSource
from harness.modes.base import AgentContext, ModeSession, TrialMode
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

"""`per-call-lock`: lock only the scopes of each single tool call, around that call.

Mechanism: before a call, take exclusive locks on the scopes it reads and writes (one
all-at-once FIFO request on the trial's lock manager); deliver it directly, without a key;
release right after it returns or fails. No lock outlives a call, so waits are short and no
deadlock is possible; nothing is buffered, gated or rolled back.
Known failures: a read-modify-write workflow (read in one call, write what it computed in a
later one) interleaves with another between its calls and loses an update; partial effects
after a fault, duplicates after F2/F4 (no keys), sends of aborted runs stay sent.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures with `--modes per-call-lock,no-tx`, since none of them lists this mode):
Wins: no waits to speak of (the `wait` table).
Loses: a read-modify-write spans two calls, so updates are lost on tau_stress; on
tau_retail_notify it leaks and duplicates mails as no-tx does (no keys, no gate).
"""

from __future__ import annotations

from typing import Any

from atomix.effects import AbortSource
from harness.modes.base import AgentContext, ModeSession, ModeSettings, TrialMode
from harness.modes.locks import LockManager
from harness.world.clock import VirtualClock
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolCall


class PerCallLockSession(ModeSession):
    """Each call runs alone on its scopes; nothing spans two calls.

    Guarantees: no two calls with overlapping scopes (under this trial's lock manager) run
    at the same time. Nothing about the workflow as a whole.
    """

    trial: PerCallLockTrial

    async def call(self, call: ToolCall) -> Any:
        ctx, tool, args, locks = self.ctx, call.tool, call.args, self.trial.locks
        # A lock time-out raises Aborted(TIMEOUT) with nothing held: no clean-up needed.
        await locks.acquire(ctx, [*tool.reads(ctx.env, args), *tool.writes(ctx.env, args)])
        try:
            # The call's latency (and a stall) is spent holding the lock, as it would be.
            return await self.call_directly(call)
        finally:
            locks.release(ctx.trace)

    async def commit(self) -> None:
        return None

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        # Effects stay applied; no lock is held between calls.
        self.trial.locks.release(self.ctx.trace)


class PerCallLockTrial(TrialMode):
    """One lock table shared by every agent of the trial."""

    def __init__(self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> None:
        super().__init__(env, clock, settings)
        self.locks = LockManager(clock)

    def session(self, ctx: AgentContext) -> PerCallLockSession:
        return PerCallLockSession(self, ctx)

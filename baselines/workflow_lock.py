"""`workflow-lock`: lock every resource the workflow may touch, for its whole duration.

Mechanism: `begin` takes exclusive locks on the declared footprint (`ctx.extra
["declared_scopes"]`) in one all-at-once FIFO request; calls go straight to the substrates,
without keys; commit or abort releases. A scope outside the declared set is locked on the
spot (2PL growing phase; two workflows doing that can deadlock until the time-out breaks
it). Locking gives isolation, not atomicity: nothing is buffered, gated or rolled back.
Known failures: serialises every pair of workflows whose footprints overlap, however briefly
they really share a scope (long waits, lock time-outs under contention); partial effects
after a fault, duplicates after F2/F4 (no keys), sends of aborted runs stay sent.
Versus the paper: Table 1 gives Workflow-Lock 44.9/104.7 ms of wait on *disjoint* tasks
(4/8 agents), the very numbers of its single-global-lock ablation (Table 10), and Table 13
a throughput of 1.00 at every overlap: that lock was global. This one locks the declared
footprint scope by scope, so disjoint workflows never wait (`atomix run
configs/tau_disjoint.yaml`); overlapping ones serialise as in the paper, without invariant
violations (`atomix run configs/tau_contention.yaml`, 4 agents on 2 orders: its `wait` and
`invariants` tables).
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures, tau_retail_notify with `--modes workflow-lock`, since it does not list this
mode):
Wins: isolation by locks: no stale commit on tau_stress, where the baselines without
isolation lose updates.
Loses: waits (tau_stress's `wait` table); no keys and no gate: on tau_retail_notify it leaks
and duplicates mails as no-tx does, and under F2-only on tau_stress a retried send is
duplicated.
"""

from __future__ import annotations

from typing import Any

from atomix.effects import AbortSource
from harness.modes.base import Aborted, AgentContext, ModeSession, ModeSettings, TrialMode
from harness.modes.locks import LockManager
from harness.world.clock import VirtualClock
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolCall


class WorkflowLockSession(ModeSession):
    """One workflow attempt holding its footprint's locks from `begin` to commit/abort.

    Guarantees: while this attempt runs, no other attempt of any locking mode on the same
    `LockManager` holds a scope overlapping anything it has touched or declared (so its
    tool calls are isolated). It does not guarantee all-or-nothing effects.
    """

    trial: WorkflowLockTrial

    async def begin(self) -> None:
        await self._lock(self.ctx.extra.get("declared_scopes", ()))

    async def _lock(self, scopes: Any) -> None:
        try:
            await self.trial.locks.acquire(self.ctx, scopes)
        except Aborted:
            # The agent does not call abort() after Aborted: release what we hold ourselves.
            self.trial.locks.release(self.ctx.trace)
            raise

    async def call(self, call: ToolCall) -> Any:
        env, tool, args = self.ctx.env, call.tool, call.args
        # Normally a no-op (re-entrant: the footprint is already held); a scope outside the
        # declared footprint is locked here, in the middle of the workflow.
        await self._lock([*tool.reads(env, args), *tool.writes(env, args)])
        return await self.call_directly(call)

    async def commit(self) -> None:
        self.trial.locks.release(self.ctx.trace)

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        # Nothing to undo: the effects stay where they landed. Only the locks go.
        self.trial.locks.release(self.ctx.trace)


class WorkflowLockTrial(TrialMode):
    """One lock table shared by every agent of the trial."""

    def __init__(self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> None:
        super().__init__(env, clock, settings)
        self.locks = LockManager(clock)

    def session(self, ctx: AgentContext) -> WorkflowLockSession:
        return WorkflowLockSession(self, ctx)

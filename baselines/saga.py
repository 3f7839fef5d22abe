"""`saga`: execute every call eagerly; on abort run compensation handlers in reverse.

Mechanism: each call reaches its substrate when made, irreversible ones too (no gate), without
idempotency keys. Each revocable call records a handler (`tool.before` captured just before
the call, `tool.undo` to restore it), also when an ambiguous F2 may have applied it. Abort runs
the handlers newest-first; one that fails (F3) is logged and counted in `reported_residue`
and the rest still run. Commit does nothing; there is no isolation.
This is a hand-rolled orchestration saga: a Temporal-style saga, whose engine deduplicates a
retried activity, would not re-apply a step the agent retries after F2; this one does.
Known failures: a send before the abort leaks (it has no handler and is not reported), a
retried F2 or a duplicated delivery is a duplicate once committed, a failed compensation
leaves (reported) residue, lost updates and dirty reads under contention.
Versus the paper: Table 9 has saga 100% clean at F2-only fp=0.10 on the synthetic workload;
here it is lower (`atomix reproduce --tables 9` shows it), because the agent retries
a step whose call landed and nothing dedups it. Table 15 has 0 saga leaks on pre-commit veto;
here a veto comes after the plan ran, so an eager send has already left and leaks like under
any other abort source (`atomix run configs/leakage.yaml`).
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures):
Wins: compensation makes a give-up clean of writes where it succeeds, so tau_retail's
`residue` table holds less for it than for no-tx (a failed compensation still leaves residue).
Loses: its clean rate on tau_retail is no-tx's; with notifications it leaks and duplicates
mails (sends leave at once and retries have no key); on tau_stress it loses updates (its
`stale` table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atomix.effects import AbortSource, EffectClass
from harness.modes.base import AgentContext, ModeSession, TrialMode
from harness.world import faults
from harness.world.tooling import Delivery, ToolCall


@dataclass(frozen=True, slots=True)
class Compensation:
    """One recorded handler: undo `call` back to `before`, logged as an undo of its op."""

    call: ToolCall
    before: Any
    delivery: Delivery


class SagaSession(ModeSession):
    """Eager execution with reverse-order compensation at abort.

    Guarantees: after `abort`, every revocable effect whose handler did not fail has been
    restored to its before-image, newest first; the number of handlers that failed is in
    `reported_residue`. Nothing else (no dedup, no gating, no isolation).
    """

    # Its abort compensates what the attempt ran, so the agent may start over; a compensation
    # that fails leaves residue (counted in `reported_residue`), and a sent mail stays sent.
    restarts_after_abort = True

    def __init__(self, trial: TrialMode, ctx: AgentContext) -> None:
        super().__init__(trial, ctx)
        self.compensations: list[Compensation] = []
        self.reported_residue = 0

    async def call(self, call: ToolCall) -> Any:
        ctx, tool, args, site = self.ctx, call.tool, call.args, call.op_id
        env, boundary = ctx.env, ctx.boundary
        if tool.effect is None:
            return await self.call_directly(call)  # a read: no key, nothing to undo
        delivery = Delivery(None, ctx.meta(site, idem=tool.idempotent))
        revocable = tool.effect is not EffectClass.IRREVERSIBLE
        # The before-image must be taken before the forward call, or it would capture the
        # effect itself; taking it is a local read by the handler's author, not a delivery.
        before = tool.before(env, args) if revocable and tool.before is not None else None
        undo = Delivery(None, {**delivery.meta, "undo": True})
        try:
            result = boundary.deliver(site, lambda: tool.run(env, args, delivery))
        except faults.ToolFault:
            # A failed call may have landed (nothing says whether): compensable all the same.
            if revocable:
                self.compensations.append(Compensation(call, before, undo))
            raise
        finally:
            await boundary.pay()
        if revocable:
            self.compensations.append(Compensation(call, before, undo))
        return result

    async def commit(self) -> None:
        # Every effect is already applied; a saga's commit is just forgetting the handlers.
        self.compensations.clear()

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        ctx = self.ctx
        pending, self.compensations = self.compensations, []
        for comp in reversed(pending):
            if not self.undo(comp.call, comp.before, comp.delivery):
                # A saga logs a failed handler and carries on with the others; the effect it
                # should have undone stays applied, and the saga's users are told how many.
                self.reported_residue += 1
            await ctx.boundary.pay()


class SagaTrial(TrialMode):
    def session(self, ctx: AgentContext) -> SagaSession:
        return SagaSession(self, ctx)

"""`tcc`: try / confirm / cancel per call; every confirm is sent when the agent commits.

Mechanism: reads run at once. An effect-bearing call is *tried*: a round trip delivering the
tool's `check` (validate, no effect) or a no-op, answered by an acknowledgement. Commit
*confirms* the tried calls in order, each under its own idempotency key, tried up to
`budget.confirm` times in all (natively `settings.apply_attempts`, as Atomix's commit-time
apply; a config's `retries:` may set it) with exponential backoff; a confirm that still fails
stops the rest, those confirmed stay, and the transaction aborts (not retryably). Abort
*cancels*.
The substrates have no reservation primitive, so a try holds nothing and a cancel needs no
round trip; a confirm can thus fail a precondition that held at try time (a slot filled
meanwhile) where a service with real reservations would have refused the try instead.
Known failures: partial commit when a confirm fails after others were confirmed; lost updates
and stale plans under contention (confirms are neither ordered per resource nor validated
against what was read); no read-your-writes inside a transaction.
Versus the paper: single-agent synthetic runs are clean under F1, F2 and F4 alike (keys make
confirms idempotent); the paper's lower TCC figures come from contended and real-LLM workloads.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures):
Wins: nothing leaves before commit and confirms carry keys: no leaked and no duplicated
mail on tau_retail_notify.
Loses: a write whose try failed is never confirmed if the agent carries on past it (on
tau_retail, after an F2 on a write, where under tx-full the same failed call had landed, so
carrying on was right there); no isolation: on tau_stress updates are lost (its `stale`
table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atomix.effects import AbortSource
from atomix.tools import Ack
from harness.modes.base import (
    Aborted,
    AgentContext,
    ModeSession,
    ModeSettings,
    RetryBudget,
    TrialMode,
)
from harness.world import faults
from harness.world.clock import Sleep
from harness.world.tooling import Delivery, ToolCall, ToolError


@dataclass(frozen=True, slots=True)
class Tried:
    """A call that passed its try: what to confirm, under which idempotency key."""

    call: ToolCall
    key: str


class TccSession(ModeSession):
    """Try at call time, confirm at commit, cancel at abort.

    Guarantees: no effect-bearing call reaches a substrate before commit; an aborted
    transaction applies and sends nothing; each confirm applies at most once (by key) however
    often it is retried or delivered. It does not guarantee all-or-nothing at commit.
    """

    # An abort before commit leaves nothing behind (a try holds nothing), so a fresh attempt is
    # safe; the abort after a failed confirm is not retryable, so no restart follows it.
    restarts_after_abort = True

    def __init__(self, trial: TrialMode, ctx: AgentContext) -> None:
        super().__init__(trial, ctx)
        # Keyed by the logical call, so a step the agent retried after a faulted try is
        # confirmed once; dicts keep insertion order, which is the confirm order.
        self.tried: dict[str, Tried] = {}

    async def call(self, call: ToolCall) -> Any:
        ctx, tool, args, site = self.ctx, call.tool, call.args, call.op_id
        env, boundary = ctx.env, ctx.boundary
        if tool.effect is None:
            return await self.call_directly(call)  # a read: no key, nothing to undo
        check = tool.check
        try:
            # The try is a real round trip to the service, so it can fault like any call; it is
            # not the call's effect delivery (the confirm is), hence its own role.
            try_it = (lambda: check(env, args)) if check is not None else _no_op
            boundary.deliver(site, try_it, role=faults.Role.TRY)
        finally:
            await boundary.pay()
        key = f"{ctx.trace}:{site}"
        self.tried[site] = Tried(call, key)
        return Ack("tried", key, tool.name)

    async def commit(self) -> None:
        pending, self.tried = list(self.tried.values()), {}
        for index, tried in enumerate(pending):
            try:
                await self._confirm(tried)
            except (faults.ToolFault, ToolError) as exc:
                left = len(pending) - index - 1
                raise Aborted(
                    AbortSource.TOOL_FAILURE,
                    f"confirm of {tried.call.op_id} failed ({exc}); {index} confirmed stay, "
                    f"{left} not sent",
                    retryable=False,
                ) from exc

    async def _confirm(self, tried: Tried) -> None:
        ctx, call = self.ctx, tried.call
        tool, args = call.tool, call.args
        delivery = Delivery(tried.key, ctx.meta(call.op_id, idem=tool.idempotent))
        attempts = self.trial.budget.confirm
        for attempt in range(attempts):
            try:
                ctx.boundary.deliver(call.op_id, lambda: tool.run(ctx.env, args, delivery))
                return
            except faults.ToolFault:
                # Safe to resend: the key makes the substrate apply the confirm at most once.
                if attempt == attempts - 1:
                    raise
            finally:
                await ctx.boundary.pay()
            await Sleep(ctx.settings.backoff_ms * 2**attempt)

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        # Cancel: a try reserved nothing on these substrates, so dropping it releases it.
        self.tried.clear()


def _no_op() -> None:
    return None


class TccTrial(TrialMode):
    @classmethod
    def budget_for(cls, settings: ModeSettings) -> RetryBudget:
        # A try is one round trip; each confirm is retried under its key up to the apply bound.
        return RetryBudget(confirm=settings.attempts("confirm", settings.apply_attempts))

    def session(self, ctx: AgentContext) -> TccSession:
        return TccSession(self, ctx)

"""`retry-only`: direct tool calls wrapped in a bounded retry with exponential backoff.

Mechanism: like no-tx (no idempotency keys; commit and abort do nothing), but the session
retries a call that raised an injected fault (F1, F2 or F5) until it has made `budget.call`
deliveries (natively 1 + `settings.step_retries`, so 3 unless the config says otherwise; a
config's `retries:` may set it), sleeping `backoff_ms`
times 1, 2, 4, ... on the virtual clock in between, before the fault reaches the agent (whose
own step retries come on top). A tool's own refusal is not retried.
Known failures: duplicates after an ambiguous failure (the retry re-applies an effect that had
landed) or a duplicated delivery, partial effects when a step finally fails, leaked
irreversible sends, lost updates under contention.
Versus the paper: with Bernoulli faults drawn per call site and occurrence, the wrapper's
retries meet the same draws the agent's step retries would, so on the single-agent synthetic
workload its clean rates equal no-tx's; the retries cost virtual time, not cleanliness.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures with `--modes retry-only,no-tx`, since none of them lists this mode):
Wins: its wrapper retries absorb failures before the agent sees them, which lifts it above
no-tx on tau_retail_notify at the lower fault rate.
Loses: retries without keys duplicate, so on tau_stress hardly a run is clean.
"""

from __future__ import annotations

from typing import Any

from atomix.effects import AbortSource
from harness.modes.base import AgentContext, ModeSession, ModeSettings, RetryBudget, TrialMode
from harness.world import faults
from harness.world.clock import Sleep
from harness.world.tooling import ToolCall


class RetrySession(ModeSession):
    """Executes each call at once, without keys, retrying injected faults with backoff.

    Guarantees only that a transient fault is retried a bounded number of times; nothing is
    committed, undone or deduplicated.
    """

    async def call(self, call: ToolCall) -> Any:
        ctx = self.ctx
        delivery = self.keyless(call)
        retries = self.trial.budget.call - 1
        for attempt in range(retries + 1):
            try:
                return self.deliver(call, delivery)
            except faults.ToolFault:
                # The caller cannot tell F1 from F2 (that is the point of "ambiguous"), so a
                # retry wrapper retries both; the re-application after F2 is its known failure.
                if attempt == retries:
                    raise
            finally:
                await ctx.boundary.pay()
            await Sleep(ctx.settings.backoff_ms * 2**attempt)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    async def commit(self) -> None:
        return None

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        return None


class RetryOnlyTrial(TrialMode):
    @classmethod
    def budget_for(cls, settings: ModeSettings) -> RetryBudget:
        return RetryBudget(call=settings.attempts("call", 1 + settings.step_retries))

    def session(self, ctx: AgentContext) -> RetrySession:
        return RetrySession(self, ctx)

"""`tx-full`: the Atomix runtime, unmodified, driven on the virtual clock; and its ablations.

The harness's shim turns each workload tool call into the runtime's own steps (read,
externalize, stage, commit, abort) through `TxSession`; the protocol itself is the core's.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures, `atomix compare RUN_DIR --baseline tx-full` tests the differences on paired
trials):
Wins: on tau_retail at the higher fault rate over the keyless modes, because there a retry
after an error whose effect had landed is refused by tau2 and the agent may then give up,
leaving residue; with notifications no mail leaks or doubles (the gate and the keys) while
saga, occ, no-tx and checkpoint-replay leak and duplicate mails; on tau_stress it isolates
where the baselines lose updates (no-frontier, run with `--modes no-frontier`, can edge it
out at the lower mixed fault rate: an aborted attempt holds nothing up there).
Loses: waiting (tau_stress's `wait` table) and, under mixed faults, invariant violations
mostly from F3: a failed compensation of an aborted attempt leaves its write under a later
commit (classified as residue, so not unclassified, but the run is not clean). With the
paper's asymmetric protocol (3 wrapper retries below the agent for tx-full and
checkpoint-replay only, `configs/tau_retail_paper_protocol.yaml`) a failed call is retried
before the agent sees it, and nearly every task ends clean.
Budget: a staged effect is applied at commit up to `budget.apply` times under its key
(natively `settings.apply_attempts`), where the keyless modes deliver a call once; part of a
lead over them can be that budget rather than the mechanism.
`configs/tau_retail_notify_matched.yaml` and `configs/tau_stress_matched.yaml` run every
mode at one delivery (`retries:`): run them beside their native configs to see how much.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from atomix.decisions import Settlement
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import TransactionAborted
from atomix.instructions import ApplyAbort, ApplyCommit, Block, Run, Steps
from atomix.manager import RuntimeOptions
from atomix.scope_parsing import NAIVE
from atomix.session import Coordinator, TxSession
from atomix.settle import carry_out_abort, carry_out_commit
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
from harness.world.clock import VirtualClock, VSignal
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolCall


class VirtualDriver:
    """Executes a session's instructions on the virtual clock for one agent; a commit-time
    apply is delivered at most `apply_attempts` times (the trial's `RetryBudget.apply`)."""

    def __init__(self, ctx: AgentContext, *, apply_attempts: int) -> None:
        self.ctx = ctx
        self.timeout: float | None = ctx.settings.timeout_ms
        self.apply_attempts = apply_attempts

    def new_signal(self) -> VSignal:
        return self.ctx.clock.signal()

    def now(self) -> float:
        return self.ctx.clock.now

    async def drive(self, steps: Steps) -> Any:
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                instr = steps.throw(throw) if throw is not None else steps.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            if isinstance(instr, Block):
                try:
                    send = await self.ctx.block(instr.signal, instr.timeout)  # type: ignore[arg-type]
                except GeneratorExit:
                    raise
                except BaseException as exc:  # noqa: BLE001 - an interrupted waiter aborts (cancelled)
                    throw = exc
            elif isinstance(instr, Run):
                try:
                    send = instr.fn()
                except Exception as exc:  # noqa: BLE001 - handed back to the session
                    throw = exc
                await self.ctx.boundary.pay()
            elif isinstance(instr, ApplyCommit):
                send = carry_out_commit(instr.plan, attempts=self.apply_attempts)
                await self.ctx.boundary.pay()
            elif isinstance(instr, ApplyAbort):
                send = carry_out_abort(instr.plan)
                await self.ctx.boundary.pay()


class TxTrial(TrialMode):
    """One runtime (coordinator) shared by all agents of a trial."""

    def __init__(
        self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings, options: RuntimeOptions
    ) -> None:
        super().__init__(env, clock, settings)
        # run_id "": keys stay a function of the trial alone, so records reproduce from a seed.
        self.co = Coordinator(options, apply_attempts=self.budget.apply, run_id="")

    @classmethod
    def budget_for(cls, settings: ModeSettings) -> RetryBudget:
        # Reads and reversible calls run once when made; a buffered or gated effect is applied
        # at commit under its key, retried up to the apply bound.
        return RetryBudget(apply=settings.attempts("apply", settings.apply_attempts))

    def session(self, ctx: AgentContext) -> TxModeSession:
        return TxModeSession(self, ctx)


class TxModeSession(ModeSession):
    """The harness shim over one Atomix transaction."""

    # Its abort drops buffered effects, withholds gated ones and compensates reversible ones, so
    # a fresh attempt is safe; a compensation that fails leaves residue, which is reported.
    restarts_after_abort = True

    trial: TxTrial

    def __init__(self, trial: TxTrial, ctx: AgentContext) -> None:
        super().__init__(trial, ctx)
        self.driver = VirtualDriver(ctx, apply_attempts=trial.budget.apply)
        self.tx: TxSession | None = None
        self.settlement: Settlement | None = None

    @property
    def reported_residue(self) -> int:
        """Effects the runtime classified as residue in its settlement: failed compensations
        (and, with the gate or compensation switched off, what its abort left in place)."""
        return len(self.settlement.residue) if self.settlement is not None else 0

    async def begin(self) -> None:
        self.tx = self.trial.co.begin(trace=self.ctx.trace)

    async def _drive(self, steps: Steps) -> Any:
        try:
            return await self.driver.drive(steps)
        except TransactionAborted as exc:
            self.settlement = exc.settlement  # type: ignore[assignment]
            raise Aborted(exc.source, exc.detail) from None

    async def call(self, call: ToolCall) -> Any:
        assert self.tx is not None, "begin() first"
        tx, ctx, tool, args = self.tx, self.ctx, call.tool, call.args
        env, boundary, site = ctx.env, ctx.boundary, call.op_id
        reads = tool.reads(env, args)
        core = self.trial.co.core
        # Runs when called (reversible; irreversible too if the runtime has no gate, an
        # ablation): the core says which, and such a call reads in the step that lets it run
        # (one wait, not two).
        eager = core.runs_at_call(tool.effect)
        if reads and not eager:
            await self._drive(tx.read_steps(reads, self.driver))
        if tool.effect is None:
            delivery = Delivery(None, ctx.meta(call.op_id, read=True))
            return await self._drive(_run(lambda: boundary.deliver(site, lambda: tool.run(env, args, delivery))))
        key = tx.key(tool.name, tool.key(args) if tool.key is not None else call.op_id)
        scopes = tuple(core.scope(s) for s in tool.writes(env, args))
        # The substrate gets the key unless the runtime delivers without keys (an ablation).
        delivery = Delivery(
            tx.delivery_key(key), ctx.meta(call.op_id, epoch=tx.epoch, idem=tool.idempotent)
        )
        if eager:
            await self._drive(tx.externalize_steps(scopes, self.driver, reads))
            compensate: Callable[[], Any] | None = None  # an irreversible one has none
            if tool.effect is EffectClass.REVERSIBLE:
                assert tool.before is not None and tool.undo is not None
                before = tool.before(env, args)
                undo = tool.undo
                undo_delivery = Delivery(None, {**delivery.meta, "undo": True})

                def compensate() -> Any:
                    return boundary.compensate(site, lambda: undo(env, args, before, undo_delivery))

            effect = Effect(tool.name, tool.effect, scopes, key, compensate=compensate, payload=call)
            try:
                result = boundary.deliver(site, lambda: tool.run(env, args, delivery))
            except faults.ToolFault:
                # A failed call may or may not have landed, and nothing says which: it must be
                # compensable at abort all the same (restoring the before-image is harmless
                # if it never landed, since the externalised scopes are this transaction's).
                # An ungated irreversible one is staged too: its abort reports it as residue.
                await boundary.pay()
                await self._drive(tx.stage_steps(effect))
                raise
            except Exception:
                await boundary.pay()
                raise
            await boundary.pay()
            await self._drive(tx.stage_steps(effect))
            return result
        effect = Effect(
            tool.name,
            tool.effect,
            scopes,
            key,
            apply=lambda: boundary.deliver(site, lambda: tool.run(env, args, delivery)),
            payload=call,
        )
        await self._drive(tx.stage_steps(effect))
        return Ack("staged" if tool.effect is EffectClass.BUFFERABLE else "queued", key, tool.name)

    async def commit(self) -> None:
        assert self.tx is not None
        self.settlement = await self._drive(self.tx.commit_steps(self.driver))

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        assert self.tx is not None
        self.settlement = await self._drive(self.tx.abort_steps(source, detail))


def _run(fn: Any) -> Steps:
    return (yield Run(fn))


def tx_factory(options: RuntimeOptions) -> Any:
    def factory(env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> TxTrial:
        return TxTrial(env, clock, settings, options)

    factory.budget_for = TxTrial.budget_for  # type: ignore[attr-defined]
    return factory


# The factories the mode registry (harness.modes.registry) names: tx-full and its ablations,
# each one switch of the runtime's options away from tx-full.
FULL_OPTIONS = RuntimeOptions()
full = tx_factory(FULL_OPTIONS)
global_frontier = tx_factory(dataclasses.replace(FULL_OPTIONS, frontier="global"))
no_scope_on_read = tx_factory(dataclasses.replace(FULL_OPTIONS, scope_on_read=False))
no_abort_on_stale = tx_factory(dataclasses.replace(FULL_OPTIONS, abort_on_stale=False))
naive_string_scopes = tx_factory(dataclasses.replace(FULL_OPTIONS, scopes=NAIVE))
no_residue_classification = tx_factory(dataclasses.replace(FULL_OPTIONS, classify_residue=False))
# Irreversible calls run when made (externalised like any eager call), so an aborted attempt's
# mail has left.
no_gate = tx_factory(dataclasses.replace(FULL_OPTIONS, gate_irreversible=False))
# Substrates get no idempotency key: a re-delivery (a commit-time re-apply after an ambiguous
# failure, a duplicated delivery, a retried call) lands again. The re-apply budget is tx-full's.
unkeyed = tx_factory(dataclasses.replace(FULL_OPTIONS, keyed_delivery=False))
# An abort compensates nothing: externalised reversible effects stay applied (and are reported
# as residue: classification is a separate component).
no_compensation = tx_factory(dataclasses.replace(FULL_OPTIONS, compensate_on_abort=False))
# The component "scope-on-read with abort-on-stale", removed as one.
no_read_checks = tx_factory(
    dataclasses.replace(FULL_OPTIONS, scope_on_read=False, abort_on_stale=False)
)
# Accesses after seal are admitted instead of aborting (seal_violation). The harness's shim
# seals only inside commit, after the agent's every call has returned, so no workload here
# makes such an access: expect the same records as tx-full.
no_seal = tx_factory(dataclasses.replace(FULL_OPTIONS, enforce_seal=False))

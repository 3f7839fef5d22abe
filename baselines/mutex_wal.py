"""`mutex-wal`: a mutex per workflow, a write-ahead log of before-images, rollback on abort,
irreversible calls held behind an explicit gating predicate.

Mechanism: a workflow-scoped mutex (not a global lock) serialises the workflow's own calls.
Before each revocable call its before-image is appended to a WAL file (JSON Lines, fsynced),
then the call runs directly, without a key. Irreversible calls are queued and sent at commit
only if the gating predicate holds (commit reached, no step left failed by a fault), each
tried up to `budget.resend` times without a key (natively `settings.apply_attempts`; a
config's `retries:` may set it). Abort restores the WAL's before-images newest-first; a
failed restore is `reported_residue`.
Known failures: duplicates after F2/F4 and after a gated send retried past an ambiguous
failure (no keys); a before-image captured after an ambiguous apply (a retried step) is that
apply's own result, so if the earlier restore fails the duplicate stays; nothing orders or
isolates different workflows on one resource: lost updates, and a rollback restores its image
over whatever another workflow wrote since.
Versus the paper: Table 14 credits Mutex+WAL with stale-plan isolation and Table 3 with 70%
clean runs on a contended workload. As specified here (a workflow-scoped mutex, no
per-resource ordering across workflows) it isolates nothing: on tau_contention (4 agents, 2
orders, fp=0) it loses updates as no-tx does (`atomix run configs/tau_contention.yaml --modes
mutex-wal,no-tx`). The paper does not say how its mutex orders different workflows, and we
did not invent a mechanism for it.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures):
Wins: its gate holds sends: no leaked mail on tau_retail_notify.
Loses: on tau_retail a step carried on past a failure shuts the gate, so the commit is
refused and rolled back; gated sends retried without a key duplicate mails; on tau_stress
nothing isolates workflows from each other, so updates are lost.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomix.effects import AbortSource, EffectClass
from atomix.tools import Ack
from harness.modes.base import (
    Aborted,
    AgentContext,
    ModeSession,
    ModeSettings,
    RetryBudget,
    TrialMode,
)
from harness.modes.locks import LockManager
from harness.world import faults
from harness.world.clock import VirtualClock
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolCall, ToolError

# WAL outcome statuses that mean the effect cannot have landed, so rollback skips them: only
# the tool's own refusal says so; an error or a timeout may have landed.
_NOT_APPLIED = frozenset({"refused"})


def _encode(value: Any) -> Any:
    """JSON form of a before-image, exact on the way back: bytes (file contents) are tagged
    base64, and a dict whose keys are not all plain strings is tagged as a list of pairs."""
    if isinstance(value, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _encode(v) for k, v in value.items()}
        return {"$dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"before-image of type {type(value).__name__} cannot be logged")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "$bytes" in value:
            return base64.b64decode(value["$bytes"])
        if "$dict" in value:
            return {_hashable(_decode(k)): _decode(v) for k, v in value["$dict"]}
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _hashable(value: Any) -> Any:
    # A tuple key was logged as a list; a dict key must be hashable again.
    return tuple(map(_hashable, value)) if isinstance(value, list) else value


class WriteAheadLog:
    """An append-only JSON Lines file of before-images and outcomes, fsynced per record.

    Guarantees: a record is on disk before `append` returns, so a before-image is durable
    before the call it protects is sent; `records` reads the file, not a memory copy.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lsn = 0

    def append(self, record: dict[str, Any]) -> int:
        self._lsn += 1
        line = json.dumps({"lsn": self._lsn, **record}, sort_keys=True, default=str)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return self._lsn

    def records(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


@dataclass(frozen=True, slots=True)
class _Undo:
    """What rolling one logged call back needs besides its before-image (tools are code)."""

    call: ToolCall
    delivery: Delivery


class MutexWalSession(ModeSession):
    """One workflow attempt with an undo log and a send gate.

    Guarantees: every revocable call's before-image is durable before the call is sent; an
    aborted attempt sends none of its irreversible calls, and every logged call that may have
    applied is restored to its before-image (newest first) unless the restore itself fails,
    which is counted in `reported_residue`. No isolation from other workflows, no dedup.
    """

    # Its abort restores the WAL's before-images, so the agent may start over; a restore that
    # fails leaves residue (counted in `reported_residue`).
    restarts_after_abort = True

    trial: MutexWalTrial

    def __init__(self, trial: MutexWalTrial, ctx: AgentContext) -> None:
        super().__init__(trial, ctx)
        self.mutex = f"workflow:{ctx.agent}"
        name = f"{next(trial.serial):04d}-{ctx.agent}-{ctx.attempt}.wal.jsonl"
        self.wal = WriteAheadLog(ctx.env.workdir / "mutex-wal" / name)
        self.undos: dict[int, _Undo] = {}  # WAL lsn of a before-image -> how to restore it
        self.gated: dict[str, ToolCall] = {}  # queued irreversible calls, in call order
        self.failed_steps: set[str] = set()  # logical calls whose last attempt hit a fault
        self.reached_commit = False
        self.finished = False
        self.failed_sends: list[str] = []
        self.reported_residue = 0

    # -- the workflow mutex -------------------------------------------------------------------
    async def _lock(self) -> None:
        # Owned by this attempt; another attempt (or branch) of the same workflow waits.
        await self.trial.mutexes.acquire(self.ctx, [self.mutex])

    def _unlock(self) -> None:
        self.trial.mutexes.release(self.ctx.trace)

    def gate_open(self) -> bool:
        """The explicit gating predicate: commit reached, not rolled back, and no step's last
        attempt ended in a fault (every step returned an answer)."""
        return self.reached_commit and not self.finished and not self.failed_steps

    # -- calls --------------------------------------------------------------------------------
    async def call(self, call: ToolCall) -> Any:
        try:
            await self._lock()
        except Aborted:
            # The agent does not call abort() after Aborted: roll back here.
            await self._rollback(AbortSource.TIMEOUT)
            raise
        try:
            return await self._call(call)
        finally:
            self._unlock()

    async def _call(self, call: ToolCall) -> Any:
        ctx, tool, args, site = self.ctx, call.tool, call.args, call.op_id
        env, boundary = ctx.env, ctx.boundary
        if tool.effect is None:
            return await self.call_directly(call)  # a read: no key, nothing to undo
        if tool.effect is EffectClass.IRREVERSIBLE:
            # Held behind the gate: nothing leaves before commit.
            self.gated[site] = call
            return Ack("queued", site, tool.name)
        assert tool.before is not None
        delivery = Delivery(None, ctx.meta(site, idem=tool.idempotent))
        # Write-ahead: the before-image is durable before the call is sent.
        lsn = self.wal.append(
            {
                "type": "before",
                "tx": ctx.trace,
                "op": site,
                "tool": tool.name,
                "args": args,
                "before": _encode(tool.before(env, args)),
            }
        )
        self.undos[lsn] = _Undo(call, Delivery(None, {**delivery.meta, "undo": True}))
        status = "unknown"  # an unexpected exception: it may have applied
        try:
            result = boundary.deliver(site, lambda: tool.run(env, args, delivery))
            status = "applied"
        except faults.ToolFault:
            status = "ambiguous"  # an error or a timeout: it may have landed, nothing says
            raise
        except ToolError:
            status = "refused"  # the tool's own precondition failed: no effect
            raise
        finally:
            self.wal.append({"type": "outcome", "of": lsn, "status": status})
            # A refusal is the tool's definite answer (no effect), which the agent may read and
            # move on from; only a step left failed by a fault keeps the gate shut.
            if status in ("applied", "refused"):
                self.failed_steps.discard(site)
            else:
                self.failed_steps.add(site)
            await boundary.pay()
        return result

    # -- settlement ---------------------------------------------------------------------------
    async def commit(self) -> None:
        self.reached_commit = True
        try:
            await self._lock()
        except Aborted:
            await self._rollback(AbortSource.TIMEOUT)
            raise
        try:
            if not self.gate_open():
                await self._rollback(AbortSource.TOOL_FAILURE)
                raise Aborted(
                    AbortSource.TOOL_FAILURE,
                    f"gating predicate failed: steps {sorted(self.failed_steps)} did not succeed",
                    retryable=False,
                )
            # The commit record is the decision: from here on the workflow is committed and
            # its revocable effects are final; the gate opens.
            self.wal.append({"type": "commit", "tx": self.ctx.trace, "sends": list(self.gated)})
            self.finished = True
            for call in self.gated.values():
                await self._send(call)
            self.gated.clear()
        finally:
            self._unlock()

    async def _send(self, call: ToolCall) -> None:
        ctx, tool, args, site = self.ctx, call.tool, call.args, call.op_id
        delivery = Delivery(None, ctx.meta(site, idem=tool.idempotent))
        attempts = self.trial.budget.resend
        for attempt in range(attempts):
            try:
                ctx.boundary.deliver(site, lambda: tool.run(ctx.env, args, delivery))
                self.wal.append({"type": "sent", "op": site})
                return
            except (faults.ToolFault, ToolError):
                # No key: after an ambiguous failure this retry may send it a second time.
                if attempt == attempts - 1:
                    self.failed_sends.append(site)
                    self.wal.append({"type": "send-failed", "op": site})
            finally:
                await ctx.boundary.pay()

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        try:
            await self._lock()
        except Aborted:
            # Roll back even so: leaving the effects in place would be worse than racing a
            # sibling attempt of the same workflow.
            await self._rollback(AbortSource(source))
            return
        try:
            await self._rollback(AbortSource(source))
        finally:
            self._unlock()

    async def _rollback(self, source: AbortSource) -> None:
        """Restore the WAL's before-images newest-first; drop the queued sends."""
        if self.finished:
            return
        self.finished = True
        self.gated.clear()
        ctx = self.ctx
        befores: list[dict[str, Any]] = []
        status: dict[int, str] = {}
        for record in self.wal.records():
            if record["type"] == "before":
                befores.append(record)
            elif record["type"] == "outcome":
                status[record["of"]] = record["status"]
        for record in reversed(befores):
            lsn = record["lsn"]
            if status.get(lsn) in _NOT_APPLIED:
                continue
            undo = self.undos[lsn]
            if self.undo(undo.call, _decode(record["before"]), undo.delivery):
                self.wal.append({"type": "undone", "of": lsn})
            else:
                # The effect stays applied: residue, and we say so.
                self.reported_residue += 1
                self.wal.append({"type": "undo-failed", "of": lsn})
            await ctx.boundary.pay()
        self.wal.append({"type": "abort", "tx": ctx.trace, "source": source.value})


class MutexWalTrial(TrialMode):
    """The trial's workflow mutexes (one scope per workflow) and WAL file numbering."""

    def __init__(self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> None:
        super().__init__(env, clock, settings)
        self.mutexes = LockManager(clock)
        self.serial = itertools.count(1)

    @classmethod
    def budget_for(cls, settings: ModeSettings) -> RetryBudget:
        # Revocable calls run once when made; a gated send is resent (keyless) at commit up
        # to the apply bound.
        return RetryBudget(resend=settings.attempts("resend", settings.apply_attempts))

    def session(self, ctx: AgentContext) -> MutexWalSession:
        return MutexWalSession(self, ctx)

"""`occ`: optimistic concurrency control as application developers build it.

Mechanism: the trial keeps a version table per scope. A read records the version it saw; a
write executes at once (no gate, no key: sends go out immediately), remembers its
before-image and bumps its scopes' versions. At commit each read is re-validated against
writes by others to overlapping scopes; a stale one rolls back this transaction's revocable
writes newest-first and aborts with `STALE_READ`, and the agent re-reads and retries.
Known failures: sends of an aborted attempt leak; duplicates after F2/F4 (no keys); eager
writes are visible before commit, so two transactions that both wrote before either
validated both abort (each sees the other's bump) and the second rollback restores the
first's aborted value (dirty residue); a rollback also restores its image over a write
committed since. Blind writes are never validated (write-write cycles commit).
Versus the paper: Table 1 gives OCC 0.00 invariant violations per run under contention; ours
has some, with 4 agents and more with 8 (`atomix run configs/tau_contention.yaml`, its
`invariants` table), from the rollback interleaving above, which its eager, ungated effects
allow; an OCC that buffered its writes until validation would not show it, but would gate
effects. Table 9 gives OCC 100% clean at F2-only fp=0.10 on the synthetic workload; ours is
lower (`atomix reproduce --tables 9` shows it), because an F2 applied its effect and
the agent's retry, without a key, applies it again.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures):
Wins: as saga where one agent works alone (tau_retail): nothing to validate against, so it
is eager execution with rollback.
Loses: with notifications (eager sends without keys); on tau_stress every stale-read abort
retries the plan, and each attempt's mail has already left (its `leaks` table).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from atomix.effects import AbortSource, EffectClass
from atomix.scope_parsing import parse_scope
from atomix.scopes import Scope
from harness.modes.base import Aborted, AgentContext, ModeSession, ModeSettings, TrialMode
from harness.world.clock import VirtualClock
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolCall, ToolError


class VersionTable:
    """Write stamps per scope, from one trial-wide counter.

    Guarantees: stamps strictly increase; `version(s)` is the newest stamp on any scope
    overlapping `s` (0 if none), and `writers_since(s, v, me)` names every writer other than
    `me` that stamped an overlapping scope after version `v` was seen.
    """

    def __init__(self) -> None:
        self._counter = 0
        self._stamps: dict[Scope, list[tuple[int, Hashable]]] = {}

    def bump(self, scope: Scope, writer: Hashable) -> int:
        self._counter += 1
        self._stamps.setdefault(scope, []).append((self._counter, writer))
        return self._counter

    def _overlapping(self, scope: Scope) -> Iterable[list[tuple[int, Hashable]]]:
        return (stamps for s, stamps in self._stamps.items() if s.overlaps(scope))

    def version(self, scope: Scope) -> int:
        return max((stamps[-1][0] for stamps in self._overlapping(scope)), default=0)

    def writers_since(self, scope: Scope, seen: int, me: Hashable) -> list[Hashable]:
        return [
            writer
            for stamps in self._overlapping(scope)
            for stamp, writer in stamps
            if stamp > seen and writer != me
        ]


@dataclass(frozen=True, slots=True)
class _Written:
    """An applied revocable write: how to restore its before-image at rollback."""

    call: ToolCall
    scopes: tuple[Scope, ...]
    before: Any
    undo: Delivery


class OccSession(ModeSession):
    """Eager execution with read-version validation at commit.

    Guarantees: a transaction that commits saw, for every scope it read, no write by another
    transaction between its read and its commit. An aborted one has its revocable writes
    restored to their before-images (failures counted in `reported_residue`); its sends
    stay sent.
    """

    # Its abort rolls back the attempt's revocable writes, so the agent may start over; a
    # rollback that fails leaves residue (counted in `reported_residue`), and sends stay sent.
    restarts_after_abort = True

    trial: OccTrial

    def __init__(self, trial: OccTrial, ctx: AgentContext) -> None:
        super().__init__(trial, ctx)
        self.reads: list[tuple[Scope, int]] = []
        self.writes: list[_Written] = []
        self.finished = False
        self.reported_residue = 0

    async def call(self, call: ToolCall) -> Any:
        ctx, tool, args, site = self.ctx, call.tool, call.args, call.op_id
        env, boundary, versions = ctx.env, ctx.boundary, self.trial.versions
        for spec in tool.reads(env, args):
            scope = parse_scope(spec)
            # The call runs synchronously right after, so this is the version it reads.
            self.reads.append((scope, versions.version(scope)))
        if tool.effect is None:
            return await self.call_directly(call)  # a read: no key, nothing to undo
        delivery = Delivery(None, ctx.meta(site, idem=tool.idempotent))
        revocable = tool.effect is not EffectClass.IRREVERSIBLE
        before = tool.before(env, args) if revocable and tool.before is not None else None
        applied = True  # unless the tool's own refusal says the effect never happened
        try:
            return boundary.deliver(site, lambda: tool.run(env, args, delivery))
        except ToolError:
            applied = False
            raise
        finally:
            if applied:
                # The version moves with the data (an app bumps it in the same statement). A
                # failed call may have landed and nothing says whether, so it is treated as a
                # write too: bump, and restore its before-image at rollback.
                scopes = tuple(parse_scope(s) for s in tool.writes(env, args))
                for scope in scopes:
                    versions.bump(scope, ctx.trace)
                if revocable:
                    undo = Delivery(None, {**delivery.meta, "undo": True})
                    self.writes.append(_Written(call, scopes, before, undo))
            await boundary.pay()

    def stale_reads(self) -> list[str]:
        """Scopes read by this transaction that another one wrote since."""
        versions, me = self.trial.versions, self.ctx.trace
        return sorted({str(s) for s, seen in self.reads if versions.writers_since(s, seen, me)})

    async def commit(self) -> None:
        # Validation and the commit decision happen at one virtual instant (no await between).
        stale = self.stale_reads()
        if stale:
            await self._rollback()
            raise Aborted(AbortSource.STALE_READ, f"read of {', '.join(stale)} is stale")
        self.finished = True
        self.writes.clear()

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        await self._rollback()

    async def _rollback(self) -> None:
        """Restore this transaction's revocable writes newest-first; sends cannot be undone."""
        if self.finished:
            return
        self.finished = True
        ctx, versions = self.ctx, self.trial.versions
        pending, self.writes = self.writes, []
        for written in reversed(pending):
            if not self.undo(written.call, written.before, written.undo):
                self.reported_residue += 1
            else:
                # A restore is a write too: whoever read the rolled-back value is now stale.
                for scope in written.scopes:
                    versions.bump(scope, ctx.trace)
            await ctx.boundary.pay()


class OccTrial(TrialMode):
    """The trial-wide version table every agent validates against."""

    def __init__(self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> None:
        super().__init__(env, clock, settings)
        self.versions = VersionTable()

    def session(self, ctx: AgentContext) -> OccSession:
        return OccSession(self, ctx)

"""The mode interface: how a workload's agents settle tool calls under any mechanism.

A mode is one row of the table in `harness.modes.registry`: a name, a one-line description
and a factory. For each trial the factory builds a `TrialMode` (the mechanism's shared state: a coordinator, lock
tables, version tables); each agent attempt opens a `ModeSession` on it to begin, call
tools, commit and abort. Workloads and agents only ever use this interface, so one agent
runs unchanged under every mode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from atomix.effects import AbortSource
from harness.world import faults
from harness.world.boundary import Boundary
from harness.world.clock import Park, VirtualClock, VSignal
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolCall, ToolError


class Aborted(Exception):
    """The mode aborted the agent's transaction; `retryable` says a fresh attempt may succeed."""

    def __init__(self, source: AbortSource | str, detail: str = "", *, retryable: bool | None = None):
        self.source = AbortSource(source)
        self.detail = detail
        self.retryable = (
            self.source in (AbortSource.STALE_READ, AbortSource.TIMEOUT)
            if retryable is None
            else retryable
        )
        super().__init__(f"aborted ({self.source.value}){': ' + detail if detail else ''}")


@dataclass(frozen=True, slots=True)
class ModeSettings:
    """Knobs every mode may read: time-outs and retry bounds (simulated ms)."""

    timeout_ms: float = 30_000.0
    apply_attempts: int = 8
    step_retries: int = 3
    backoff_ms: float = 20.0


@dataclass(slots=True)
class AgentContext:
    """What a mode session knows about the agent attempt it serves."""

    agent: str
    attempt: int
    trace: str
    env: TrialEnv
    clock: VirtualClock
    boundary: Boundary
    settings: ModeSettings
    blocked_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def meta(self, op_id: str, **more: Any) -> dict[str, Any]:
        """Op-log metadata for one delivery: who, which attempt, which logical call."""
        return {"agent": self.agent, "attempt": self.attempt, "tx": self.trace, "op": op_id, **more}

    async def block(self, signal: VSignal, timeout: float | None) -> bool:
        """Wait on the virtual clock, charging the time to this agent's blocked total."""
        start = self.clock.now
        woken = await Park(signal, timeout)
        self.blocked_ms += self.clock.now - start
        return woken


class ModeSession(ABC):
    """One agent attempt at one transaction under a mode.

    `call` raises the boundary's fault exceptions (the agent may retry the step) or
    `Aborted`; `commit` raises `Aborted` when the mechanism refuses to commit. A mechanism
    that recovers by replaying from a checkpoint sets `resumes_from_checkpoint`.
    """

    resumes_from_checkpoint: bool = False
    # The mechanism's abort undoes (or never released) the attempt's effects, so an agent may
    # safely start the plan over after a failed step. Without it, starting over would repeat
    # effects that already landed, so the agent reports the failure instead.
    restarts_after_abort: bool = False

    def __init__(self, trial: TrialMode, ctx: AgentContext) -> None:
        self.trial = trial
        self.ctx = ctx

    async def begin(self) -> None:  # noqa: B027 - most mechanisms need no begin step
        """Start the transaction (locks taken up front go here)."""

    @abstractmethod
    async def call(self, call: ToolCall) -> Any: ...

    @abstractmethod
    async def commit(self) -> None: ...

    @abstractmethod
    async def abort(self, source: AbortSource | str, detail: str = "") -> None: ...

    def keyless(self, call: ToolCall) -> Delivery:
        """The delivery of a call made without an idempotency key (what most mechanisms do)."""
        if call.tool.effect is None:
            return Delivery(None, self.ctx.meta(call.op_id, read=True))
        return Delivery(None, self.ctx.meta(call.op_id, idem=call.tool.idempotent))

    def deliver(self, call: ToolCall, delivery: Delivery) -> Any:
        """One real delivery of `call` through the boundary (faults apply; latency is owed)."""
        ctx, tool = self.ctx, call.tool
        return ctx.boundary.deliver(call.op_id, lambda: tool.run(ctx.env, call.args, delivery))

    async def call_directly(self, call: ToolCall) -> Any:
        """Execute `call` now, without a key, and pay its latency."""
        try:
            return self.deliver(call, self.keyless(call))
        finally:
            await self.ctx.boundary.pay()

    def undo(self, call: ToolCall, before: Any, delivery: Delivery) -> bool:
        """Restore `call`'s before-image through the boundary (a compensation, a rollback);
        False when it failed and the effect stays applied (residue)."""
        ctx, restore = self.ctx, call.tool.undo
        assert restore is not None, f"tool {call.name!r} has no undo"
        try:
            ctx.boundary.compensate(call.op_id, lambda: restore(ctx.env, call.args, before, delivery))
        except (faults.ToolFault, ToolError):
            return False
        return True

    def checkpoint(self, step: int, memory: dict[str, Any]) -> None:  # noqa: B027
        """Called after each successful step with the agent's memory."""

    def restore(self) -> tuple[int, dict[str, Any]] | None:
        """After an abort: where to resume and with which memory, or None to start over."""
        return None


class TrialMode(ABC):
    """A mechanism's shared state for one trial."""

    def __init__(self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> None:
        self.env = env
        self.clock = clock
        self.settings = settings

    @abstractmethod
    def session(self, ctx: AgentContext) -> ModeSession: ...


TrialModeFactory = Callable[[TrialEnv, VirtualClock, ModeSettings], TrialMode]

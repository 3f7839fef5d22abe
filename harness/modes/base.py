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


#: The kinds of delivery a mode may repeat below the agent (the fields of `RetryBudget`).
DELIVERY_KINDS: tuple[str, ...] = ("call", "apply", "confirm", "resend")


@dataclass(frozen=True, slots=True)
class DeliveryLimits:
    """Bounds a config's `retries:` section sets on every mode at once, per kind of delivery
    (None: each mode keeps its native bound, from `ModeSettings.apply_attempts` and
    `step_retries`). A bound applies only where a mechanism has a retry loop of that kind: a
    mode that delivers a call once has no loop to bound, and keeps delivering it once."""

    call: int | None = None
    apply: int | None = None
    confirm: int | None = None
    resend: int | None = None

    def given(self) -> dict[str, int]:
        """The bounds set, by kind ({} when the config has no `retries:` section)."""
        return {k: v for k in DELIVERY_KINDS if (v := getattr(self, k)) is not None}


@dataclass(frozen=True, slots=True)
class ModeSettings:
    """Knobs every mode may read: time-outs and retry bounds (simulated ms).

    `apply_attempts` and `step_retries` are the mechanisms' native retry bounds (a config's
    `settings:`); `retries` (a config's `retries:`) overrides them per kind of delivery for
    every mode alike. A mode reads its bounds through its `TrialMode.budget`, never from here
    directly, so the budget it declares is the one it runs.
    """

    timeout_ms: float = 30_000.0
    apply_attempts: int = 8
    # As the config's `settings.step_retries` defaults: a trial built without a config (tests,
    # `TrialSpec()`) retries as a configured one does.
    step_retries: int = 2
    backoff_ms: float = 20.0
    retries: DeliveryLimits = DeliveryLimits()

    def attempts(self, kind: str, native: int) -> int:
        """Deliveries in all of one effect by a retry loop of `kind` whose native bound is
        `native`: the `retries:` bound of that kind when the config sets one."""
        if kind not in DELIVERY_KINDS:
            raise ValueError(f"unknown delivery kind {kind!r}; allowed: {', '.join(DELIVERY_KINDS)}")
        limit = getattr(self.retries, kind)
        return native if limit is None else int(limit)


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """How many deliveries of one effect a mode makes below the agent before it gives up.

    Every field counts deliveries in all, the first included, and 0 means the mechanism has
    no such step:
    - `call`: of one call the agent made, at call time (1 unless the mode itself retries a
      failed call, as retry-only does);
    - `apply`: of one effect held back until commit (buffered or gated), under its
      idempotency key (Atomix's commit-time apply);
    - `confirm`: of one tried call's confirm at commit, under its key (TCC);
    - `resend`: of one gated irreversible call at commit, without a key (mutex-wal).
    The agent's own retries and restarts come on top (`harness.agents.policies.AgentBudget`).

    Guarantees: a mode's code takes its bounds from its trial's `budget` (built from this
    declaration), so what it declares is what it does; tests/test_retry_budgets.py counts
    the deliveries of an always-failing effect under every registered mode.
    """

    call: int = 1
    apply: int = 0
    confirm: int = 0
    resend: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in DELIVERY_KINDS}

    def compact(self) -> str:
        """`apply×8`, `confirm×8`, `call×3`, ...: the commit-time kinds the mechanism has, and
        the call when it is delivered more than once (`call×1` when nothing else is said)."""
        parts = [f"{k}×{getattr(self, k)}" for k in DELIVERY_KINDS[1:] if getattr(self, k)]
        if self.call != 1 or not parts:
            parts.insert(0, f"call×{self.call}")
        return " ".join(parts)


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
    """A mechanism's shared state for one trial, and its delivery budget (`budget`, declared
    by `budget_for`), which its sessions read their retry bounds from."""

    def __init__(self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> None:
        self.env = env
        self.clock = clock
        self.settings = settings
        self.budget = self.budget_for(settings)

    @classmethod
    def budget_for(cls, settings: ModeSettings) -> RetryBudget:
        """This mechanism's delivery budget under `settings`. The default: each call is
        delivered once, when the agent makes it, and nothing is held back until commit; a
        mechanism that retries, or delivers at commit, overrides it."""
        return RetryBudget()

    @abstractmethod
    def session(self, ctx: AgentContext) -> ModeSession: ...


TrialModeFactory = Callable[[TrialEnv, VirtualClock, ModeSettings], TrialMode]


def declared_budget(factory: TrialModeFactory, settings: ModeSettings) -> RetryBudget:
    """The delivery budget a mode's factory declares under `settings`: its `budget_for` (a
    TrialMode class has it; a factory function carries its trial class's)."""
    declare = getattr(factory, "budget_for", None)
    if declare is None:
        raise TypeError(
            f"mode factory {factory!r} declares no delivery budget: give its TrialMode a "
            "`budget_for` classmethod, or the factory function a `budget_for` attribute"
        )
    budget = declare(settings)
    assert isinstance(budget, RetryBudget), budget
    return budget

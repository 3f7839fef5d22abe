"""The tool boundary of one agent: where faults are injected and latency is charged.

Every real delivery from any mode to a substrate goes through `deliver` (forward calls) or
`compensate` (compensations, rollbacks, cancels). Substrate code is synchronous, so the time
a delivery costs is accumulated as debt that the agent's coroutine pays on the virtual clock
right after the delivery, before anything else it does.

Each delivery names its `faults.Role` (default CALL: the delivery carrying the logical call's
own effect or read; TRY for an auxiliary round trip such as tcc's try) and the boundary adds
its agent's name, so the fault draw is keyed by (agent, point, role, site, occurrence) and two
modes issuing the same call meet the same fault (harness.world.faults states the property).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

from harness.world import faults
from harness.world.clock import Sleep, VirtualClock

T = TypeVar("T")


class Boundary:
    """Fault injection and simulated tool latency for one agent (`agent`) in one trial.

    Guarantees: every delivery is charged latency and asks the injector once, keyed by this
    agent, the delivery's role and its site.
    """

    def __init__(
        self,
        clock: VirtualClock,
        injector: faults.FaultInjector | None,
        *,
        latency_ms: float,
        jitter_ms: float,
        rng: random.Random,
        agent: str = "",
    ) -> None:
        self.clock = clock
        self.agent = agent
        # Private: a mode reaches the boundary through its context and must never ask the
        # injector what it decided (docs/design.md, "What a mode may see"); the trial reads its
        # records for the oracle.
        self._injector = injector
        self.latency_ms = latency_ms
        self.jitter_ms = jitter_ms
        self.rng = rng
        self.debt_ms = 0.0
        self.deliveries = 0

    def _charge(self) -> None:
        self.deliveries += 1
        jitter = self.rng.uniform(0.0, self.jitter_ms) if self.jitter_ms else 0.0
        self.debt_ms += self.latency_ms + jitter

    def deliver(
        self,
        site: str,
        call: Callable[[], T],
        *,
        role: faults.Role = faults.Role.CALL,
        meta: dict[str, Any] | None = None,
    ) -> T:
        self._charge()
        try:
            return faults.deliver(self._injector, site, call, role=role, agent=self.agent, meta=meta)
        except faults.ToolTimeout as exc:
            self.debt_ms += exc.stall_ms
            raise

    def compensate(
        self,
        site: str,
        call: Callable[[], T],
        *,
        role: faults.Role = faults.Role.CALL,
        meta: dict[str, Any] | None = None,
    ) -> T:
        self._charge()
        return faults.compensate(self._injector, site, call, role=role, agent=self.agent, meta=meta)

    async def pay(self) -> None:
        """Advance this agent's virtual time by what its deliveries cost so far."""
        debt, self.debt_ms = self.debt_ms, 0.0
        if debt > 0:
            await Sleep(debt)

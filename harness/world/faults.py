"""Seeded fault injection at the tool boundary (paper Tables 7-9).

A fault is injected between a settlement mechanism (a "mode") and a real substrate, at one of
two boundary points: a forward tool call (CALL) or a compensation (COMPENSATE). One
`FaultInjector` serves one trial, shared by all its agents.

Common random numbers (the pairing property). With Bernoulli arrival, whether a delivery gets
a fault, and which class, is a pure function of the trial seed (from seed, cell id and trial
index; the cell id never names the mode) and of the delivery's key
`(agent, point, role, site, occurrence)`: the agent making it, the boundary point, its `Role`
(the delivery that carries the logical call's own effect or read, or an auxiliary round trip
such as tcc's try), the logical call (`site`, the agent's op id: task and ordinal in its
plan) and how many deliveries with the same (agent, point, role, site) this agent made
before. It does not depend on the mode, on the order in which agents' questions interleave,
nor on deliveries of other roles or sites. So two modes whose agent makes the same logical
call for the k-th time meet the same fault there; a delivery only one of them makes (a retry
the other did not need, tcc's try) has a draw of its own and shifts no other. With bursty
arrival the Gilbert-Elliott chain advances once per question in the order asked, across all
agents, so this property does not hold (a correlated chain is inherently order-dependent).

Every fault class is described once, in `FAULTS`; the rest of this module (and of the
harness) reads that registry instead of branching over classes.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from harness.registry import Entry, Registry

T = TypeVar("T")

__all__ = [
    "FAULTS",
    "CompensationFailed",
    "FaultClass",
    "FaultConfig",
    "FaultInjector",
    "FaultSpec",
    "Decision",
    "InjectedFault",
    "Point",
    "Role",
    "ToolCallFailed",
    "ToolFault",
    "ToolTimeout",
    "compensate",
    "deliver",
    "derive_trial_seed",
]


class FaultClass(StrEnum):
    """The five fault classes of the paper; descriptions live in `FAULTS`."""

    F1 = "F1"
    F2 = "F2"
    F3 = "F3"
    F4 = "F4"
    F5 = "F5"


class Point(StrEnum):
    """Where on the tool boundary a fault can be injected.

    CALL is any forward call reaching a substrate (eager execution, commit-time apply, gate
    release, TCC confirm, ...); COMPENSATE is any compensation / rollback / cancel.
    """

    CALL = "call"
    COMPENSATE = "compensate"


class Role(StrEnum):
    """What a delivery is to the logical call it belongs to; part of the fault draw's key.

    CALL: the delivery that carries the call's own effect or read (an eager call, a
    commit-time apply, a gate release, a TCC confirm, a compensation at COMPENSATE). TRY: an
    auxiliary reservation round trip before the effect (TCC's try), which no other mode
    makes; giving it its own role keeps it from shifting the draws of the call's effect
    delivery.
    """

    CALL = "call"
    TRY = "try"


# --------------------------------------------------------------------------- exceptions
#
# What a mode observes carries no fault class. F1 (failed before its effect) and F2 (effect
# applied, then failed) reach every mode as the same `ToolCallFailed`, with the same message
# and attributes: only the mechanism's own means (idempotency keys honoured by the substrate,
# reading state back, a before-image) can tell whether the effect landed. The class is in the
# injector's records, which only the oracle and the tables read (docs/design.md, "What a mode
# may see").


def _rebuild_fault(cls: type[ToolFault], args: tuple[Any, ...], state: dict[str, Any]) -> ToolFault:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class ToolFault(Exception):
    """A failure observed at the tool boundary, about the logical call `site`.

    Guarantees: it says only what a caller of a real service would see (an error, a timeout,
    a failed compensation), never which injected class caused it.
    """

    site: str

    def __init__(self, site: str, message: str | None = None) -> None:
        self.site = site
        super().__init__(message or f"call {site!r} failed")

    @classmethod
    def injected(cls, site: str, *, config: FaultConfig) -> Self:
        """Build the exception for a fault `deliver`/`compensate` just injected."""
        return cls(site)

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclass constructors take different arguments than `args`, so the default
        # pickling (cls(*args)) would fail; trials may run in worker processes.
        return (_rebuild_fault, (type(self), self.args, dict(self.__dict__)))


class ToolCallFailed(ToolFault):
    """The call returned an error. Whether its effect landed is unknown to the caller (F1 and
    F2 both end here)."""

    def __init__(self, site: str, message: str | None = None) -> None:
        super().__init__(site, message or f"call {site!r} failed: the service returned an error")


class ToolTimeout(ToolCallFailed):
    """The call did not answer within its deadline (`stall_ms`) and was cancelled. Whether its
    effect landed is unknown to the caller, as after any failed call.

    The virtual-clock driver charges `stall_ms` to the caller; nothing here sleeps.
    """

    def __init__(self, site: str, stall_ms: float, message: str | None = None) -> None:
        self.stall_ms = stall_ms
        super().__init__(site, message or f"call {site!r} timed out after {stall_ms:g} ms")

    @classmethod
    def injected(cls, site: str, *, config: FaultConfig) -> Self:
        return cls(site, stall_ms=config.stall_ms)


class CompensationFailed(ToolFault):
    """A compensation returned an error; the effect it should have undone is still in place."""

    def __init__(self, site: str, message: str | None = None) -> None:
        super().__init__(site, message or f"compensation of {site!r} failed")


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Everything the harness needs to know about one fault class.

    `deliveries` is how many times the real call reaches the substrate when this fault fires,
    and `error` what is raised to the mode afterwards (None: the mode sees a normal return of
    the last delivery). Different classes may raise the same error: that is the point.
    """

    name: FaultClass
    description: str
    points: frozenset[Point]
    deliveries: int
    error: type[ToolFault] | None


#: The one table of fault classes (harness.registry style): a class is one row.
FAULTS: Registry[FaultSpec] = Registry("fault class", [
    Entry(str(spec.name), spec, spec.description)
    for spec in (
        FaultSpec(
            FaultClass.F1,
            "fails before its effect (transient error)",
            frozenset({Point.CALL}),
            deliveries=0,
            error=ToolCallFailed,
        ),
        FaultSpec(
            FaultClass.F2,
            "effect applied, then the call fails before returning (ambiguous)",
            frozenset({Point.CALL}),
            deliveries=1,
            error=ToolCallFailed,
        ),
        FaultSpec(
            FaultClass.F3,
            "a compensation fails",
            frozenset({Point.COMPENSATE}),
            deliveries=0,
            error=CompensationFailed,
        ),
        FaultSpec(
            FaultClass.F4,
            "silent duplicate delivery: the call is delivered twice, no error",
            frozenset({Point.CALL}),
            deliveries=2,
            error=None,
        ),
        FaultSpec(
            FaultClass.F5,
            "the call stalls past its deadline and is cancelled (timeout); "
            "the effect is not applied",
            frozenset({Point.CALL}),
            deliveries=0,
            error=ToolTimeout,
        ),
    )
])


# --------------------------------------------------------------------------- config


def _all_classes() -> dict[FaultClass, float]:
    return {c: 1.0 for c in FaultClass}


class FaultConfig(BaseModel):
    """A validated, immutable description of what to inject and how often.

    `rate` is the per-event probability for Bernoulli arrival. Bursty arrival is a two-state
    Gilbert-Elliott chain (good -> bad with `burst_entry`, bad -> good with 1/`burst_length`,
    faults with `bad_rate` while bad, never while good); its rate is `marginal_rate()`, so a
    nonzero `rate` is refused with it (0.0 is accepted and ignored). `classes` are relative
    weights; also accepted: "mixed" (all five equal), one class name ("F2") or a list of names
    (["F2", "F4"], equal weights).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # `arrival` is declared before `rate` so that the rate validator can see it.
    arrival: Literal["bernoulli", "bursty"] = "bernoulli"
    rate: float = 0.0
    burst_entry: float = 0.04
    burst_length: float = 3.0
    bad_rate: float = 1.0
    classes: dict[FaultClass, float] = Field(default_factory=_all_classes)
    stall_ms: float = 5000.0

    @field_validator("rate", "burst_entry", "bad_rate")
    @classmethod
    def _probability(cls, v: float) -> float:
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ValueError(f"must be a probability in [0, 1], got {v!r}")
        return v

    @field_validator("rate")
    @classmethod
    def _rate_is_bernoulli_only(cls, v: float, info: ValidationInfo) -> float:
        # Runs only when `rate` is given explicitly (defaults are not validated). With bursty
        # arrival the rate is a consequence of the chain, so a nonzero `rate` would be silently
        # ignored: refuse it rather than mislead. 0.0 is let through so that a dumped bursty
        # config (which carries the default rate) validates again.
        if info.data.get("arrival") == "bursty" and v != 0.0:
            raise ValueError(
                "applies to bernoulli arrival only; for bursty arrival the fault rate is set by "
                "burst_entry, burst_length and bad_rate (see marginal_rate())"
            )
        return v

    @field_validator("burst_length")
    @classmethod
    def _burst_length(cls, v: float) -> float:
        # The chain leaves the bad state with probability 1/burst_length per event, which
        # must itself be a probability.
        if not (math.isfinite(v) and v >= 1.0):
            raise ValueError(f"mean burst length must be a finite number >= 1 event, got {v!r}")
        return v

    @field_validator("stall_ms")
    @classmethod
    def _stall(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0.0):
            raise ValueError(f"stall_ms must be a finite duration > 0 ms, got {v!r}")
        return v

    @field_validator("classes", mode="before")
    @classmethod
    def _class_shorthands(cls, v: Any) -> Any:
        if v is None or (isinstance(v, str) and v.strip().lower() == "mixed"):
            return _all_classes()
        if isinstance(v, str):
            return {v.strip().upper(): 1.0}
        if isinstance(v, list | tuple | set | frozenset):
            if not v:
                raise ValueError("an empty list names no fault class; use e.g. ['F2'] or 'mixed'")
            return {(s.strip().upper() if isinstance(s, str) else s): 1.0 for s in v}
        return v  # a mapping: pydantic validates keys (FaultClass) and values (float)

    @field_validator("classes")
    @classmethod
    def _class_weights(cls, v: dict[FaultClass, float]) -> dict[FaultClass, float]:
        bad = {str(k): w for k, w in v.items() if not (math.isfinite(w) and w >= 0.0)}
        if bad:
            raise ValueError(f"class weights must be finite and >= 0, got {bad}")
        if not any(w > 0.0 for w in v.values()):
            raise ValueError("at least one fault class needs a weight > 0")
        # Canonical order, so that a weighted choice does not depend on how the user wrote it.
        return {c: float(v[c]) for c in FaultClass if c in v}

    def marginal_rate(self) -> float:
        """Long-run probability that an event (with an applicable class) gets a fault.

        Bursty: pi_bad * bad_rate with pi_bad = entry / (entry + 1/length). The paper's
        Table 7 chain (entry 0.04, length 3, bad_rate 1) gives 0.04 / (0.04 + 1/3) ~= 0.107;
        the paper reports fp ~= 0.12 for it. We implement the chain as stated and do not tune
        its parameters toward the reported number.
        """
        if self.arrival == "bernoulli":
            return self.rate
        leave = 1.0 / self.burst_length
        return self.burst_entry / (self.burst_entry + leave) * self.bad_rate

    def applicable(self, point: Point) -> tuple[FaultClass, ...]:
        """Classes with weight > 0 that can fire at `point`, in canonical order."""
        return tuple(c for c, w in self.classes.items() if w > 0.0 and point in FAULTS[c].points)


# --------------------------------------------------------------------------- injector


def derive_trial_seed(seed: int, cell: str, trial: int) -> int:
    """A 64-bit seed for one trial, stable across processes and Python versions.

    Python's `hash()` is salted per process, so it must never be used here.
    """
    material = json.dumps([int(seed), str(cell), int(trial)], separators=(",", ":"))
    digest = hashlib.blake2b(material.encode(), digest_size=8, person=b"atomix-trial").digest()
    return int.from_bytes(digest, "big")


def _unit(bits: int) -> float:
    """A uniform float in [0, 1) from the top 53 bits of a 64-bit integer."""
    return (bits >> 11) * (1.0 / (1 << 53))


@dataclass(frozen=True, slots=True)
class Decision:
    """One question the injector answered, faulted or not (the trial's decision log).

    `(agent, point, role, site, occurrence)` is the event's key; with Bernoulli arrival it and
    the trial seed alone determine `fault` (None: no fault). `index` is the ordinal of the
    question among all this injector answered, which depends on how agents interleave.
    """

    index: int
    agent: str
    point: Point
    role: Role
    site: str
    occurrence: int
    fault: FaultClass | None

    def key(self) -> tuple[str, Point, Role, str, int]:
        return (self.agent, self.point, self.role, self.site, self.occurrence)


@dataclass(frozen=True)
class InjectedFault:
    """One injected fault, as recorded for the trial.

    `index` is the ordinal of the event among all events this injector decided (faulted or
    not); `occurrence` how many times this agent had asked about the same (point, role, site)
    before, which with `agent`, `role` and the trial seed reproduces a Bernoulli draw.
    """

    index: int
    point: Point
    site: str
    fault: FaultClass
    occurrence: int
    meta: dict[str, Any] = field(default_factory=dict)
    agent: str = ""
    role: Role = Role.CALL

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "agent": self.agent,
            "point": str(self.point),
            "role": str(self.role),
            "site": self.site,
            "fault": str(self.fault),
            "occurrence": self.occurrence,
            "meta": dict(self.meta),
        }


class FaultInjector:
    """The seeded fault source of one trial.

    Guarantees: the same (config, seed, cell, trial) and the same questions give the same
    decisions and records. With Bernoulli arrival the decision for an event depends only on
    the trial seed and the event's key (agent, point, role, site, occurrence), where
    `occurrence` counts this agent's earlier questions with the same (point, role, site): so
    every mode whose agent makes a logical call for the k-th time meets the same fault there,
    whatever else it or any other agent asked and in whatever order (the module docstring
    states the property). With bursty arrival the chain advances once per event in the order
    asked, so modes that make different numbers of calls see different streams (inherent to
    a correlated process). A rate-0 config never injects. `decisions` logs every question
    answered, in order, for tests and traces.
    """

    def __init__(self, config: FaultConfig, *, seed: int, cell: str, trial: int) -> None:
        self.config = config
        self.seed = seed
        self.cell = cell
        self.trial = trial
        self.trial_seed = derive_trial_seed(seed, cell, trial)
        self.events = 0
        self.injected: list[InjectedFault] = []
        self.decisions: list[Decision] = []
        self._occurrences: dict[tuple[str, Point, Role, str], int] = {}
        self._applicable = {p: config.applicable(p) for p in Point}
        self._key = self.trial_seed.to_bytes(8, "big")
        # Bursty state. The chain starts from its stationary distribution so that every event,
        # including the first ones of a short trial, has fault probability marginal_rate().
        self._rng = random.Random(self.trial_seed)
        leave = 1.0 / config.burst_length
        pi_bad = config.burst_entry / (config.burst_entry + leave)
        self._bad = self._rng.random() < pi_bad

    @classmethod
    def disabled(cls) -> FaultInjector:
        """An injector that never injects (for clean baselines and unit tests)."""
        return cls(FaultConfig(rate=0.0), seed=0, cell="disabled", trial=0)

    def _bernoulli_draw(
        self, agent: str, point: Point, role: Role, site: str, occurrence: int
    ) -> tuple[float, float, float]:
        # The event's key and nothing else (the trial seed is the hash key): no counter shared
        # across agents or roles, so the draw cannot depend on the order of questions.
        material = json.dumps(
            [agent, str(point), str(role), site, occurrence], separators=(",", ":")
        )
        digest = hashlib.blake2b(
            material.encode(), digest_size=16, key=self._key, person=b"atomix-event"
        ).digest()
        u_fault = _unit(int.from_bytes(digest[:8], "big"))
        u_class = _unit(int.from_bytes(digest[8:], "big"))
        return u_fault, u_class, self.config.rate

    def _bursty_draw(self) -> tuple[float, float, float]:
        # Always consume exactly three numbers per event, so the stream stays aligned whatever
        # the outcomes and whether or not any class applies at this point.
        u_step, u_fault, u_class = self._rng.random(), self._rng.random(), self._rng.random()
        p = self.config.bad_rate if self._bad else 0.0
        if self._bad:
            self._bad = u_step >= 1.0 / self.config.burst_length
        else:
            self._bad = u_step < self.config.burst_entry
        return u_fault, u_class, p

    def decide(
        self,
        point: Point,
        site: str,
        *,
        role: Role = Role.CALL,
        agent: str = "",
        meta: dict[str, Any] | None = None,
    ) -> FaultClass | None:
        """Decide whether `agent`'s next delivery (point, role, site) gets a fault; log the
        decision, record a fault, and return its class (None: no fault)."""
        point, role = Point(point), Role(role)
        index = self.events
        self.events += 1
        key = (agent, point, role, site)
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1

        if self.config.arrival == "bernoulli":
            u_fault, u_class, p = self._bernoulli_draw(agent, point, role, site, occurrence)
        else:
            u_fault, u_class, p = self._bursty_draw()

        candidates = self._applicable[point]
        fault = self._choose(candidates, u_class) if candidates and u_fault < p else None
        self.decisions.append(Decision(index, agent, point, role, site, occurrence, fault))
        if fault is not None:
            self.injected.append(
                InjectedFault(index, point, site, fault, occurrence, dict(meta or {}), agent, role)
            )
        return fault

    def _choose(self, candidates: tuple[FaultClass, ...], u: float) -> FaultClass:
        weights = [self.config.classes[c] for c in candidates]
        target = u * sum(weights)
        acc = 0.0
        for c, w in zip(candidates, weights, strict=True):
            acc += w
            if target < acc:
                return c
        return candidates[-1]  # float rounding at u -> 1; every candidate has weight > 0

    def records(self) -> list[dict[str, Any]]:
        """JSON-ready records of the injected faults, in injection order."""
        return [f.to_dict() for f in self.injected]


# --------------------------------------------------------------------------- boundary helpers


def _through(
    injector: FaultInjector | None,
    point: Point,
    site: str,
    call: Callable[[], T],
    meta: dict[str, Any] | None,
    role: Role,
    agent: str,
) -> T:
    fault = (
        injector.decide(point, site, role=role, agent=agent, meta=meta)
        if injector is not None
        else None
    )
    if fault is None:
        return call()
    spec = FAULTS[fault]
    result: Any = None
    for _ in range(spec.deliveries):
        result = call()
    if spec.error is not None:
        assert injector is not None
        raise spec.error.injected(site, config=injector.config)
    return result


def deliver(
    injector: FaultInjector | None,
    site: str,
    call: Callable[[], T],
    *,
    role: Role = Role.CALL,
    agent: str = "",
    meta: dict[str, Any] | None = None,
) -> T:
    """Make a forward tool call through the fault boundary (point CALL), as `agent`'s delivery
    of `role` for the logical call `site` (the fault draw's key, see `FaultInjector`).

    No fault: one call, its result. F1: no call, then ToolCallFailed. F2: one call, then the
    same ToolCallFailed (the caller cannot tell the two apart). F4: exactly two deliveries,
    the second result is returned and nothing is raised. F5: no call, ToolTimeout with
    `.stall_ms` (the virtual-clock driver charges it). A real exception from `call` propagates unchanged and
    pre-empts the injected one. `injector=None` means no injection.
    """
    return _through(injector, Point.CALL, site, call, meta, role, agent)


def compensate(
    injector: FaultInjector | None,
    site: str,
    call: Callable[[], T],
    *,
    role: Role = Role.CALL,
    agent: str = "",
    meta: dict[str, Any] | None = None,
) -> T:
    """Run a compensation through the fault boundary (point COMPENSATE), keyed as `deliver`.

    F3: no call, CompensationFailed. Otherwise one call, its result.
    """
    return _through(injector, Point.COMPENSATE, site, call, meta, role, agent)

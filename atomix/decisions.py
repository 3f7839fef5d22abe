"""What the core answers: decisions and settlement plans, plain data for drivers to act on."""

from __future__ import annotations

from dataclasses import dataclass, field

from atomix.effects import AbortSource, Effect


@dataclass(frozen=True, slots=True)
class Blocker:
    """An earlier unsettled transaction that a waiter must outlast, and where they meet."""

    txid: int
    epoch: int
    scope: str


@dataclass(frozen=True, slots=True)
class Proceed:
    """The access may go ahead now."""


PROCEED = Proceed()


@dataclass(frozen=True, slots=True)
class Wait:
    """Not yet: these earlier transactions must settle first. Only ever earlier epochs."""

    txid: int
    blockers: tuple[Blocker, ...]


# Plans and settlements are made once per transaction on the hot path, and a frozen
# dataclass pays an object.__setattr__ call per field; these are plain records instead:
# the core never reads one back, so changing one changes nothing in the protocol.
@dataclass(slots=True)
class CommitPlan:
    """The transaction committed; the driver applies, releases and accepts its effects.

    `apply` holds bufferable effects and `release` gated irreversible ones, each in staging
    order; `accept` lists reversible effects that are now final.
    """

    txid: int
    epoch: int
    apply: tuple[Effect, ...] = ()
    release: tuple[Effect, ...] = ()
    accept: tuple[Effect, ...] = ()


@dataclass(slots=True)
class AbortPlan:
    """The transaction aborted; the driver compensates (in the given, reverse order) and drops."""

    txid: int
    epoch: int
    source: AbortSource
    detail: str = ""
    compensate: tuple[Effect, ...] = ()
    drop: tuple[Effect, ...] = ()


Decision = Proceed | Wait | CommitPlan | AbortPlan


@dataclass(slots=True)
class Settlement:
    """The record of one finished transaction: what became of each of its effects."""

    txid: int
    epoch: int
    trace: str
    group: str | None
    outcome: str  # "committed" | "aborted"
    abort_source: str | None
    detail: str
    applied: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    accepted: tuple[str, ...] = ()
    compensated: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    residue: tuple[str, ...] = ()
    failed_applies: tuple[str, ...] = ()
    duplicates_suppressed: int = 0
    waited: float = 0.0
    reads: tuple[str, ...] = field(default=())
    writes: tuple[str, ...] = field(default=())
    # Effect key -> the exception that made it residue or a failed apply (its last attempt's).
    # Set by the driver that carried out the plan; the core never raises or sees one.
    errors: dict[str, BaseException] = field(default_factory=dict)

    @property
    def committed(self) -> bool:
        return self.outcome == "committed"

    @property
    def clean(self) -> bool:
        """Settled without residue or a commit-time apply that never landed."""
        return not self.residue and not self.failed_applies


@dataclass(slots=True)
class Resolution:
    """What `resolve` (or `abort_group`) did to a speculation group.

    Losing branches that externalised reversible effects come back in `compensate`: the
    driver carries out each plan, then finishes it. Losers with nothing to compensate (they
    only staged or queued) have nothing for a driver to do, so they are settled on the spot:
    their records are in `settled`, and `woken` lists the transactions that were waiting on
    them. `decision` is the winner's commit decision (None from `abort_group`).
    """

    decision: CommitPlan | Wait | AbortPlan | None
    compensate: list[AbortPlan] = field(default_factory=list)
    settled: list[Settlement] = field(default_factory=list)
    woken: list[int] = field(default_factory=list)

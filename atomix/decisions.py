"""What the core answers: decisions and settlement plans, plain data for drivers to act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from atomix.effects import AbortSource, Effect


class Blocker(NamedTuple):
    """An earlier unsettled transaction that a waiter must outlast, and where they meet (a
    scope it holds that overlaps the waiter's access).

    Immutable and hashable. A tuple, not a dataclass: a Wait under contention names one per
    earlier transaction in the way, and a tuple is made, hashed and compared in C."""

    txid: int
    epoch: int
    scope: str


@dataclass(frozen=True, slots=True)
class Proceed:
    """The access may go ahead now."""


PROCEED = Proceed()


@dataclass(frozen=True, slots=True)
class Wait:
    """Not yet: these earlier transactions must settle first. Only ever earlier epochs.

    `wake_on` names those of them whose settling wakes the waiter (`finish` lists it once
    all of these have settled); it then decides again. Usually they are the latest blocker
    in each queue it waits in, which settles after the rest; if one settled out of order,
    the waiter parks again, on all of its blockers that are left."""

    txid: int
    blockers: tuple[Blocker, ...]
    wake_on: tuple[int, ...] = ()


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


@dataclass(slots=True, init=False)
class Settlement:
    """The record of one finished transaction: what became of each of its effects."""

    txid: int
    epoch: int
    trace: str
    group: str | None
    outcome: str  # "committed" | "aborted"
    abort_source: str | None
    detail: str
    applied: tuple[str, ...]
    released: tuple[str, ...]
    accepted: tuple[str, ...]
    compensated: tuple[str, ...]
    dropped: tuple[str, ...]
    residue: tuple[str, ...]
    failed_applies: tuple[str, ...]
    duplicates_suppressed: int
    waited: float
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    # Effect key -> the exception that made it residue or a failed apply (its last attempt's).
    # Set by the driver that carried out the plan; the core never raises or sees one.
    errors: dict[str, BaseException]

    # Written out: one is made per transaction (per losing branch, too), and the generated
    # __init__ pays for its defaults and the factory of `errors`.
    def __init__(
        self,
        txid: int,
        epoch: int,
        trace: str,
        group: str | None,
        outcome: str,
        abort_source: str | None,
        detail: str,
        applied: tuple[str, ...] = (),
        released: tuple[str, ...] = (),
        accepted: tuple[str, ...] = (),
        compensated: tuple[str, ...] = (),
        dropped: tuple[str, ...] = (),
        residue: tuple[str, ...] = (),
        failed_applies: tuple[str, ...] = (),
        duplicates_suppressed: int = 0,
        waited: float = 0.0,
        reads: tuple[str, ...] = (),
        writes: tuple[str, ...] = (),
        errors: dict[str, BaseException] | None = None,
    ) -> None:
        self.txid = txid
        self.epoch = epoch
        self.trace = trace
        self.group = group
        self.outcome = outcome
        self.abort_source = abort_source
        self.detail = detail
        self.applied = applied
        self.released = released
        self.accepted = accepted
        self.compensated = compensated
        self.dropped = dropped
        self.residue = residue
        self.failed_applies = failed_applies
        self.duplicates_suppressed = duplicates_suppressed
        self.waited = waited
        self.reads = reads
        self.writes = writes
        self.errors = {} if errors is None else errors

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

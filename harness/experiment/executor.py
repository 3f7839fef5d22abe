"""What every executor is: the `Executor` protocol, the options a run passes it, and the unit
of work a worker runs (`run_batch` over consecutive trial specs).

Records depend only on the spec (`harness.experiment.trial.run_trial`), never on where it
ran, so resume, locking and the record format are the same whichever executor ran a trial.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harness.errors import RunError
from harness.experiment.trial import TrialSpec, run_trial


class ExecutorLost(RunError):
    """The workers went away mid-run (a dask cluster lost or failing): the records written
    so far are whole and the run can be resumed once they are back."""


#: What runs one trial: `harness.experiment.trial.run_trial`, or a stand-in a test substitutes.
TrialFunction = Callable[[TrialSpec], dict[str, Any]]


@dataclass(frozen=True)
class ExecutorOptions:
    """How a run asked for its trials to be run: worker count, for dask the scheduler, and
    the trial function (remote workers import it by name, so it must be importable)."""

    jobs: int = 1
    scheduler: str | None = None
    trial: TrialFunction = run_trial


class Executor(Protocol):
    """Runs trial specs and yields one record per spec as each finishes.

    Guarantees: every record yielded is whole (what `run_trial(spec)` returned); closing the
    generator from `results` stops the work it started before returning; `close()` frees
    whatever the executor holds (pools, clusters, connections) and may be called twice.
    """

    def results(self, specs: Sequence[TrialSpec]) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


def chunk_size(trials: int, workers: int) -> int:
    """Trials sent to a worker at a time: consecutive specs, so a trial's modes mostly run
    together and a worker reuses that trial's goal state; small enough to keep every worker
    busy to the end (about 8 chunks per worker, at most 16 trials each)."""
    return max(1, min(16, trials // (max(1, workers) * 8) or 1))


def run_batch(
    specs: Sequence[TrialSpec], trial: TrialFunction = run_trial
) -> list[dict[str, Any]]:
    """The records of consecutive specs: the task a remote worker runs (it and `trial` are
    sent by name, so a worker needs the project installed)."""
    return [trial(spec) for spec in specs]

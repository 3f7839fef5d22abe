"""Where trials run: the executors a run can send its trials to, by name.

An executor takes trial specs and yields their records as they finish (in no particular
order); the run's one writer (`harness.experiment.runner`) appends each to trials.jsonl, so resume,
locking and record format are the same whichever executor ran a trial. Records depend only
on the spec (`harness.experiment.trial.run_trial`), never on where it ran.

* `local`: this machine, in-process (`jobs=1`) or a pool of forked worker processes.
* `dask`: a dask.distributed cluster (`harness.experiment.dask_executor`): a LocalCluster of `jobs`
  worker processes, or the scheduler at `scheduler`. Imported only when chosen.

Adding one: a class with `results(specs)` and `close()` (the `Executor` protocol) and one
entry in `EXECUTORS`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harness.errors import RunError
from harness.experiment.config import did_you_mean
from harness.experiment.rundir import close_inherited_locks
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


# --------------------------------------------------------------------------- local


def _die_with_parent() -> None:
    # A worker must not outlive a killed parent: it would run on and, on some systems, keep
    # inherited descriptors open. Linux can signal it when the parent goes.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_init(parent: int) -> None:
    # Ctrl-C reaches the whole process group: the parent alone handles it (it marks the run
    # interrupted and stops the pool), so workers ignore SIGINT and die quietly on the SIGTERM
    # of Pool.terminate() instead of inheriting the parent's handlers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    if os.getppid() != parent:
        os._exit(0)  # the parent died before PR_SET_PDEATHSIG was set
    close_inherited_locks()


class LocalExecutor:
    """Trials on this machine: in this process when `jobs` is 1 (or one trial is left), else
    in a pool of `jobs` forked workers that ignore SIGINT, die with the parent and drop the
    run's inherited lock; closing `results` terminates the pool."""

    def __init__(self, options: ExecutorOptions) -> None:
        self.jobs = options.jobs
        self.trial = options.trial

    def results(self, specs: Sequence[TrialSpec]) -> Iterator[dict[str, Any]]:
        if self.jobs <= 1 or len(specs) <= 1:
            for spec in specs:
                yield self.trial(spec)
            return
        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        # The with-block's exit terminates the pool: on an interrupt the caller closes this
        # generator, so workers are stopped before the manifest is marked interrupted.
        with ctx.Pool(self.jobs, initializer=_worker_init, initargs=(os.getpid(),)) as pool:
            chunk = chunk_size(len(specs), self.jobs)
            yield from pool.imap_unordered(self.trial, specs, chunksize=chunk)

    def close(self) -> None:
        pass  # the pool lives only as long as one `results` generator


# --------------------------------------------------------------------------- registry


#: What to install for `--executor dask` (the project's `dask` extra).
DASK_INSTALL_HINT = "pip install '.[dask]'"


def _dask(options: ExecutorOptions) -> Executor:
    try:
        from harness.experiment.dask_executor import (
            DaskExecutor,  # dask is imported only when chosen
        )
    except ImportError as exc:
        if (exc.name or "").startswith(("harness", "atomix")):
            raise
        raise RunError(
            f"executor 'dask' needs dask.distributed, which cannot be imported ({exc}): "
            f"{DASK_INSTALL_HINT} in the project directory"
        ) from None
    return DaskExecutor(options)


@dataclass(frozen=True)
class ExecutorKind:
    """One entry of the registry: how to build the executor, and whether it takes a
    scheduler address."""

    factory: Callable[[ExecutorOptions], Executor]
    takes_scheduler: bool = False


EXECUTORS: dict[str, ExecutorKind] = {
    "local": ExecutorKind(LocalExecutor),
    "dask": ExecutorKind(_dask, takes_scheduler=True),
}
DEFAULT_EXECUTOR = "local"


def executor_problem(name: str, scheduler: str | None = None) -> str | None:
    """What is wrong with asking for executor `name` (with `scheduler`), or None."""
    kind = EXECUTORS.get(name)
    if kind is None:
        return (
            f"unknown executor {name!r}{did_you_mean(name, list(EXECUTORS))}; "
            f"allowed: {', '.join(EXECUTORS)}"
        )
    if scheduler is not None and not kind.takes_scheduler:
        takers = [n for n, k in EXECUTORS.items() if k.takes_scheduler]
        return f"executor {name!r} takes no scheduler address (only {' and '.join(takers)})"
    return None


def open_executor(name: str, options: ExecutorOptions) -> Executor:
    """The executor `name` built for `options`; RunError for an unknown name, a scheduler
    it cannot take, or (dask) a scheduler it cannot reach or a missing install."""
    problem = executor_problem(name, options.scheduler)
    if problem is not None:
        raise RunError(problem)
    return EXECUTORS[name].factory(options)

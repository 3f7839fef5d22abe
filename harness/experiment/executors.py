"""Where trials run: the executors a run can send its trials to, by name.

An executor takes trial specs and yields their records as they finish (in no particular
order); the run's one writer (`harness.experiment.runner`) appends each to trials.jsonl, so resume,
locking and record format are the same whichever executor ran a trial. Records depend only
on the spec (`harness.experiment.trial.run_trial`), never on where it ran.

* `local`: this machine, in-process (`jobs=1`) or a pool of forked worker processes.
* `dask`: a dask.distributed cluster (`harness.experiment.dask_executor`): a LocalCluster of `jobs`
  worker processes, or the scheduler at `scheduler`. Imported only when chosen.

Adding one: a module with a class that has `results(specs)` and `close()` (the `Executor`
protocol of `harness.experiment.executor`) and one row in `EXECUTORS`.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.errors import RunError
from harness.experiment.executor import Executor, ExecutorLost, ExecutorOptions
from harness.registry import Entry, Registry

__all__ = ["DEFAULT_EXECUTOR", "EXECUTORS", "Executor", "ExecutorLost", "ExecutorOptions",
           "executor_problem", "open_executor"]


#: What to install for `--executor dask` (the project's `dask` extra).
DASK_INSTALL_HINT = "pip install '.[dask]'"


def _load(name: str) -> Callable[[ExecutorOptions], Executor]:
    try:
        return EXECUTORS[name]  # the module (for dask: dask itself) is imported only when chosen
    except ImportError as exc:
        if (exc.name or "").startswith(("harness", "atomix")):
            raise
        raise RunError(
            f"executor {name!r} needs a package that cannot be imported ({exc}): "
            f"{EXECUTORS.entry(name).meta.get('install', 'see the README')} in the project directory"
        ) from None


EXECUTORS: Registry[Callable[[ExecutorOptions], Executor]] = Registry("executor", [
    Entry("local", "harness.experiment.local_executor:LocalExecutor",
          "this machine: in-process with one job, else a pool of forked workers"),
    Entry("dask", "harness.experiment.dask_executor:DaskExecutor",
          "a dask.distributed cluster: the one at --scheduler, else a LocalCluster",
          {"takes_scheduler": True, "install": DASK_INSTALL_HINT}),
])
DEFAULT_EXECUTOR = "local"


def executor_problem(name: str, scheduler: str | None = None) -> str | None:
    """What is wrong with asking for executor `name` (with `scheduler`), or None."""
    if name not in EXECUTORS:
        return EXECUTORS.unknown(name)
    if scheduler is not None and not EXECUTORS.entry(name).meta.get("takes_scheduler"):
        takers = [e.name for e in EXECUTORS.entries() if e.meta.get("takes_scheduler")]
        return f"executor {name!r} takes no scheduler address (only {' and '.join(takers)})"
    return None


def open_executor(name: str, options: ExecutorOptions) -> Executor:
    """The executor `name` built for `options`; RunError for an unknown name, a scheduler
    it cannot take, or (dask) a scheduler it cannot reach or a missing install."""
    problem = executor_problem(name, options.scheduler)
    if problem is not None:
        raise RunError(problem)
    return _load(name)(options)

"""The `local` executor: trials on this machine, in this process or a pool of forked workers."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Any

from harness.experiment.executor import ExecutorOptions, chunk_size
from harness.experiment.rundir import close_inherited_locks
from harness.experiment.trial import TrialSpec


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

"""The `dask` executor: trials run on a dask.distributed cluster, records stream back as
they finish to the run's one writer (see `harness.experiment.executors`).

With a scheduler address it connects to that cluster (`dask scheduler` on one machine,
`dask worker tcp://HOST:8786` on each machine with the project installed); without one it
starts a LocalCluster of `jobs` worker processes for the run and stops it afterwards. dask is
imported here only, and `harness.experiment.executors` imports this module only when this executor is
chosen (saying how to install dask when it is missing).

A task is `harness.experiment.executor.run_batch` over a few consecutive specs, pickled by reference:
workers import it from their own install (checked on connecting), so a record is exactly
what a local run writes apart from its timings. At most a few batches per worker thread are
queued at a time, so a huge plan never sits in the scheduler's memory and an interrupt
cancels little.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError
from typing import Any

import distributed
from distributed.comm import CommClosedError
from distributed.comm.addressing import parse_address, parse_host_port

from harness.errors import RunError
from harness.experiment.executor import ExecutorLost, ExecutorOptions, chunk_size, run_batch
from harness.experiment.trial import TrialSpec

#: How long to try to reach a scheduler before giving up.
CONNECT_TIMEOUT_S = 10.0
#: Address schemes whose scheduler listens on a TCP socket, which `_probe` can try first.
PROBED_SCHEMES = ("tcp", "tls", "ws", "wss")
#: How long to wait for a scheduler with no workers to get its first one.
WORKER_WAIT_S = 30.0
#: Batches queued per worker thread: enough that no worker waits for the next one.
QUEUED_PER_THREAD = 2


def _probe(address: str) -> None:
    """RunError naming `address` unless it is a scheduler address something listens on.

    A plain socket first: dask's own connect retries a refused port until its timeout (a
    scheduler may be starting), and a client that never connected stalls in its finaliser;
    a user who typed the address wants to hear at once that nothing answers there."""
    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except ValueError as exc:
        raise RunError(
            f"--scheduler {address!r} is not a scheduler address ({exc}); expected "
            "tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786; nothing was run"
        ) from None
    if scheme not in PROBED_SCHEMES:
        return  # (ucx, inproc) not a TCP socket: left to dask's own connect
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise RunError(
            f"cannot reach the dask scheduler at {address} ({reason}); start it there with "
            "`dask scheduler` (it listens on tcp://HOST:8786) and check the address and "
            "port; nothing was run"
        ) from None


def _check_workers(client: Any, address: str) -> None:
    """RunError unless every worker can import the project: a worker that cannot unpickle a
    task drops its connection and the task waits forever, so this is asked first, with
    `exec` (a builtin: the question itself needs nothing from the project)."""
    answers = client.run(exec, "import harness.experiment.executor", on_error="return")
    failed = {w: a for w, a in answers.items() if isinstance(a, BaseException)}
    if failed:
        worker, error = next(iter(failed.items()))
        raise RunError(
            f"{len(failed)} of {len(answers)} dask workers of {address} cannot import this "
            f"project ({worker}: {error}): install it on every worker machine (pip install . "
            "in its directory, the same version as here) and restart `dask worker` there; "
            "nothing was run"
        )


class IgnoreSigint(distributed.WorkerPlugin):
    """A worker plugin: LocalCluster workers ignore Ctrl-C, which reaches the whole process
    group; the run (their parent) handles it and stops them, as the local pool's do."""

    name = "atomix-ignore-sigint"

    def setup(self, worker: Any) -> None:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:
            pass  # not the process's main thread: nothing to do from here


class DaskExecutor:
    """Trials on a dask.distributed cluster: the scheduler at `options.scheduler`, or a
    LocalCluster of `options.jobs` single-threaded worker processes of its own.

    Guarantees: construction either starts the LocalCluster, or connects to the address and
    sees at least one worker, or raises RunError naming the address; `results` yields
    each record once, as its batch finishes; closing it cancels the batches not yet done;
    a cluster lost mid-run raises `ExecutorLost` (records already yielded are whole).
    """

    def __init__(self, options: ExecutorOptions) -> None:
        self.jobs = max(1, options.jobs)
        self.address = options.scheduler
        self.trial = options.trial
        self.cluster: Any = None
        self.client: Any = None
        # The client logs a traceback when it loses the scheduler; the run says it in one
        # line (ExecutorLost, with the command that resumes it) instead.
        self._client_log = logging.getLogger("distributed.client")
        self._client_log_level = self._client_log.level
        self._client_log.setLevel(logging.CRITICAL)
        # Started now, not on the first trial: a cluster that cannot start fails before the
        # run directory exists, and its start-up does not count as the trials' time.
        try:
            self.client = self._connect(self.address) if self.address else self._start_local()
        except BaseException:
            self.close()  # a LocalCluster half started, the log level
            raise

    def _connect(self, address: str) -> Any:
        _probe(address)
        try:
            client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise RunError(
                f"cannot talk to a dask scheduler at {address} ({exc}): is it a `dask "
                "scheduler` of a compatible dask version? nothing was run"
            ) from None
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_S)
        except TimeoutError:
            client.close()
            raise RunError(
                f"the dask scheduler at {address} has no workers after {WORKER_WAIT_S:.0f} s: "
                f"start `dask worker {address}` on each machine (with this project installed); "
                "nothing was run"
            ) from None
        try:
            _check_workers(client, address)
        except BaseException:
            client.close()
            raise
        return client

    def _start_local(self) -> Any:
        self.cluster = distributed.LocalCluster(
            n_workers=self.jobs,
            threads_per_worker=1,  # trials are CPU-bound Python: one per process
            processes=True,
            dashboard_address=None,
            # No dashboard, and its HTTP server (health, metrics) on a free port: the
            # default 8787 may be taken (another cluster) and would print a warning.
            scheduler_kwargs={"dashboard_address": ":0"},
            silence_logs=logging.ERROR,  # its warnings would break the progress bar
        )
        client = distributed.Client(self.cluster, set_as_default=False)
        client.register_plugin(IgnoreSigint())
        return client

    def _threads(self) -> int:
        return max(1, sum(self.client.nthreads().values()))

    def results(self, specs: Sequence[TrialSpec]) -> Iterator[dict[str, Any]]:
        if not specs:
            return
        client = self.client
        if client is None:
            raise RunError("the dask executor was closed")
        chunk = chunk_size(len(specs), self._threads())
        batches = (list(specs[i : i + chunk]) for i in range(0, len(specs), chunk))
        running = distributed.as_completed(loop=client.loop)
        live: set[Any] = set()

        def top_up() -> None:
            want = QUEUED_PER_THREAD * self._threads()
            while len(live) < want:
                batch = next(batches, None)
                if batch is None:
                    return
                future = client.submit(run_batch, batch, self.trial, pure=False)
                live.add(future)
                running.add(future)

        try:
            top_up()
            for future in running:
                live.discard(future)
                records = self._records(future)
                top_up()
                yield from records
        finally:
            if live:
                client.cancel(list(live), force=True)

    def _records(self, future: Any) -> list[dict[str, Any]]:
        where = self.address or "the LocalCluster"
        try:
            records: list[dict[str, Any]] = future.result()
        except ImportError as exc:
            if self.address is None:
                raise  # a LocalCluster shares this process's install: a real bug, as is
            raise RunError(
                f"a dask worker of {where} cannot import {exc.name or exc}: every worker "
                "machine needs this project installed (pip install . in its directory), "
                "the same version as here"
            ) from exc
        # (a lost scheduler cancels every future: FutureCancelledError, a CancelledError)
        except (CancelledError, distributed.KilledWorker, CommClosedError) as exc:
            why = getattr(exc, "reason", None) or str(exc).splitlines()[0]
            raise ExecutorLost(f"lost the dask cluster at {where} ({why})") from exc
        finally:
            future.release()
        return records

    def close(self) -> None:
        client, self.client = self.client, None
        cluster, self.cluster = self.cluster, None
        try:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        finally:
            self._client_log.setLevel(self._client_log_level)

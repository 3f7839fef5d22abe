"""`python -m harness.bench.coordinator [--url URL ...] [--seconds S] [--procs 1,2,4,8]`:
the multi-process coordinator's cost, printed.

For each coordinator URL (default: a SQLite coordinator in a temporary directory; pass a
``postgresql://`` URL to measure PostgreSQL too), and for 1, 2, 4 and 8 OS processes, each
with its own `Runtime(coordinator=URL)`, on disjoint scopes (each process writes its own
key) and on one contended scope (every process writes the same key), for `seconds`: commit
latency p50 and p99 (one transaction: begin, one bufferable call, commit), committed
transactions per second over all processes, how many commits waited, and the cost per call
and per commit against the in-process runtime (`Runtime()` in one process, same loop).

Targets (issue: 2 cores): a disjoint commit adds at most 2 ms p50 over in-process; disjoint
throughput grows with processes until the cores are saturated; no process waits on a
disjoint scope. Every figure depends on the machine and its load.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomix import Runtime


@dataclass
class Run:
    """What one process measured."""

    commits: int
    aborts: int
    waited: int
    latencies: list[float]  # seconds per committed transaction
    calls: list[float]  # seconds per shimmed call
    commit_parts: list[float]  # seconds per commit (leaving the block)
    first_error: str = ""


def _loop(rt: Runtime, key: str, seconds: float) -> Run:
    store: dict[str, int] = {}

    @rt.tool(effect="bufferable", writes="name:{k}")
    def put(k: str, v: int) -> None:
        store[k] = v

    run = Run(0, 0, 0, [], [], [])
    end = time.perf_counter() + seconds
    clock = time.perf_counter
    while clock() < end:
        t0 = clock()
        try:
            with rt.transaction():
                t1 = clock()
                put(key, run.commits)
                t2 = clock()
            t3 = clock()
        except Exception as exc:  # noqa: BLE001 - an abort under contention: counted, retried
            run.aborts += 1
            if run.aborts == 1:
                run.first_error = f"{type(exc).__name__}: {exc}"
            continue
        run.commits += 1
        run.latencies.append(t3 - t0)
        run.calls.append(t2 - t1)
        run.commit_parts.append(t3 - t2)
    run.waited = sum(1 for s in rt.settlements if s.waited > 0)
    return run


def _worker(url: str, key: str, seconds: float, start: Any, out: Any) -> None:
    rt = Runtime(coordinator=url, timeout=60)
    try:
        start.wait()
        out.put(_loop(rt, key, seconds))
    finally:
        rt.close()


def measure(url: str, procs: int, contended: bool, seconds: float) -> list[Run]:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker, args=(url, "hot" if contended else f"p{i}", seconds, start, out)
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    time.sleep(1.0 + 0.3 * procs)  # let them import and join before the clock starts
    start.set()
    runs = [out.get(timeout=seconds + 120) for _ in workers]
    for w in workers:
        w.join(30)
    return runs


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def in_process(seconds: float) -> Run:
    rt = Runtime()
    try:
        return _loop(rt, "p0", seconds)
    finally:
        rt.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.coordinator")
    parser.add_argument("--url", action="append", default=[], help="a coordinator URL (repeatable)")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--procs", default="1,2,4,8")
    args = parser.parse_args(argv)
    try:
        procs = [int(p) for p in args.procs.split(",")]
    except ValueError:
        parser.error(f"--procs: expected numbers separated by commas, got {args.procs!r}")
    if any(p < 1 for p in procs) or args.seconds <= 0:
        parser.error("--procs must be >= 1 and --seconds > 0")
    tmp = Path(tempfile.mkdtemp(prefix="atomix-bench-coord-"))
    urls = args.url or [f"sqlite://{tmp}/coordinator.db"]
    base = in_process(args.seconds)
    base_p50 = _pct(base.latencies, 0.5) * 1e3
    print(
        f"in-process runtime: commit p50 {base_p50:.3f} ms, p99 {_pct(base.latencies, 0.99) * 1e3:.3f} ms, "
        f"{base.commits / args.seconds:.0f} tx/s, call {statistics.median(base.calls) * 1e6:.1f} us, "
        f"commit {statistics.median(base.commit_parts) * 1e6:.1f} us"
    )
    header = (
        f"{'coordinator':<11} {'scope':<9} {'procs':>5} {'p50 ms':>8} {'p99 ms':>8} {'tx/s':>8} "
        f"{'waited':>7} {'aborts':>7} {'call us':>8} {'commit us':>9} {'+p50 ms':>8}"
    )
    for url in urls:
        kind = url.split(":", 1)[0]
        print(header)
        for contended in (False, True):
            for n in procs:
                runs = measure(url, n, contended, args.seconds)
                lat = [x for r in runs for x in r.latencies]
                calls = [x for r in runs for x in r.calls]
                commits = [x for r in runs for x in r.commit_parts]
                p50 = _pct(lat, 0.5) * 1e3
                print(
                    f"{kind:<11} {'contended' if contended else 'disjoint':<9} {n:>5} "
                    f"{p50:>8.3f} {_pct(lat, 0.99) * 1e3:>8.3f} "
                    f"{sum(r.commits for r in runs) / args.seconds:>8.0f} "
                    f"{sum(r.waited for r in runs):>7} {sum(r.aborts for r in runs):>7} "
                    f"{statistics.median(calls) * 1e6 if calls else float('nan'):>8.1f} "
                    f"{statistics.median(commits) * 1e6 if commits else float('nan'):>9.1f} "
                    f"{p50 - base_p50:>8.3f}"
                )
                errors = sorted({r.first_error for r in runs if r.first_error})
                for error in errors[:3]:
                    print(f"    first error: {error[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

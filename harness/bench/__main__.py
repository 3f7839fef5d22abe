"""`python -m harness.bench [--quick] [--suite [--full]] [--memory]`: every benchmark, printed.

Without `--suite`: the runtime's overheads (`harness.bench.runtime`): (a) a shimmed
bufferable call against a direct call, (b) a commit of 4 bufferable effects, (c) speculation
with K branches (paper Table 17), (d) the durable log's cost per commit, (e) the hot paths
against their targets; then (f) memory over a long life (`harness.bench.memory`: RSS every
100,000 of 1,000,000 transactions; `--memory` prints only that). With `--suite`: only the figures that have targets, each PASS or
MISS: the hot paths, the wait path's scaling (`harness.bench.scaling`) and the harness's
trial throughput (`harness.bench.trials`). Nothing here is a test: the test suite times
nothing, and every figure depends on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from harness.bench.figures import Figure, Stats, mark, print_figures
from harness.bench.memory import print_memory_section
from harness.bench.runtime import (
    PAPER_TABLE_17,
    SHIM_TARGET_US,
    SPEC16_TARGETS_US,
    bench_commit,
    bench_reference,
    bench_shim,
    bench_speculation,
    bench_speculation_parts,
    hot_path_figures,
    print_log_section,
)
from harness.bench.scaling import scaling_figures
from harness.bench.trials import suite_figures as trial_figures


def suite_figures(quick: bool = True, *, tiny: bool = False) -> list[Figure]:
    """Every figure that has a target: the hot paths and the wait path's scaling here, the
    trial throughput from `harness.bench.trials` unless `tiny`."""
    figures = hot_path_figures(quick, tiny=tiny) + scaling_figures(quick, tiny=tiny)
    if not tiny:
        figures += trial_figures(quick)
    return figures


def run_suite(quick: bool, tiny: bool) -> int:
    started = time.perf_counter()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"harness.bench --suite: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {load}")
    print("(times are medians; CPU figures are process time; other processes on the machine")
    print(" slow every figure, p99s most)\n")
    # A fresh process runs slower for its first few tenths of a second (see main): warm up
    # before the first timed sample.
    warm_until = time.perf_counter() + (0.1 if tiny else 1.0)
    while time.perf_counter() < warm_until:
        bench_reference(100)
    figures = suite_figures(quick, tiny=tiny)
    print_figures(figures)
    missed = [f.name for f in figures if f.met is False]
    print(f"\n{len(figures)} figures, {len(missed)} missed; {time.perf_counter() - started:.0f} s")
    return 0


# --------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.bench", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a fast, noisier run")
    parser.add_argument(
        "--suite", action="store_true",
        help="only the figures that have targets (wait path, hot paths, trial throughput), "
        "each with its target and PASS/MISS",
    )
    parser.add_argument("--full", action="store_true", help="with --suite: more repetitions")
    parser.add_argument(
        "--memory", action="store_true",
        help="only (f): RSS over a long life (1,000,000 transactions; 20,000 with --quick)",
    )
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests
    args = parser.parse_args(argv)
    if args.suite:
        return run_suite(quick=not args.full, tiny=args.tiny)
    if args.memory:
        print_memory_section(args.quick)
        return 0
    scale = 0.1 if args.quick else 1.0
    shim_rounds = max(20, int(400 * scale))
    commit_rounds = max(500, int(20000 * scale))
    spec_rounds = {2: 4000, 4: 3000, 8: 2000, 16: 2000}

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    print(f"harness.bench: Python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} CPUs")
    print(f"load average before the run: {load} (other processes inflate medians and p99s)")
    print("gc left enabled; effects apply to an in-memory dict, so every figure is the runtime's")
    print("own overhead, not I/O. Times in µs; p99 = 99th percentile of single samples.\n")

    ref_rounds = max(500, int(5000 * scale))
    # A fresh process runs slower for its first few tenths of a second (time
    # `bench_reference` right at start and again after a second's warm-up to see by how
    # much on this machine): warm up first.
    warm_until = time.perf_counter() + (0.2 if args.quick else 1.0)
    while time.perf_counter() < warm_until:
        bench_reference(100)
    reference = bench_reference(ref_rounds)
    started = time.perf_counter()
    print(
        f"(a) shimmed bufferable call vs direct call ({100 * shim_rounds} calls each, 100 per tx)"
    )
    print("                          direct med   shimmed med   shimmed p99    added med")
    for label, fresh in (("same 100 scopes", False), ("a new scope per call", True)):
        direct, shimmed = bench_shim(shim_rounds, per_tx=100, fresh=fresh)
        added = shimmed.median - direct.median
        verdict = (
            "" if fresh else f"   target <= {SHIM_TARGET_US:.0f}: {mark(added <= SHIM_TARGET_US)}"
        )
        print(
            f"    {label:20s} {direct.median:11.2f}   {shimmed.median:11.2f}   "
            f"{shimmed.p99:11.2f}   {added:10.2f}{verdict}"
        )
    print("    (a named scope text is canonicalised once and memoised; a new one costs a parse)\n")

    commit, whole = bench_commit(commit_rounds)
    print(f"(b) transaction with 4 bufferable effects ({commit.n} transactions)")
    print(f"    commit                 median {commit.median:8.2f}   p99 {commit.p99:8.2f}")
    print(f"    begin + 4 calls + commit median {whole.median:6.2f}   p99 {whole.p99:8.2f}\n")

    print("(c) speculation: K branches each stage one bufferable effect (a shimmed call) on one")
    print("    scope; resolve aborts K-1 losers and commits the winner. setup = begin K branches")
    print("    and stage; commit = resolve + commit.")
    print(
        "     K    runs   setup med   commit med   total med   total p99   "
        "(paper: setup / commit / total / p99)"
    )
    k16: Stats | None = None
    k16_resolve = 0.0
    for k, rounds in spec_rounds.items():
        n = max(100, int(rounds * scale))
        setup, settle, total = bench_speculation(k, n)
        if k == 16:
            k16, k16_resolve = total, settle.median
        paper = "{} / {} / {} / {}".format(*PAPER_TABLE_17[k])
        print(
            f"    {k:2d} {n:7d}   {setup.median:9.1f}   {settle.median:10.1f}   "
            f"{total.median:9.1f}   {total.p99:9.1f}   ({paper})"
        )
    assert k16 is not None
    bare, call = bench_speculation_parts(16, max(100, int(2000 * scale)))
    print(
        f"    K = 16 per branch: begin + enter + seal {bare:.1f}, the shimmed call {call:.1f}; "
        f"resolve per branch {k16_resolve / 16:.1f}"
    )
    median_target, p99_target = SPEC16_TARGETS_US
    print(
        f"    K = 16 target: median <= {median_target:.0f} "
        f"({mark(k16.median <= median_target)}), p99 <= {p99_target:.0f} "
        f"({mark(k16.p99 <= p99_target)})"
    )
    print()
    print("(e) hot paths against their targets, each next to a bare call measured in this run")
    print_figures(hot_path_figures(args.quick))
    print()
    print_log_section(args.quick)
    print()
    print_memory_section(args.quick)
    print()
    after = bench_reference(ref_rounds)
    print(
        f"machine reference (the K = 16 loop of (c) with plain stand-ins, no runtime): "
        f"median {reference.median:.1f} µs before the run, {after.median:.1f} µs after"
    )
    print("    (a slower reference means a slower machine at the time: every figure slows with it)")
    print(f"wall time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

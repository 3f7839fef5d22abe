"""Memory over a long life: the resident set size of one runtime while it settles a million
transactions, each touching two scopes no earlier one touched (two keyed sends to new
addresses), with the runtime's defaults.

`python -m harness.bench.memory [--transactions N] [--every K]` (or `python -m harness.bench
--memory`) prints the RSS, the settlement history's length and the number of scopes the core
tracks after every K transactions. A runtime that keeps what settled work left behind grows
with every row; a bounded one is flat after warm-up. The figure is the process's, so the
interpreter's own allocator and other modules count in it: compare rows, not absolute values.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from atomix import Runtime


@dataclass(frozen=True)
class MemoryRow:
    """The process's memory after `done` transactions."""

    done: int
    rss_mb: float
    peak_mb: float
    settlements: int
    scopes: int
    seconds: float


def rss_mb() -> float:
    """The current resident set size, from /proc (Linux); elsewhere the peak so far."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return peak_mb()


def peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def run(transactions: int = 1_000_000, every: int = 100_000) -> list[MemoryRow]:
    """Settle `transactions` transactions of two keyed sends to new addresses each, and
    measure after every `every` of them (and once before the first)."""
    rt = Runtime()
    delivered = [0]

    @rt.tool(effect="irreversible", writes="mail:{to}", key="{to}")
    def send(to: str, text: str) -> None:
        delivered[0] += 1

    def row(done: int, started: float) -> MemoryRow:
        gc.collect()
        return MemoryRow(
            done, rss_mb(), peak_mb(), len(rt.settlements), rt.core.tracked_scopes(),
            time.perf_counter() - started,
        )

    started = time.perf_counter()
    rows = [row(0, started)]
    for i in range(transactions):
        with rt.transaction():
            send(f"a{i}@example.org", "hello")
            send(f"b{i}@example.org", "hello")
        if (i + 1) % every == 0:
            rows.append(row(i + 1, started))
    assert delivered[0] == 2 * transactions
    return rows


def print_rows(rows: list[MemoryRow]) -> None:
    print("    transactions    RSS MB   peak MB   settlements kept   scopes tracked   seconds")
    for r in rows:
        print(
            f"    {r.done:12,d}  {r.rss_mb:8.1f}  {r.peak_mb:8.1f}   {r.settlements:16,d}   "
            f"{r.scopes:14,d}   {r.seconds:7.1f}"
        )
    warm = [r for r in rows if r.done >= rows[-1].done // 5] or rows
    if len(warm) >= 2:
        growth = warm[-1].rss_mb - warm[0].rss_mb
        print(
            f"    after warm-up ({warm[0].done:,d} -> {warm[-1].done:,d}): RSS changed by "
            f"{growth:+.1f} MB"
        )


def print_memory_section(quick: bool) -> None:
    transactions = 20_000 if quick else 1_000_000  # quick: a smoke run, too short to judge
    every = transactions // 10
    print(
        f"(f) memory over a long life: RSS every {every:,d} of {transactions:,d} transactions, "
        "two keyed sends to new addresses each (default Runtime)"
    )
    print_rows(run(transactions, every))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.bench.memory", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--transactions", type=int, default=1_000_000, help="how many (default 1,000,000)")
    parser.add_argument("--every", type=int, default=100_000, help="measure after every K (default 100,000)")
    args = parser.parse_args(argv)
    if args.transactions < 1 or args.every < 1:
        parser.error("--transactions and --every must be positive integers")
    print(f"harness.bench.memory: Python {sys.version.split()[0]} on {sys.platform}")
    print_rows(run(args.transactions, args.every))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

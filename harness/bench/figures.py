"""What every benchmark reports: a `Figure` (a value with its target), sample statistics,
and the one way figures are printed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One measured figure of `--suite`, with its target; `met` is None where no target
    applies (a figure shown for context). Other suites (the harness's trial throughput)
    return these too, so that one report prints them all alike."""

    name: str
    value: float
    unit: str
    target: str
    met: bool | None


@dataclass(frozen=True)
class Stats:
    """Median and 99th percentile of a sample of durations, in microseconds."""

    median: float
    p99: float
    n: int

    @classmethod
    def of(cls, samples_ns: Sequence[int]) -> Stats:
        ordered = sorted(samples_ns)
        n = len(ordered)
        p99 = ordered[min(n - 1, max(0, int(round(0.99 * n)) - 1))]
        return cls(statistics.median(ordered) / 1000.0, p99 / 1000.0, n)


def mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def fit_exponent(points: Sequence[tuple[int, float]]) -> float:
    """The slope of log(cost) against log(n), least squares: cost ~ n ** slope."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(max(cost, 1e-9)) for _, cost in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def print_figures(figures: Sequence[Figure]) -> None:
    """One line per figure: name, value and unit, target, PASS / MISS (or - without one)."""
    for f in figures:
        verdict = "-" if f.met is None else "PASS" if f.met else "MISS"
        target = "" if f.target in ("-", "none") else f"  (target {f.target})"
        print(f"  {verdict:4s}  {f.name}: {f.value:g} {f.unit}{target}")

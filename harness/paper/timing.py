"""Paper tables measured by a timing benchmark rather than by trial records.

A table of wall-clock timings (Table 17) cannot come from trial records, which must be the
same for the same seed: it is measured by a benchmark (``BENCHMARKS``) in a fresh process,
with the paper's N, and judged by the timing rule (``judge_timing``, ``TIMING_RULE``). A
measurement is stored as JSON under the output directory and reused while its runs and
repeats match.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import RunError
from harness.experiment.paper_cells import PaperCell, cells_by_table
from harness.paper.judge import (
    DIFFERS,
    NOT_COMPARABLE,
    REPRODUCED,
    Line,
    Note,
    Section,
    Verdict,
    find_note,
)
from harness.paper.mapping import judged_cells, paper_text
from harness.paper.measure import format_number

__all__ = [
    "BENCHMARKS",
    "BENCH_DIR",
    "BENCH_REPEATS",
    "TIMING_FACTOR",
    "TIMING_RULE",
    "Benchmark",
    "benchmark_section",
    "judge_timing",
    "run_benchmark",
    "speculation_latency",
]

#: A timing is reproduced when ours is within this factor of the paper's, either way.
TIMING_FACTOR = 3.0
#: Repeats of a benchmark's measurement (each with the paper's N): full, --quick.
BENCH_REPEATS = (5, 3)
#: Where measurements are stored, under the output directory.
BENCH_DIR = "benchmarks"

#: The timing rule as REPRODUCTION.md states it.
TIMING_RULE = (
    "**Timings** (Table 17, µs) cannot come from trial records, which are the same for the "
    "same seed: `atomix reproduce` measures them with `harness.bench.runtime` in a fresh "
    "process, with "
    f"the paper's N (runs per row), repeated {BENCH_REPEATS[0]} times ({BENCH_REPEATS[1]} "
    "with --quick); ours is the median of the repeats' figures, shown with their range. Two "
    "machines' wall-clock figures differ by their speed and load, so a timing is "
    f"**reproduced** when 1/{TIMING_FACTOR:g} <= ours / paper <= {TIMING_FACTOR:g} and "
    "**differs** otherwise (the machine, its load and the measurement file are listed under "
    "Runs; delete that file to measure again)."
)


@dataclass(frozen=True)
class Benchmark:
    """A paper table measured by a timing benchmark rather than by trial records. `measure`
    (runs, repeats) returns, per paper row and column label, one figure per repeat; `row_name`
    says what a row label is (Table 17's rows are K)."""

    table: int
    name: str
    runs: int
    measure: Callable[[int, int], dict[str, dict[str, list[float]]]]
    row_name: str = "row"


_SPECULATION_COLUMNS = {
    "setup": "Setup (μs)",
    "commit": "Commit (μs)",
    "total": "Total (μs)",
    "p99": "p99 (μs)",
}


def speculation_latency(runs: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Table 17 by `harness.bench.runtime.speculation_table`, in a fresh process (so that this one's
    heap and caches neither slow nor flatter it): row K -> column -> one figure per repeat."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import json, sys, harness.bench.runtime as b; "
        "json.dump(b.speculation_table(int(sys.argv[1]), int(sys.argv[2])), sys.stdout)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, str(runs), str(repeats)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RunError(f"the speculation benchmark failed: {proc.stderr.strip()[-2000:]}")
    table = json.loads(proc.stdout)
    return {
        k: {
            _SPECULATION_COLUMNS[name]: [rep[name] for rep in reps] for name in _SPECULATION_COLUMNS
        }
        for k, reps in table.items()
    }


#: Paper tables measured by a benchmark, not by a config's trials.
BENCHMARKS: dict[int, Benchmark] = {
    17: Benchmark(
        17, "harness.bench.runtime speculation_table", 200, speculation_latency, row_name="K"
    ),
}


def judge_timing(paper: PaperCell, ours: float) -> Verdict:
    """The timing rule (`TIMING_RULE`) for one paper cell and our figure, both in µs."""
    if paper.value.strip().startswith("~"):
        return Verdict(NOT_COMPARABLE, f"the paper's value {paper.value} is approximate")
    if math.isnan(ours) or paper.number <= 0:
        return Verdict(NOT_COMPARABLE, "no figure to compare")
    ratio = ours / paper.number
    shown = f"ours / paper = {ratio:.2g}"
    if 1 / TIMING_FACTOR <= ratio <= TIMING_FACTOR:
        return Verdict(REPRODUCED, f"{shown}, within a factor of {TIMING_FACTOR:g}")
    return Verdict(
        DIFFERS, f"{shown}, {'below' if ratio < 1 else 'above'} a factor of {TIMING_FACTOR:g}"
    )


def _machine() -> dict[str, Any]:
    # Stored with a measurement: two machines' timings are compared only with this in view.
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": load,
    }


def run_benchmark(
    bench: Benchmark, out: Path, quick: bool, say: Callable[[str], None] = lambda _: None
) -> tuple[Path, dict[str, Any]]:
    """The benchmark's measurement file under `out` (reused when it has the same runs and
    repeats), measuring now if there is none."""
    repeats = BENCH_REPEATS[1] if quick else BENCH_REPEATS[0]
    path = Path(out) / BENCH_DIR / f"table{bench.table}.json"
    if path.is_file():
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            found = None
        if (
            isinstance(found, dict)
            and found.get("runs") == bench.runs
            and found.get("repeats") == repeats
        ):
            say(f"Table {bench.table}: measurement {path} reused")
            return path, found
    say(f"Table {bench.table}: {bench.name}, {bench.runs} runs per row x {repeats} repeats")
    before = _machine()
    figures = bench.measure(bench.runs, repeats)
    data = {
        "table": bench.table,
        "benchmark": bench.name,
        "runs": bench.runs,
        "repeats": repeats,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": before,
        "load_average_after": _machine()["load_average"],
        "figures": figures,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
    return path, data


def benchmark_section(bench: Benchmark, data: Mapping[str, Any], notes: Sequence[Note]) -> Section:
    """A benchmark table's comparison: every paper cell judged by `judge_timing`."""
    figures: Mapping[str, Mapping[str, list[float]]] = data["figures"]
    lines: list[Line] = []
    for base, occurrence, parts in judged_cells(cells_by_table()[bench.table], {}):
        line = Line(
            row=base.row,
            occurrence=occurrence,
            column=base.column,
            paper=paper_text(base, parts),
            paper_n=str(base.n) if base.n else "—",
        )
        lines.append(line)
        values = figures.get(base.row, {}).get(base.column)
        if not values:
            line.verdict = Verdict(NOT_COMPARABLE, f"{bench.name} gives no figure for this cell")
            continue
        ours = statistics.median(values)
        line.ours = (
            f"{format_number(ours)} [{format_number(min(values))}, {format_number(max(values))}]"
        )
        line.ours_n = f"{data['runs']} x {data['repeats']}"
        line.where = f"{bench.name}: {bench.row_name} = {base.row}"
        line.verdict = judge_timing(base, ours)
        if line.verdict.kind == DIFFERS:
            line.note = find_note(notes, bench.table, base.row, base.column, None)
    return Section(bench.table, lines, configs=[bench.name], interval="range of the repeats")

"""Trial throughput of the harness: figures with their targets.

`suite_figures()` runs real experiment configs through `harness.experiment.runner.run` (what `atomix run
... --jobs 1` runs, without its report) in fresh child processes, so that neither this
process's caches nor its garbage collector state flatter or burden the numbers:

* tau_retail trials per CPU-second (per core): all cells and modes of configs/tau_retail.yaml,
  median over repetitions; target >= 150.
* wall time / CPU time of disk-heavy configs (synthetic_fault_class, leakage, few trials);
  target <= 1.5. On a shared machine wall time also holds the time the process waited for a
  CPU, which says nothing about I/O; the figure "without run-queue wait" subtracts that wait
  (read from /proc/self/schedstat), so it shows whether a run is I/O-bound even when other
  processes share the cores.

`python -m harness.bench.trials` prints them. Nothing here is a test: the test suite times nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bench.figures import Figure, print_figures


def configs_dir() -> Path:
    """The experiment configs: `configs/` in the working directory (a checkout, as the README
    runs it), else next to this source tree (an editable install run from elsewhere)."""
    for candidate in (Path.cwd() / "configs", Path(__file__).resolve().parents[2] / "configs"):
        if (candidate / "tau_retail.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        "no configs/ directory with tau_retail.yaml here or beside the source: run the "
        "benchmark from the project's checkout"
    )
TRIALS_PER_CORE_TARGET = 150.0
WALL_PER_CPU_TARGET = 1.5


@dataclass(frozen=True)
class RunCost:
    """What one run of a config cost its process (CPU = user + system time)."""

    config: str
    trials: int
    cpu_s: float
    wall_s: float
    runqueue_s: float  # time spent runnable but waiting for a CPU (0.0 where unknown)

    @property
    def trials_per_cpu_s(self) -> float:
        return self.trials / self.cpu_s if self.cpu_s > 0 else 0.0

    @property
    def wall_per_cpu(self) -> float:
        return self.wall_s / self.cpu_s if self.cpu_s > 0 else 0.0

    @property
    def wall_per_cpu_without_wait(self) -> float:
        return (self.wall_s - self.runqueue_s) / self.cpu_s if self.cpu_s > 0 else 0.0


def _runqueue_s() -> float:
    """Seconds this process has waited on a run queue (Linux schedstat); 0.0 elsewhere."""
    try:
        fields = Path("/proc/self/schedstat").read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def measure_run(config: Path, trials: int, overrides: dict[str, Any] | None = None) -> RunCost:
    """Run `config` with `trials` per cell and mode, jobs=1, in this process; its cost.

    Loading the config (and the data its validation reads) is outside the measured span; the
    run's first-use costs inside it (goal states, the pristine DB) are not.
    """
    from harness.experiment.config import load_config
    from harness.experiment.runner import run

    loaded = load_config(config, overrides={"trials": trials, **(overrides or {})})
    with tempfile.TemporaryDirectory(prefix="atomix-bench-") as out:
        cpu, wall, waited = time.process_time(), time.perf_counter(), _runqueue_s()
        result = run(loaded, out=Path(out), jobs=1)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        waited = _runqueue_s() - waited
    return RunCost(config.stem, result.ran, cpu, wall, waited)


def _measure_in_child(config: Path, trials: int, overrides: dict[str, Any] | None = None) -> RunCost:
    code = (
        "import json, sys\n"
        "from dataclasses import asdict\n"
        "from pathlib import Path\n"
        "from harness.bench.trials import measure_run\n"
        "cost = measure_run(Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))\n"
        "print(json.dumps(asdict(cost)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(config), str(trials), json.dumps(overrides or {})],
        cwd=configs_dir().parent, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark run of {config} failed:\n{done.stderr[-2000:]}")
    return RunCost(**json.loads(done.stdout.strip().splitlines()[-1]))


def suite_figures(quick: bool = True) -> list[Figure]:
    """Trial throughput figures (see the module docstring). quick: small runs in 10 child
    processes (`python -m harness.bench.trials` prints how long they took); otherwise bigger
    runs, medians of 5."""
    reps = 3 if quick else 5
    retail_trials = 10 if quick else 30  # x 3 cells x 8 modes
    retail = [_measure_in_child(configs_dir() / "tau_retail.yaml", retail_trials) for _ in range(reps)]
    per_core = statistics.median(c.trials_per_cpu_s for c in retail)
    figures = [Figure(
        f"tau_retail trials per CPU-second (jobs 1; {retail[0].trials} trials, median of {reps})",
        round(per_core, 1), "trials/s per core", f">= {TRIALS_PER_CORE_TARGET:g}",
        per_core >= TRIALS_PER_CORE_TARGET,
    )]
    # x 15 cells x 11 modes, and x 5 cells x 11 modes
    disk_heavy = [("synthetic_fault_class", 1 if quick else 10), ("leakage", 2 if quick else 20)]
    for name, trials in disk_heavy:
        costs = [_measure_in_child(configs_dir() / f"{name}.yaml", trials) for _ in range(reps)]
        ratio = statistics.median(c.wall_per_cpu for c in costs)
        unqueued = statistics.median(c.wall_per_cpu_without_wait for c in costs)
        label = f"{name} ({costs[0].trials} trials, median of {reps})"
        figures += [
            Figure(f"{label}: wall / CPU time", round(ratio, 2), "x",
                   f"<= {WALL_PER_CPU_TARGET:g}", ratio <= WALL_PER_CPU_TARGET),
            Figure(f"{label}: wall without run-queue wait / CPU time", round(unqueued, 2), "x",
                   f"<= {WALL_PER_CPU_TARGET:g}", unqueued <= WALL_PER_CPU_TARGET),
            Figure(f"{name}: trials per CPU-second", round(
                statistics.median(c.trials_per_cpu_s for c in costs), 1), "trials/s per core",
                "none", None),
        ]
    durable = _measure_in_child(configs_dir() / "synthetic_fault_class.yaml", disk_heavy[0][1],
                                {"durable": True})
    figures.append(Figure(
        "synthetic_fault_class with durable: true: wall without run-queue wait / CPU time",
        round(durable.wall_per_cpu_without_wait, 2), "x", "none (stores on disk, fsynced)", None,
    ))
    return figures


def main() -> int:
    started = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"harness trial throughput ({os.cpu_count()} CPUs, load average {load:.2f})")
    print_figures(suite_figures(quick="--full" not in sys.argv[1:]))
    print(f"  ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The random-kill crash harness: a seeded program over the public API, SIGKILLed at a random
time, recovered (perhaps killed again while recovering), and judged from the stores alone.

This module holds the parent: it forks the program (tests/crash_program.py), SIGKILLs it at a
fraction of its measured duration, runs recovery in forked children (killing some of those
too), then calls the judge (tests/crash_judge.py). It also holds the unkilled control run, the
calibration, and the command line.

`python tests/crash_child.py --seed N` runs and judges one seed (see `main`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crash_judge import Verdict, judge, read_journal, read_or_empty, summary_of
from crash_program import THREADS, TXS_PER_THREAD, run_program, run_recovery, without

_FORK = multiprocessing.get_context("fork")


# ------------------------------------------------------------------------------- the parent
@dataclass
class Timing:
    """Running estimates of how long an unkilled program and a recovery take (seconds)."""

    program: float = 1.0
    recovery: float = 0.3


@dataclass
class RunResult:
    seed: int
    killed: bool  # the program was SIGKILLed (not finished before the kill time)
    recovery_kills: int
    recovery_exit: int
    recovered: int  # transactions recovery finished or aborted
    verdict: Verdict
    error: str = ""
    progress: float = 1.0  # the share of the program's transactions it saw settle before the kill


def _child(target: Callable[[Path, int], None], base: str, seed: int) -> None:
    """The forked child's entry: run `target`, then exit 0 (3, with `child-error`, if it raised)."""
    try:
        target(Path(base), seed)
    except BaseException as exc:  # noqa: BLE001
        Path(base, "child-error").write_text(repr(exc))
        os._exit(3)
    os._exit(0)


def spawn_and_kill(target: Callable[..., None], args: tuple[Any, ...], delay: float | None) -> tuple[int, float]:
    """Fork `target(*args)`; SIGKILL it after `delay` seconds (None: never). Returns its exit
    code (-9 when killed) and how long it ran."""
    proc = _FORK.Process(target=target, args=args)
    started = time.perf_counter()
    proc.start()
    proc.join(delay)
    if proc.exitcode is None and delay is not None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(120)
    if proc.exitcode is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        raise AssertionError(f"child {target.__name__}{args} hung")
    return proc.exitcode, time.perf_counter() - started


def run_one(base: Path, seed: int, timing: Timing, *, kill_at: float | None = None) -> RunResult:
    """One run: the program killed at a random time (a fraction of its expected duration,
    drawn from the seed, or `kill_at`), recovery (killed too in some runs), a final recovery,
    then the judge."""
    rng = random.Random(f"crash-kill:{seed}")
    fraction = rng.random() if kill_at is None else kill_at
    base.mkdir(parents=True, exist_ok=True)
    code, took = spawn_and_kill(_child, (run_program, str(base), seed), fraction * timing.program)
    killed = code == -signal.SIGKILL
    status, _, _ = read_journal(base)
    progress = sum(1 for s in status.values() if s != "B") / (len(THREADS) * TXS_PER_THREAD)
    if not killed and code != 0:
        return RunResult(seed, False, 0, -1, Verdict(), f"program exit {code}: {read_or_empty(base / 'child-error')}")
    recovery_kills = 0
    while rng.random() < 0.3 and recovery_kills < 2:  # kill the recovery itself, at random
        rcode, _ = spawn_and_kill(_child, (_recovery_entry, str(base), seed), rng.random() * timing.recovery)
        if rcode == -signal.SIGKILL:
            recovery_kills += 1
        else:
            break
    started = time.perf_counter()
    rcode, _ = spawn_and_kill(_child, (_recovery_entry, str(base), seed), None)
    timing.recovery = 0.8 * timing.recovery + 0.2 * (time.perf_counter() - started)
    recovered = sum(int(x) for x in read_or_empty(base / "recovered").split())
    error = ""
    if rcode != 0:
        error = f"recovery exit {rcode}: {read_or_empty(base / 'child-error')}{read_or_empty(base / 'recovery-report')}"
    verdict = judge(base, seed)
    return RunResult(seed, killed, recovery_kills, rcode, recovered, verdict, error, progress)


def _recovery_entry(base: Path, seed: int) -> None:
    run_recovery(base)


def control_run(base: Path, seed: int, timing: Timing | None = None) -> tuple[Verdict, Timing]:
    """Run `seed`'s program to its end, unkilled, and judge it: a control (nothing to recover,
    so any finding is the runtime's, live). Its duration updates `timing` (the machine's load
    changes how long a program takes, and kill times are fractions of it)."""
    base.mkdir(parents=True, exist_ok=True)
    code, took = spawn_and_kill(_child, (run_program, str(base), seed), None)
    if code != 0:
        raise AssertionError(f"control run of seed {seed}: exit {code}: {read_or_empty(base / 'child-error')}")
    if timing is None:
        timing = Timing(program=took)
    else:
        timing.program = 0.5 * timing.program + 0.5 * took
    return judge(base, seed), timing


def calibrate(base: Path) -> Timing:
    """Run the program once unkilled (seed -1) to learn how long a run takes."""
    return control_run(base, -1)[1]


# ------------------------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> int:
    """`python tests/crash_child.py --seed N [--repeat K] [--kill-at F] [--dir D]`: run one
    seed (K times: the kill time is a fraction of a measured duration, so a window that small
    may need a few tries) and print each verdict. Exit 1 if any run failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=1, help="run the seed this many times")
    parser.add_argument("--kill-at", type=float, default=None, help="fraction of the program's duration")
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    try:
        without()  # a bad ATOMIX_CRASH_WITHOUT fails here, before any run
    except ValueError as exc:
        parser.error(str(exc))
    base = args.dir or Path(tempfile.mkdtemp(prefix="atomix-crash-"))
    timing = calibrate(base / "calibration")
    failed = 0
    for n in range(args.repeat):
        result = run_one(base / f"run-{args.seed}-{n}", args.seed, timing, kill_at=args.kill_at)
        bad = not result.verdict.clean or bool(result.error)
        failed += bad
        print(f"seed {result.seed} try {n}: killed={result.killed} recovery kills="
              f"{result.recovery_kills} recovered={result.recovered} {summary_of(result.verdict)}")
        for problem in result.verdict.problems:
            print("  " + problem)
        if result.error:
            print("  " + result.error)
    print(f"{failed} of {args.repeat} runs failed; runs kept in {base}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

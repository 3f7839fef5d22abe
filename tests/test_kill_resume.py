"""Killing `atomix run` at any moment: SIGKILL of a 2-worker run at random moments, then resume,
loses and duplicates nothing and ends with the records of an uninterrupted run; SIGINT/SIGTERM
at start-up or mid-run exit 130/143 with one line (no traceback) and leave a run that resumes to
completion."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import (
    HANG_S,
    ROOT,
    catches,
    cli_argv,
    cli_env,
    count_records,
    frozen,
    manifest,
    proc_done,
    read_records,
    run_dirs,
    wait_group_gone,
    wait_until,
    with_default_signals,
    without_timings,
    write_yaml,
)

from harness.experiment.config import load_config
from harness.experiment.rundir import Holder
from harness.experiment.runner import plan, run

CONFIG: dict[str, Any] = {
    "name": "killme",
    "workload": "synthetic",
    "seed": 17,
    # Enough trials that a run lasts seconds (throwaway stores in RAM make a synthetic trial
    # take a few ms), so that each of the kills below cuts a live run.
    "trials": 600,
    "modes": ["tx-full", "no-tx"],
    "faults": {"classes": "mixed"},
    "labels": {"faults.rate": "fp"},
    "grid": {"faults.rate": [0.1, 0.3]},
    "report": {"tables": [{"name": "clean", "metric": "clean", "columns": ["fp"]}], "plots": []},
}
TOTAL = 600 * 2 * 2
KILLS = 5

Start = Callable[..., subprocess.Popen[str]]


def write_config(directory: Path, **extra: Any) -> Path:
    return write_yaml(directory / "killme.yaml", {**CONFIG, **extra})


def run_dir_of(out: Path) -> Path | None:
    found = run_dirs(out)
    return found[0] if found else None


def count_lines(run_dir: Path) -> int:
    return count_records(run_dir / "trials.jsonl")


def wait_for_owner(out: Path, pid: int) -> Path | None:
    """The run directory once `pid` holds its lock (None if the process ended first)."""

    def owned() -> tuple[Path | None] | None:
        if proc_done(pid):
            return (None,)
        run_dir = run_dir_of(out)
        if run_dir is not None:
            try:
                holder = Holder.parse((run_dir / "run.lock").read_text())
            except OSError:
                holder = None
            if holder is not None and holder.pid == pid:
                return (run_dir,)
        return None

    return wait_until(owned, f"pid {pid} holds the lock of a run under {out}")[0]


def test_sigkill_at_random_moments_of_a_two_worker_run_loses_and_duplicates_nothing(
    tmp_path: Path, results_dir: Path, atomix_cli: Start
) -> None:
    config = write_config(tmp_path)
    out = results_dir
    rng = random.Random(20260417)
    kills = 0
    lines_after_kill: list[int] = []
    run_dir: Path | None = None
    while kills < KILLS:
        args = ["run", config, "--out", out, "--jobs", 2]
        # In its own session, so its workers can be found (and reaped).
        proc = atomix_cli(*args, *(["--resume", run_dir] if run_dir else []), new_session=True)
        owned = wait_for_owner(out, proc.pid)
        if owned is None:  # finished (or failed) before it was caught running
            _, err = proc.communicate(timeout=HANG_S)
            pytest.fail(f"the run ended before kill {kills + 1}: exit {proc.returncode}: {err}")
        run_dir = owned
        # A random moment once this session has written a record, so each kill cuts a
        # running pool (possibly mid-write), not a start-up.
        before = count_lines(run_dir)
        wait_until(
            lambda d=run_dir, n=before, pid=proc.pid: count_lines(d) > n or proc_done(pid),
            f"the run (pid {proc.pid}) wrote a record",
        )
        time.sleep(rng.uniform(0.0, 0.6))  # the random moment (not a wait for anything)
        if proc.poll() is not None:  # (poll reaps it: a kill now would find no process)
            _, err = proc.communicate(timeout=HANG_S)
            pytest.fail(f"the run finished before kill {kills + 1}: exit {proc.returncode}: {err}")
        os.kill(proc.pid, signal.SIGKILL)  # the parent only, like the OOM killer
        proc.communicate(timeout=HANG_S)
        kills += 1
        # Its workers die with it (PR_SET_PDEATHSIG).
        assert wait_group_gone(proc.pid) == [], "a worker outlived its killed parent"
        lines_after_kill.append(count_lines(run_dir))
    assert run_dir is not None
    listed = subprocess.run(
        with_default_signals(cli_argv("runs", "--out", out)),
        cwd=ROOT, capture_output=True, text=True, env=cli_env(), timeout=HANG_S,
    )  # fmt: skip
    assert listed.returncode == 0 and "interrupted" in listed.stdout, listed.stdout + listed.stderr
    final = atomix_cli(
        "run", config, "--out", out, "--jobs", 2, "--resume", run_dir, new_session=True
    )
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    assert "Traceback" not in err

    keys = [r["key"] for r in read_records(run_dir / "trials.jsonl")]
    planned = {s.key for s in plan(load_config(config))}
    lost = len(planned - set(keys))
    duplicated = len(keys) - len(set(keys))
    reference = run(load_config(config), out=tmp_path / "reference", jobs=2)
    equal = without_timings(read_records(run_dir / "trials.jsonl")) == without_timings(
        read_records(reference.records_path)
    )
    print(
        f"\nSIGKILL-and-resume: {kills} kills (records on disk after each: {lines_after_kill}), "
        f"{len(planned)} trials planned, {len(keys)} records, lost {lost}, duplicated "
        f"{duplicated}, equal to an uninterrupted run (ignoring timings): {equal}"
    )
    assert lost == 0 and duplicated == 0 and len(keys) == TOTAL
    assert 0 < lines_after_kill[0] and lines_after_kill[-1] < TOTAL  # the kills cut a live run
    assert equal
    assert manifest(run_dir)["status"] == "complete"


# -- SIGINT / SIGTERM ---------------------------------------------------------------------------
# (signal, seconds after the anchor, jobs). The anchors: "start", once the process has
# installed its start-up handlers (the first thing `cli.py` does: before that, a signal gets
# the default action of any Python program, a KeyboardInterrupt traceback or death by
# SIGTERM, and how long a loaded machine takes to get there is anyone's guess), so the signal
# lands in the imports or the first trials; "lock", once it holds the run's lock (mid-run).
MOMENTS = [
    (signal.SIGINT, "start", 0.15, 1),
    (signal.SIGTERM, "start", 0.2, 2),
    (signal.SIGINT, "start", 0.3, 2),
    (signal.SIGTERM, "lock", 0.0, 1),
    (signal.SIGINT, "lock", 0.4, 2),
    (signal.SIGTERM, "lock", 0.7, 2),
]


@pytest.mark.parametrize(
    ("signum", "anchor", "delay", "jobs"),
    MOMENTS,
    ids=[f"{signal.Signals(s).name}-{a}+{d}s-j{j}" for s, a, d, j in MOMENTS],
)
def test_a_signal_at_any_moment_leaves_a_resumable_run_and_no_traceback(
    tmp_path: Path, results_dir: Path, atomix_cli: Start,
    signum: int, anchor: str, delay: float, jobs: int,
) -> None:  # fmt: skip
    # Big enough that the run is still going when the signal lands (checked below).
    trials = 60 if anchor == "start" else 150
    config = write_config(tmp_path, trials=trials)
    out = results_dir
    proc = atomix_cli("run", config, "--out", out, "--jobs", jobs, new_session=True)
    if anchor == "lock":
        assert wait_for_owner(out, proc.pid) is not None, proc.communicate(timeout=HANG_S)
    else:
        wait_until(
            lambda: proc_done(proc.pid) or catches(proc.pid, signal.SIGTERM),
            f"pid {proc.pid} installed its start-up signal handlers",
        )
    time.sleep(delay)  # the moment itself (not a wait for anything)
    with frozen(proc.pid):  # the run cannot move on between this check and the signal
        assert not proc_done(proc.pid), f"the run ended before the signal: {proc.communicate()}"
        run_dir = run_dir_of(out)
        assert run_dir is None or count_lines(run_dir) < trials * 2 * 2, "it finished first"
        proc.send_signal(signum)  # delivered at this point once it continues
    _, err = proc.communicate(timeout=HANG_S)
    assert "Traceback" not in err, err
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    message = [line for line in err.splitlines() if "interrupted" in line]
    assert len(message) == 1, err
    assert wait_group_gone(proc.pid) == [], "workers were left running"
    run_dir = run_dir_of(out)
    if run_dir is None:
        assert "nothing was written" in message[0]
        return
    assert "resume with: " in message[0]
    assert manifest(run_dir)["status"] == "interrupted"
    command = message[0].split("resume with: ", 1)[1].split()
    assert command[:2] == ["atomix", "run"]
    resumed = atomix_cli(*command[1:], "--jobs", 2, new_session=True)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    keys = [r["key"] for r in read_records(run_dir / "trials.jsonl")]
    assert len(keys) == len(set(keys)) == trials * 2 * 2

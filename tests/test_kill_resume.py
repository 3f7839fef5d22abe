"""Killing `atomix run` at any moment (issue 17, part 5 and "Done when"): SIGKILL of a
2-worker run at random moments, then resume, loses and duplicates nothing and ends with the
records of an uninterrupted run; SIGINT/SIGTERM at start-up or mid-run exit 130/143 with one
line (no traceback) and leave a run that resumes to completion."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.experiment.config import load_config
from harness.experiment.rundir import Holder
from harness.experiment.runner import plan, run

ROOT = Path(__file__).resolve().parents[1]

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


def write_config(directory: Path, **extra: Any) -> Path:
    path = directory / "killme.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, **extra}, sort_keys=False), encoding="utf-8")
    return path


def start(*args: Any) -> subprocess.Popen[str]:
    """`python -m cli ARGS` in its own session, so its workers can be found (and reaped)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_dir_of(out: Path) -> Path | None:
    found = [p.parent for p in out.glob("*/*/manifest.json")]
    return found[0] if found else None


def wait_for_owner(out: Path, pid: int, timeout: float = 60) -> Path | None:
    """The run directory once `pid` holds its lock (None if the process ended first)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc_done(pid):
            return None
        run_dir = run_dir_of(out)
        if run_dir is not None:
            try:
                holder = Holder.parse((run_dir / "run.lock").read_text())
            except OSError:
                holder = None
            if holder is not None and holder.pid == pid:
                return run_dir
        time.sleep(0.01)
    return None


def proc_done(pid: int) -> bool:
    """Whether `pid` has exited (a zombie counts: it has finished, only not been reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def live_members(pgid: int) -> list[int]:
    """Processes of a process group that are still running (zombies do not count)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def count_lines(run_dir: Path) -> int:
    try:
        return (run_dir / "trials.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def stripped(path: Path) -> list[dict[str, Any]]:
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return sorted(({k: v for k, v in r.items() if k != "timings"} for r in recs), key=lambda r: r["key"])


def test_sigkill_at_random_moments_of_a_two_worker_run_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path)
    out = tmp_path / "results"
    rng = random.Random(20260417)
    kills = 0
    lines_after_kill: list[int] = []
    run_dir: Path | None = None
    while kills < KILLS:
        args = ["run", config, "--out", out, "--jobs", 2]
        proc = start(*args, *(["--resume", run_dir] if run_dir else []))
        owned = wait_for_owner(out, proc.pid)
        if owned is None:  # finished (or failed) before it was caught running
            _, err = proc.communicate(timeout=60)
            pytest.fail(f"the run ended before kill {kills + 1}: exit {proc.returncode}: {err}")
        run_dir = owned
        # A random moment once this session has written a record, so each kill cuts a
        # running pool (possibly mid-write), not a start-up.
        before = count_lines(run_dir)
        deadline = time.time() + 60
        while count_lines(run_dir) <= before and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is not None:  # (poll reaps it: a kill now would find no process)
            _, err = proc.communicate(timeout=60)
            pytest.fail(f"the run finished before kill {kills + 1}: exit {proc.returncode}: {err}")
        os.kill(proc.pid, signal.SIGKILL)  # the parent only, like the OOM killer
        proc.communicate(timeout=30)
        kills += 1
        deadline = time.time() + 10  # its workers die with it (PR_SET_PDEATHSIG)
        while live_members(proc.pid) and time.time() < deadline:
            time.sleep(0.05)
        assert live_members(proc.pid) == [], "a worker outlived its killed parent"
        lines_after_kill.append(count_lines(run_dir))
    assert run_dir is not None
    listed = subprocess.run(
        [sys.executable, "-m", "cli", "runs", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert listed.returncode == 0 and "interrupted" in listed.stdout, listed.stdout + listed.stderr
    final = start("run", config, "--out", out, "--jobs", 2, "--resume", run_dir)
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    assert "Traceback" not in err

    keys = [json.loads(line)["key"] for line in (run_dir / "trials.jsonl").read_text().splitlines()]
    planned = {s.key for s in plan(load_config(config))}
    lost = len(planned - set(keys))
    duplicated = len(keys) - len(set(keys))
    reference = run(load_config(config), out=tmp_path / "reference", jobs=2)
    equal = stripped(run_dir / "trials.jsonl") == stripped(reference.records_path)
    print(
        f"\nSIGKILL-and-resume: {kills} kills (records on disk after each: {lines_after_kill}), "
        f"{len(planned)} trials planned, {len(keys)} records, lost {lost}, duplicated "
        f"{duplicated}, equal to an uninterrupted run (ignoring timings): {equal}"
    )
    assert lost == 0 and duplicated == 0 and len(keys) == TOTAL
    assert 0 < lines_after_kill[0] and lines_after_kill[-1] < TOTAL  # the kills cut a live run
    assert equal
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "complete"


# -- SIGINT / SIGTERM ---------------------------------------------------------------------------
# (signal, seconds after the process started or after it took the run's lock, jobs)
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
    tmp_path: Path, signum: int, anchor: str, delay: float, jobs: int
) -> None:
    # Big enough that a loaded machine cannot finish it before the signal lands.
    trials = 20 if anchor == "start" else 150
    config = write_config(tmp_path, trials=trials)
    out = tmp_path / "results"
    proc = start("run", config, "--out", out, "--jobs", jobs)
    if anchor == "lock":
        assert wait_for_owner(out, proc.pid) is not None
    time.sleep(delay)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    message = [line for line in err.splitlines() if "interrupted" in line]
    assert len(message) == 1, err
    deadline = time.time() + 10
    while live_members(proc.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert live_members(proc.pid) == [], "workers were left running"
    run_dir = run_dir_of(out)
    if run_dir is None:
        assert "nothing was written" in message[0]
        return
    assert "resume with: " in message[0]
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "interrupted"
    command = message[0].split("resume with: ", 1)[1].split()
    assert command[:2] == ["atomix", "run"]
    resumed = start(*command[1:], "--jobs", 2)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    keys = [json.loads(line)["key"] for line in (run_dir / "trials.jsonl").read_text().splitlines()]
    assert len(keys) == len(set(keys)) == trials * 2 * 2

"""A run directory under concurrent use and damage: the lock, damaged and foreign records, a
damaged manifest, a read-only or full disk, and `atomix runs`."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import (
    HANG_S,
    count_records,
    frozen,
    invoke,
    manifest,
    proc_done,
    read_records,
    wait_until,
    without_timings,
    write_yaml,
)

import harness.experiment.runner
from harness.experiment.rundir import LOCK, Holder, RunLock, list_runs, scan_records

CONFIG: dict[str, Any] = {
    "name": "tiny",
    "workload": "synthetic",
    "seed": 11,
    "trials": 3,
    "modes": ["tx-full", "no-tx"],
    "faults": {"classes": ["F1", "F2", "F4"]},
    "labels": {"faults.rate": "fp"},
    "grid": {"faults.rate": [0.0, 0.3]},
}
TOTAL = 2 * 3 * 2


def write_config(directory: Path, data: dict[str, Any] | None = None) -> Path:
    return write_yaml(directory / f"{(data or CONFIG)['name']}.yaml", data or CONFIG)


def lines(run_dir: Path) -> list[str]:
    return (run_dir / "trials.jsonl").read_text(encoding="utf-8").splitlines()


def keys(run_dir: Path) -> list[str]:
    return [json.loads(line)["key"] for line in lines(run_dir)]


def stripped(run_dir: Path) -> list[dict[str, Any]]:
    return without_timings(read_records(run_dir / "trials.jsonl"))


def cut(line: str) -> str:
    """A record cut off in the middle, after its key (which is still readable)."""
    return line[: line.index('"key"') + 60]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config, run dir) of one finished tiny run."""
    base = tmp_path_factory.mktemp("finished")
    config = write_config(base)
    result = invoke("run", config, "--out", base / "results", "--jobs", 1)
    assert result.exit_code == 0, result.output
    (run_dir,) = [p.parent for p in (base / "results").glob("*/*/manifest.json")]
    return config, run_dir


@pytest.fixture()
def copy(finished: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    config, original = finished
    run_dir = tmp_path / "tiny" / original.name
    shutil.copytree(original, run_dir)
    return config, run_dir


# -- the lock ---------------------------------------------------------------------------------


def test_two_resumes_at_once_one_runs_the_other_exits_2_naming_its_pid(
    tmp_path: Path, results_dir: Path, atomix_cli: Callable[..., subprocess.Popen[str]]
) -> None:
    data = {**CONFIG, "name": "conc", "trials": 40, "grid": {"faults.rate": [0.1, 0.3]}}
    config = write_config(tmp_path, data)
    out = results_dir
    first = atomix_cli("run", config, "--out", out, "--jobs", 1)
    wait_until(
        lambda: proc_done(first.pid)
        or any(p.stat().st_size > 2000 for p in out.glob("conc/*/trials.jsonl")),
        "the first run wrote a few records",
    )
    with frozen(first.pid):  # so that the SIGTERM lands mid-run, as checked here
        assert not proc_done(first.pid), f"the run ended first: {first.communicate()}"
        assert 0 < sum(count_records(p) for p in out.glob("conc/*/trials.jsonl")) < 160
        first.terminate()  # SIGTERM: a resumable run
    _, err = first.communicate(timeout=HANG_S)
    assert first.returncode == 143 and "Traceback" not in err, err
    (run_dir,) = [p.parent for p in out.glob("conc/*/manifest.json")]
    assert manifest(run_dir)["status"] == "interrupted"
    before = len(keys(run_dir))
    assert 0 < before < 160

    both = [atomix_cli("run", config, "--resume", run_dir, "--jobs", 1) for _ in range(2)]
    pids = {p.pid for p in both}

    def holder() -> int | None:
        """The pid of whichever of the two holds the lock (named in run.lock) now."""
        try:
            named = Holder.parse((run_dir / LOCK).read_text())
        except OSError:
            return None
        return named.pid if named is not None and named.pid in pids else None

    # The first of the two to take the lock is frozen while it holds it (a resume of the
    # last ~150 trials holds it for a second or two; on a loaded machine the other can take
    # longer than that just to start, and then finds a finished run and exits 0), so the
    # other meets a held lock however the two start-ups interleave.
    first_holder = wait_until(
        lambda: holder() or all(proc_done(p.pid) for p in both), "one of the two took the lock"
    )
    assert first_holder in pids, [(p.pid, p.communicate()) for p in both]
    (holding,) = [p for p in both if p.pid == first_holder]
    (other,) = [p for p in both if p is not holding]
    with frozen(holding.pid):
        # Still its name: the lock file is emptied before the lock is let go.
        assert holder() == holding.pid, "it let the lock go before it could be held"
        other_out, other_err = other.communicate(timeout=HANG_S)
    holding_out, holding_err = holding.communicate(timeout=300)
    results = [
        (holding.pid, holding_out, holding_err, holding.returncode),
        (other.pid, other_out, other_err, other.returncode),
    ]
    codes = sorted(r[3] for r in results)
    assert codes == [0, 2], [(r[0], r[3], r[2][-500:]) for r in results]
    (winner,) = [r for r in results if r[3] == 0]
    (loser,) = [r for r in results if r[3] == 2]
    assert f"in use by pid {winner[0]}" in loser[2] and "Traceback" not in loser[2]
    assert "Traceback" not in winner[2]
    found = keys(run_dir)
    assert len(found) == len(set(found)) == 160
    report = invoke("report", run_dir)
    assert report.exit_code == 0, report.output
    print(f"concurrent resume: winner pid {winner[0]}, loser exit 2; {before} + "
          f"{160 - before} trials, 0 duplicated")


def test_a_live_lock_refuses_resume_and_a_dead_holders_lock_is_taken_over(
    copy: tuple[Path, Path],
) -> None:
    config, run_dir = copy
    lines_before = lines(run_dir)
    (run_dir / "trials.jsonl").write_text("\n".join(lines_before[:4]) + "\n", encoding="utf-8")
    with RunLock(run_dir):  # this test process owns the run
        refused = invoke("run", config, "--resume", run_dir, "--jobs", 1)
        assert refused.exit_code == 2
        assert f"in use by pid {os.getpid()}" in refused.stderr
        assert len(lines(run_dir)) == 4  # nothing ran
        (info,) = list_runs(run_dir.parent.parent)
        assert info.status == "complete"  # the copied manifest; a live owner is never overruled
    # A killed owner: its pid is dead, the kernel dropped its flock, the manifest says running.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / LOCK).write_text(Holder(dead.pid, os.uname().nodename, "then").dumps())
    m = manifest(run_dir)
    m["status"] = "running"
    (run_dir / "manifest.json").write_text(json.dumps(m))
    listed = invoke("runs", "--out", run_dir.parent.parent)
    assert listed.exit_code == 0 and "interrupted" in listed.stdout and "4/12" in listed.stdout
    assert manifest(run_dir)["status"] == "interrupted"  # persisted by `runs`
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert resumed.exit_code == 0, resumed.output
    assert len(keys(run_dir)) == TOTAL and manifest(run_dir)["status"] == "complete"
    assert (run_dir / LOCK).read_text() == ""  # released


# -- damaged records --------------------------------------------------------------------------


def test_a_corrupt_line_mid_file_is_reported_then_rerun(
    copy: tuple[Path, Path], finished: tuple[Path, Path]
) -> None:
    config, run_dir = copy
    text = lines(run_dir)
    torn_key = json.loads(text[2])["key"]
    text[2] = cut(text[2])
    text[5] = "\x00\x00garbage"
    (run_dir / "trials.jsonl").write_text("\n".join(text) + "\n", encoding="utf-8")
    report = invoke("report", run_dir)
    assert report.exit_code == 0, report.output
    assert "2 damaged lines (3: not JSON" in report.stderr and "6: not JSON" in report.stderr
    assert "Traceback" not in report.output
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert resumed.exit_code == 0, resumed.output
    assert "2 damaged lines" in resumed.stderr and "trials.damaged.jsonl" in resumed.stderr
    aside = [json.loads(x) for x in (run_dir / "trials.damaged.jsonl").read_text().splitlines()]
    assert [(a["line"], a["key"]) for a in aside] == [(3, torn_key), (6, None)]
    assert stripped(run_dir) == stripped(finished[1])  # complete, nothing duplicated


def test_skip_leaves_the_trials_of_damaged_lines_out(copy: tuple[Path, Path]) -> None:
    config, run_dir = copy
    text = lines(run_dir)
    torn_key = json.loads(text[2])["key"]
    text[2] = cut(text[2])
    (run_dir / "trials.jsonl").write_text("\n".join(text[:8]) + "\n", encoding="utf-8")
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1, "--damaged", "skip")
    assert resumed.exit_code == 0, resumed.output
    assert "1 damaged line (3: not JSON" in resumed.stderr and "skipped: 1 trial" in resumed.stderr
    found = {json.loads(x)["key"] for i, x in enumerate(lines(run_dir)) if i != 2}
    assert len(found) == TOTAL - 1 and torn_key not in found
    assert manifest(run_dir)["trials_skipped"] == [torn_key]
    assert lines(run_dir)[2] == text[2]  # left where it was


def test_json_lines_that_are_not_records_are_reported(copy: tuple[Path, Path]) -> None:
    config, run_dir = copy
    text = lines(run_dir)
    text[1:1] = ["[1, 2]", '{"hello": "world"}', '{"key": 7, "mode": "x"}']
    text.append(text[4])  # a repeated trial (what two unlocked resumes used to write)
    (run_dir / "trials.jsonl").write_text("\n".join(text) + "\n", encoding="utf-8")
    report = invoke("report", run_dir)
    assert report.exit_code == 0, report.output
    assert "4 damaged lines (2: a JSON list, not a trial record, 3: not a trial record (no 'key')" in report.stderr
    assert "repeats the trial of line 5" in report.stderr
    scan = scan_records(run_dir / "trials.jsonl")
    assert [d.lineno for d in scan.damaged] == [2, 3, 4, 16] and len(scan.records) == TOTAL
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert resumed.exit_code == 0, resumed.output
    assert len(keys(run_dir)) == len(set(keys(run_dir))) == TOTAL


def test_a_damaged_manifest_is_one_line_and_exit_2(copy: tuple[Path, Path]) -> None:
    config, run_dir = copy
    (run_dir / "manifest.json").write_text('{"config": {"name": "tiny", ', encoding="utf-8")
    for result in (
        invoke("report", run_dir),
        invoke("run", config, "--resume", run_dir, "--jobs", 1),
    ):
        assert result.exit_code == 2, result.output
        message = result.stderr.strip()
        assert "manifest.json: damaged manifest: not valid JSON" in message
        assert "start a new run" in message and "Traceback" not in result.output
    (run_dir / "manifest.json").write_text("[]", encoding="utf-8")
    assert "damaged manifest" in invoke("report", run_dir).stderr


def test_records_of_another_config_are_refused_not_mixed(
    copy: tuple[Path, Path], tmp_path: Path
) -> None:
    config, run_dir = copy
    # Same name, another seed: the same keys, so only the records' config hash tells them apart.
    other = write_config(tmp_path / "other", {**CONFIG, "seed": 12})
    made = invoke("run", other, "--out", tmp_path / "other-results", "--jobs", 1)
    assert made.exit_code == 0, made.output
    (other_dir,) = [p.parent for p in (tmp_path / "other-results").glob("*/*/manifest.json")]
    mine = lines(run_dir)
    (run_dir / "trials.jsonl").write_text(
        "\n".join(mine[:6] + lines(other_dir)[:3]) + "\n", encoding="utf-8"
    )
    theirs, ours = manifest(other_dir)["config_hash"], manifest(run_dir)["config_hash"]
    report = invoke("report", run_dir)
    assert report.exit_code == 2, report.output
    assert "line 7 and 2 more line(s)" in report.stderr
    assert theirs in report.stderr and ours in report.stderr and "refusing to mix" in report.stderr
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert resumed.exit_code == 2 and "refusing to mix" in resumed.stderr
    # Another name altogether.
    renamed = [line.replace('"config":"tiny"', '"config":"elsewhere"') for line in mine[:2]]
    (run_dir / "trials.jsonl").write_text("\n".join(mine[2:6] + renamed) + "\n", encoding="utf-8")
    report = invoke("report", run_dir)
    assert report.exit_code == 2 and "'elsewhere'" in report.stderr and "'tiny'" in report.stderr


# -- the disk ---------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode")
def test_a_read_only_run_dir_is_exit_1_and_stays_resumable(copy: tuple[Path, Path]) -> None:
    config, run_dir = copy
    text = lines(run_dir)
    (run_dir / "trials.jsonl").write_text("\n".join(text[:5]) + "\n", encoding="utf-8")
    os.chmod(run_dir, 0o555)
    try:
        result = invoke("run", config, "--resume", run_dir, "--jobs", 1)
        assert result.exit_code == 1, result.output
        assert "Permission denied (EACCES)" in result.stderr and "resume with:" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        report = invoke("report", run_dir)
        assert report.exit_code == 1 and "cannot write the report" in report.stderr
    finally:
        os.chmod(run_dir, 0o755)
    assert len(lines(run_dir)) == 5
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert resumed.exit_code == 0, resumed.output
    assert len(keys(run_dir)) == len(set(keys(run_dir))) == TOTAL


def test_a_read_only_file_system_is_exit_1_and_stays_resumable(
    copy: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What EROFS looks like to the runner, for when the tests run as root (chmod is no bar).
    import harness.experiment.rundir

    config, run_dir = copy
    (run_dir / "trials.jsonl").write_text("\n".join(lines(run_dir)[:5]) + "\n", encoding="utf-8")

    def read_only(src: Any, dst: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))

    monkeypatch.setattr(harness.experiment.rundir, "_replace", read_only)
    result = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert result.exit_code == 1, result.output
    assert "Read-only file system (EROFS)" in result.stderr and "resume with:" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not list(run_dir.glob("*.tmp"))
    monkeypatch.setattr(harness.experiment.rundir, "_replace", os.replace)
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert resumed.exit_code == 0, resumed.output
    assert len(keys(run_dir)) == len(set(keys(run_dir))) == TOTAL


def test_a_full_disk_is_exit_1_and_stays_resumable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finished: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path)
    real = os.write
    calls = {"n": 0}

    def full(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 4:
            real(fd, bytes(data[:30]))  # the disk takes part of the record, then is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(harness.experiment.runner, "_write", full)
    result = invoke("run", config, "--out", tmp_path / "results", "--jobs", 1)
    assert result.exit_code == 1, result.output
    assert "No space left on device (ENOSPC)" in result.stderr and "resume with:" in result.stderr
    (run_dir,) = [p.parent for p in (tmp_path / "results").glob("*/*/manifest.json")]
    assert (run_dir / "trials.jsonl").read_bytes().endswith(b"\n")  # the torn write was cut off
    assert len(lines(run_dir)) == 3 and manifest(run_dir)["status"] == "interrupted"
    monkeypatch.setattr(harness.experiment.runner, "_write", real)
    resumed = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert resumed.exit_code == 0, resumed.output
    assert stripped(run_dir) == stripped(finished[1])

"""Sweeps on Dask: `--executor dask` runs trials on a dask.distributed cluster (its own
LocalCluster, or `--scheduler ADDRESS`) and streams the records back to the run's one writer.
Records are byte-identical to a local run apart from `timings`; a dask run interrupted by SIGINT
or SIGKILL resumes without losing or duplicating a trial; bad options, an unreachable scheduler
and a missing dask install are one clear line and write nothing.

The external cluster is started the way the README tells users to: `dask scheduler` and
`dask worker tcp://HOST:PORT` subprocesses (the venv's console scripts) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    BIN,
    HANG_S,
    ROOT,
    count_records,
    frozen,
    invoke,
    proc_done,
    spawn,
    wait_group_gone,
    wait_until,
    write_yaml,
)

from harness.errors import RunError
from harness.experiment.config import load_config
from harness.experiment.executor import ExecutorOptions, chunk_size
from harness.experiment.executors import open_executor
from harness.experiment.runner import plan, run
from harness.experiment.trial import run_trial

distributed = pytest.importorskip("distributed")

RETAIL = ROOT / "configs" / "tau_retail.yaml"
RETAIL_OVERRIDES: dict[str, Any] = {"trials": 2, "modes": ["tx-full", "saga"]}

CONFIG: dict[str, Any] = {
    "name": "dasky",
    "workload": "synthetic",
    "seed": 16,
    "trials": 12,
    "modes": ["tx-full", "no-tx"],
    "faults": {"classes": "mixed"},
    "labels": {"faults.rate": "fp"},
    "grid": {"faults.rate": [0.1, 0.3]},
    "report": {"tables": [{"name": "clean", "metric": "clean", "columns": ["fp"]}], "plots": []},
}
TOTAL = 12 * 2 * 2

Start = Callable[..., subprocess.Popen[str]]


def write_config(directory: Path) -> Path:
    return write_yaml(directory / "dasky.yaml", CONFIG)


def canonical(record: dict[str, Any]) -> str:
    """A record as the runner writes it, without its wall timings."""
    return json.dumps(
        {k: v for k, v in record.items() if k != "timings"}, sort_keys=True, separators=(",", ":")
    )


def file_lines(path: Path) -> list[str]:
    """The lines of a trials file without timings, sorted by key (a run with more than one
    worker writes records in the order they finish); repeated keys fail the test."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)), "a trial was written twice"
    return [canonical(r) for r in sorted(records, key=lambda r: r["key"])]


def count_lines(out: Path) -> int:
    found = list(out.glob("*/*/trials.jsonl"))
    return count_records(found[0]) if found else 0


def wait_for_records(proc: subprocess.Popen[str], out: Path, more_than: int) -> int:
    """Wait until the run has written more than `more_than` records (or has ended)."""
    wait_until(
        lambda: count_lines(out) > more_than or proc_done(proc.pid),
        f"pid {proc.pid} wrote more than {more_than} records",
    )
    return count_lines(out)


def stop(proc: subprocess.Popen[Any]) -> None:
    """End a process this test started (SIGTERM, then SIGKILL), and its process group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=HANG_S)
    if wait_group_gone(proc.pid, timeout=20):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test created for it


def start_dask(*args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    """`dask ARGS` (the venv's console script) in its own session; workers import the
    project from ROOT, as an installed one."""
    with open(log or os.devnull, "w") as err:  # the child keeps its own copy
        return spawn(
            [BIN / "dask", *args], env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=err, new_session=True,
        )  # fmt: skip


def start_scheduler(info: Path, log: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """`dask scheduler` on 127.0.0.1 and a free port; (its process, its address)."""
    proc = start_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                      "--scheduler-file", str(info), log=log)  # fmt: skip

    def address() -> str | None:
        try:  # the scheduler writes the file in more than one step
            return str(json.loads(info.read_text())["address"])
        except (OSError, ValueError, KeyError):
            return None

    try:
        found = wait_until(
            lambda: address() or proc.poll() is not None, f"`dask scheduler` wrote {info}"
        )
    except AssertionError:
        found = None
    if not isinstance(found, str):
        stop(proc)
        pytest.fail(f"`dask scheduler` wrote no address to {info} (exit {proc.returncode})")
    return proc, found


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `dask scheduler` and a `dask worker ADDRESS --nworkers 2 --nthreads 1` on
    127.0.0.1, as the README starts them; yields the scheduler's address."""
    base = tmp_path_factory.mktemp("cluster")
    launched: list[subprocess.Popen[bytes]] = []
    try:
        proc, address = start_scheduler(base / "scheduler.json", base / "scheduler.log")
        launched.append(proc)
        launched.append(
            start_dask("worker", address, "--nworkers", "2", "--nthreads", "1",
                       "--no-dashboard", log=base / "worker.log")
        )  # fmt: skip
        with distributed.Client(address, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=HANG_S)
        yield address
    finally:
        for proc in reversed(launched):
            stop(proc)


@pytest.fixture(scope="module")
def synthetic_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """(config path, lines of a local --jobs 1 run) for the synthetic config."""
    base = tmp_path_factory.mktemp("reference")
    config = write_config(base)
    result = run(load_config(config), out=base / "results", jobs=1)
    return config, file_lines(result.records_path)


# --------------------------------------------------------------------------- records


def test_a_run_on_its_own_local_cluster_writes_the_records_of_a_local_run(tmp_path: Path) -> None:
    config = load_config(RETAIL, overrides=RETAIL_OVERRIDES)
    local = run(config, out=tmp_path / "local", jobs=1)
    on_dask = run(config, out=tmp_path / "dask", jobs=2, executor="dask")
    assert on_dask.ran == local.ran == len(plan(config)) == 12
    assert file_lines(on_dask.records_path) == file_lines(local.records_path)
    manifest = json.loads((on_dask.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    # Whole records, each written with one write: no torn or merged lines.
    raw = on_dask.records_path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 12


def test_trials_run_on_the_cluster_workers_in_batches(scheduler: str) -> None:
    specs = plan(load_config(RETAIL, overrides=RETAIL_OVERRIDES))
    executor = open_executor("dask", ExecutorOptions(scheduler=scheduler))
    try:
        client = executor.client  # type: ignore[attr-defined]
        workers = set(client.scheduler_info()["workers"])
        pids = set(client.run(os.getpid).values())
        with distributed.get_task_stream(client=client) as stream:
            records = list(executor.results(specs))
    finally:
        executor.close()
    assert len(workers) == 2 and os.getpid() not in pids and len(pids) == 2
    tasks = stream.data
    batches = -(-len(specs) // chunk_size(len(specs), 2))
    assert len(tasks) == batches
    assert all(t["key"].startswith("run_batch-") and t["worker"] in workers for t in tasks)
    expected = sorted(canonical(run_trial(spec)) for spec in specs)
    assert sorted(canonical(r) for r in records) == expected


def test_the_readme_commands_run_a_sweep_on_an_external_scheduler(
    scheduler: str, synthetic_reference: tuple[Path, list[str]], results_dir: Path,
    atomix_cli: Start,
) -> None:  # fmt: skip
    config, reference = synthetic_reference
    out = results_dir
    proc = atomix_cli("run", config, "--out", out, "--executor", "dask", "--scheduler", scheduler,
                      new_session=True)  # fmt: skip
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    (path,) = out.glob("dasky/*/trials.jsonl")
    assert file_lines(path) == reference


# --------------------------------------------------------------------------- interrupts


def test_an_interrupted_dask_run_resumes_without_losing_or_duplicating_a_trial(
    scheduler: str, synthetic_reference: tuple[Path, list[str]], results_dir: Path,
    atomix_cli: Start,
) -> None:  # fmt: skip
    config, reference = synthetic_reference
    out = results_dir
    # 1. Ctrl-C (SIGINT to the whole group) while its own LocalCluster runs trials. In its
    # own session: its LocalCluster workers share its group.
    first = atomix_cli("run", config, "--out", out, "--executor", "dask", "--jobs", 2,
                       new_session=True)  # fmt: skip
    after_first = wait_for_records(first, out, 0)
    with frozen(first.pid, group=True):  # the whole group: as a terminal's Ctrl-C finds it
        assert not proc_done(first.pid), f"the run ended first: {first.communicate()}"
        assert count_lines(out) < TOTAL, "the run wrote every record before the Ctrl-C"
        os.killpg(first.pid, signal.SIGINT)  # delivered to each once the group continues
    _, err = first.communicate(timeout=HANG_S)
    assert first.returncode == 130, err
    assert "Traceback" not in err, err
    (message,) = [line for line in err.splitlines() if "interrupted" in line]
    assert "resume with: " in message and "--executor dask" in message
    assert wait_group_gone(first.pid) == [], "a LocalCluster worker outlived the run"
    (run_dir,) = (p.parent for p in out.glob("dasky/*/manifest.json"))
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "interrupted"
    assert 0 < count_lines(out) < TOTAL

    # 2. The printed command resumes it on the external scheduler; SIGKILL mid-run.
    command = message.split("resume with: ", 1)[1].split()
    assert command[:2] == ["atomix", "run"]
    before = count_lines(out)
    second = atomix_cli(*command[1:], "--scheduler", scheduler, new_session=True)
    wait_for_records(second, out, before)
    with frozen(second.pid):  # so that the kill lands mid-run, as checked here
        assert not proc_done(second.pid), f"the resumed run ended first: {second.communicate()}"
        assert count_lines(out) < TOTAL, "the resumed run wrote every record before the kill"
        os.kill(second.pid, signal.SIGKILL)
    second.communicate(timeout=HANG_S)
    after_kill = count_lines(out)
    assert before < after_kill, "the resumed run wrote nothing before the kill"

    # 3. Resume to the end.
    third = atomix_cli(*command[1:], "--scheduler", scheduler, new_session=True)
    _, err = third.communicate(timeout=300)
    assert third.returncode == 0, err
    lines = file_lines(run_dir / "trials.jsonl")  # fails on a duplicated trial
    print(
        f"\ndask interrupt-and-resume: records after SIGINT {after_first}..{before}, after "
        f"SIGKILL {after_kill}, final {len(lines)} of {TOTAL}"
    )
    assert lines == reference
    assert after_kill < TOTAL
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "complete"


def test_a_scheduler_lost_mid_run_exits_1_with_the_resume_command(
    synthetic_reference: tuple[Path, list[str]], tmp_path: Path, results_dir: Path,
    atomix_cli: Start,
) -> None:  # fmt: skip
    config, _ = synthetic_reference
    scheduler_proc, address = start_scheduler(tmp_path / "scheduler.json")
    procs = [scheduler_proc]
    try:
        worker = start_dask("worker", address, "--nthreads", "1", "--no-dashboard")
        procs.append(worker)
        out = results_dir
        proc = atomix_cli("run", config, "--out", out, "--executor", "dask", "--scheduler", address,
                          new_session=True)  # fmt: skip
        written = wait_for_records(proc, out, 0)
        # The worker (its group: nanny and worker) frozen, so that no more trials finish
        # between the check that the run is unfinished and the scheduler's end.
        with frozen(worker.pid, group=True):
            assert not proc_done(proc.pid), f"the run ended first: {proc.communicate()}"
            written = count_lines(out)
            scheduler_proc.kill()  # the scheduler goes away
            scheduler_proc.wait(timeout=HANG_S)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        for p in reversed(procs):
            stop(p)
    assert 0 < written < TOTAL
    assert proc.returncode == 1, err
    assert "Traceback" not in err, err
    assert f"lost the dask cluster at {address}" in err
    assert "resume with: atomix run" in err and f"--scheduler {address}" in err
    assert count_lines(out) < TOTAL


def test_a_worker_without_the_project_is_named_before_anything_runs(
    synthetic_reference: tuple[Path, list[str]], tmp_path: Path
) -> None:
    config, _ = synthetic_reference
    # A worker machine where the project is not installed: importing it fails there.
    blocker = tmp_path / "no_project.py"
    blocker.write_text('import sys\nsys.modules["harness"] = None\n', encoding="utf-8")
    scheduler_proc, address = start_scheduler(tmp_path / "scheduler.json")
    procs = [scheduler_proc]
    try:
        procs.append(start_dask("worker", address, "--nthreads", "1", "--no-dashboard",
                                "--preload", str(blocker)))  # fmt: skip
        out = tmp_path / "results"
        result = invoke("run", config, "--out", out, "--executor", "dask", "--scheduler", address)
    finally:
        for p in reversed(procs):
            stop(p)
    assert result.exit_code == 2, result.output
    assert f"1 of 1 dask workers of {address} cannot import this project" in result.output
    assert "pip install ." in result.output and "nothing was run" in result.output
    assert not out.exists()


# --------------------------------------------------------------------------- bad options


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--executor", "dsak"], ["--executor", "unknown executor 'dsak'", "did you mean dask?"]),
        (["--scheduler", "tcp://127.0.0.1:8786"], ["--scheduler", "add --executor dask"]),
        (
            ["--executor", "local", "--scheduler", "tcp://127.0.0.1:8786"],
            ["--scheduler", "executor 'local' takes no scheduler address"],
        ),
        (
            ["--executor", "dask", "--scheduler", "tcp://127.0.0.1:8786", "--jobs", "2"],
            ["--jobs", "dask worker"],
        ),
        (
            ["--executor", "dask", "--scheduler", "127.0.0.1"],
            ["'127.0.0.1' is not a scheduler address", "tcp://HOST:PORT"],
        ),
    ],
    ids=["typo", "scheduler-without-dask", "scheduler-with-local", "jobs-with-scheduler", "no-port"],
)
def test_bad_executor_options_are_one_line_exit_2_and_write_nothing(
    tmp_path: Path, args: list[str], says: list[str]
) -> None:
    out = tmp_path / "results"
    result = invoke("run", write_config(tmp_path), "--out", out, *args)
    assert result.exit_code == 2, result.output
    for text in says:
        assert text in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_sweep_takes_the_same_executor_options(tmp_path: Path) -> None:
    out = tmp_path / "results"
    config = write_config(tmp_path)
    result = invoke("sweep", config, "--set", "faults.rate=0.1", "--out", out, "--executor", "Dask")
    assert result.exit_code == 2 and "did you mean dask?" in result.output, result.output
    result = invoke("sweep", config, "--set", "faults.rate=0.1", "--out", out,
                    "--scheduler", "tcp://127.0.0.1:8786")  # fmt: skip
    assert result.exit_code == 2 and "add --executor dask" in result.output, result.output
    assert not out.exists()


def test_a_scheduler_nobody_listens_on_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    out = tmp_path / "results"
    result = invoke("run", write_config(tmp_path), "--out", out, "--executor", "dask",
                    "--scheduler", address)  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"cannot reach the dask scheduler at {address}" in result.output
    assert "dask scheduler" in result.output and "nothing was run" in result.output
    assert not out.exists()


def test_resuming_with_an_unreachable_scheduler_leaves_the_run_as_it_was(
    synthetic_reference: tuple[Path, list[str]], tmp_path: Path
) -> None:
    config, _ = synthetic_reference
    first = run(load_config(config), out=tmp_path / "results", jobs=1, limit=2)
    before = first.records_path.read_bytes()
    manifest = (first.run_dir / "manifest.json").read_bytes()
    with pytest.raises(RunError, match="cannot reach the dask scheduler"):
        run(load_config(config), resume=first.run_dir, executor="dask",
            scheduler=f"tcp://127.0.0.1:{free_port()}")  # fmt: skip
    assert first.records_path.read_bytes() == before
    assert (first.run_dir / "manifest.json").read_bytes() == manifest


def test_without_dask_installed_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The import machinery's own "not installed": None in sys.modules makes the import fail.
    monkeypatch.setitem(sys.modules, "distributed", None)
    monkeypatch.delitem(sys.modules, "harness.experiment.dask_executor", raising=False)
    with pytest.raises(RunError, match=r"pip install '\.\[dask\]'"):
        open_executor("dask", ExecutorOptions(jobs=2))
    out = tmp_path / "results"
    result = invoke("run", write_config(tmp_path), "--out", out, "--executor", "dask")
    assert result.exit_code == 2, result.output
    assert "pip install '.[dask]'" in result.output
    assert not out.exists()


def test_the_command_line_starts_without_importing_dask() -> None:
    probe = (
        "import sys; sys.argv = ['atomix', 'run', '--help']\n"
        "import cli\n"
        "try:\n    cli.app()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd=ROOT)  # fmt: skip
    assert "--executor" in done.stdout and "--scheduler" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"

"""Running experiments: `run` and `sweep`, and resuming either (`--resume RUN_DIR`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from harness.cli.common import (
    EXIT_CONFIG,
    EXIT_DISK,
    fail,
    flag_error,
    jobs_default,
    load_checked,
    stderr,
    stdout,
)
from harness.cli.options import Jobs, MaxCells, MaxTrials
from harness.cli.progress import run_with_progress
from harness.cli.results import write_report
from harness.errors import ConfigError, RunError

if TYPE_CHECKING:
    from harness.experiment.config import ExperimentConfig, SizeLimits

commands = typer.Typer()

Trials = Annotated[
    int | None,
    typer.Option("--trials", min=1, help="Trials per cell and mode (overrides `trials`)."),
]
Seed = Annotated[int | None, typer.Option("--seed", help="Base seed (overrides `seed`).")]
Modes = Annotated[
    str | None, typer.Option("--modes", help="Comma-separated modes (overrides `modes`).")
]
Out = Annotated[
    Path, typer.Option("--out", help="Results directory; runs go to OUT/<config-name>/<run-id>.")
]
Resume = Annotated[
    Path | None,
    typer.Option(
        "--resume",
        help="Resume this run directory from the config stored in it (CONFIG.yaml and "
        "overrides not needed; if given, they must resolve to the same config).",
    ),
]
Limit = Annotated[
    int | None,
    typer.Option(
        "--limit",
        min=1,
        help="Run only trials 0..N-1 of every cell and mode (a quick look); a later "
        "--resume without --limit runs the rest.",
    ),
]
TaskIds = Annotated[
    str | None,
    typer.Option(
        "--tasks",
        metavar="IDS",
        help="Run only the trials that perform these task ids, comma-separated (e.g. 3,17,42; "
        "workloads with task ids, such as tau_retail: see atomix list workloads); a later "
        "--resume without --tasks runs the rest.",
    ),
]
Quiet = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bar or lines, no time estimate.")
]
ExecutorChoice = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="local|dask",
        help="Where trials run: local (this machine, --jobs worker processes) or dask (a "
        "dask.distributed cluster: the one at --scheduler, else a LocalCluster of --jobs "
        "workers; needs pip install '.\\[dask]').",  # rich markup: \\[ is a literal [
    ),
]
Scheduler = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="ADDRESS",
        help="With --executor dask: the scheduler to send trials to, e.g. tcp://HOST:8786 "
        "(started with `dask scheduler`; each machine runs `dask worker tcp://HOST:8786`).",
    ),
]


class DamagedChoice(StrEnum):
    rerun = "rerun"
    skip = "skip"


Damaged = Annotated[
    DamagedChoice,
    typer.Option(
        "--damaged",
        help="On --resume, what to do with damaged lines of trials.jsonl: rerun (move them to "
        "trials.damaged.jsonl and run their trials again: the run ends complete) or skip "
        "(leave them; the trials they name are not run again).",
    ),
]
OptionalConfigArg = Annotated[
    Path | None,
    typer.Argument(
        metavar="[CONFIG.yaml]",
        help="Experiment config (YAML); optional with --resume (the run's stored config).",
        show_default=False,
    ),
]


def _check_executor(executor: str, scheduler: str | None, jobs: int | None) -> None:
    """`--executor`/`--scheduler` checked before anything runs, blaming the flag."""
    from harness.experiment.executors import EXECUTORS, executor_problem

    if executor not in EXECUTORS:
        raise typer.BadParameter(str(executor_problem(executor)), param_hint="--executor")
    problem = executor_problem(executor, scheduler)
    if problem is not None:
        raise typer.BadParameter(f"{problem}: add --executor dask", param_hint="--scheduler")
    if scheduler is not None and jobs is not None:
        raise typer.BadParameter(
            "--jobs sets the worker processes on this machine; with --scheduler the "
            "cluster's workers run the trials (start more with `dask worker`)",
            param_hint="--jobs",
        )


def _again_args(
    sets: list[str] | None,
    trials: int | None,
    seed: int | None,
    modes: str | None,
    max_cells: int | None,
    max_trials: int | None,
    executor: str,
    scheduler: str | None,
) -> list[str]:
    """The options as given, for the command that resumes an interrupted run."""
    args = [arg for item in sets or [] for arg in ("--set", item)]
    pairs = (
        ("--trials", trials), ("--seed", seed), ("--modes", modes),
        ("--max-cells", max_cells), ("--max-trials", max_trials),
    )  # fmt: skip
    args += [arg for flag, value in pairs if value is not None for arg in (flag, str(value))]
    args += ["--executor", executor] if executor != "local" else []
    return args + (["--scheduler", scheduler] if scheduler is not None else [])


def _resolve(
    config: Path | None,
    resume: Path | None,
    overrides: dict[str, Any],
    grid: dict[str, list[Any]] | None,
    limits: SizeLimits,
) -> ExperimentConfig:
    """The config to run: CONFIG.yaml with the overrides, or (with --resume and no
    CONFIG.yaml) the run's stored config with them; exit 2 with the problem."""
    if config is not None:
        return load_checked(config, overrides, grid, limits)
    if resume is None:
        raise typer.BadParameter(
            "give a CONFIG.yaml, or --resume RUN_DIR to resume a run from its stored config",
            param_hint="CONFIG.yaml",
        )
    from harness.experiment.overrides import stored_config
    from harness.experiment.rundir import MANIFEST

    try:
        cfg = stored_config(resume, overrides, grid, limits)
        from harness.analysis.runs import check_report

        check_report(cfg, resume / MANIFEST)
    except (ConfigError, RunError) as exc:
        fail(str(exc))
    return cfg


def _execute(
    command: list[str],
    config_path: Path | None,
    config: ExperimentConfig,
    jobs: int | None,
    out: Path,
    resume: Path | None,
    damaged: str = "rerun",
    limit: int | None = None,
    quiet: bool = False,
    executor: str = "local",
    scheduler: str | None = None,
    overrides: dict[str, Any] | None = None,
    tasks: list[str] | None = None,
) -> None:
    """Run (or resume), then report (`overrides`: what the flags changed, for the manifest;
    `tasks`: the task ids --tasks selected); on SIGINT/SIGTERM, a disk error or a lost
    cluster print one line with the command that resumes the run."""
    from harness.experiment.executors import ExecutorLost
    from harness.experiment.interrupts import exit_code, set_note
    from harness.experiment.rundir import RunIOError

    started: list[Path] = []

    def again(run_dir: Path) -> str:
        given = [str(config_path)] if config_path is not None else []
        limited = ["--limit", str(limit)] if limit is not None else []
        limited += ["--tasks", ",".join(tasks)] if tasks is not None else []
        return shlex.join(
            ["atomix", *command[:1], *given, "--resume", str(run_dir), *command[1:], *limited]
        )

    try:
        result = run_with_progress(
            config, out, jobs or jobs_default(), resume, started, damaged, limit, quiet,
            executor, scheduler, overrides, tasks,
        )  # fmt: skip
    except (RunIOError, ExecutorLost) as exc:
        run_dir = started[0] if started else resume
        once = "the disk is usable" if isinstance(exc, RunIOError) else "the cluster is back"
        hint = (
            f"; the run is kept: once {once}, resume with: {again(run_dir)}"
            if run_dir is not None
            else ""
        )
        fail(f"{exc}{hint}", EXIT_DISK)
    except RunError as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:
        run_dir = started[0] if started else resume
        if run_dir is None:
            fail("interrupted before the run started; nothing was written", exit_code(exc))
        fail(
            f"interrupted: finished trials are kept in {run_dir}; resume with: {again(run_dir)}",
            exit_code(exc),
        )
    set_note(
        f"interrupted while writing the report of the finished run {result.run_dir}; "
        f"rebuild it with: atomix report {shlex.quote(str(result.run_dir))}"
    )
    report = write_report(result.run_dir)
    console = stdout()
    console.print(f"run dir: {result.run_dir}", soft_wrap=True)
    console.print(
        f"wrote {len(report.paths)} report files under {result.run_dir} (tables/, plots/)",
        soft_wrap=True,
    )
    skipped = f"; {result.skipped} already done" if result.skipped else ""
    console.print(
        f"{result.ran} trials in {result.wall_s:.1f} s ({result.trials_per_s:.1f} trials/s){skipped}"
    )
    if report.problems:
        raise typer.Exit(EXIT_CONFIG)


RetryFailed = Annotated[
    Path | None,
    typer.Option(
        "--retry-failed",
        metavar="RUN_DIR",
        help="Run again only the errored trials of this run (a model server that refused or "
        "timed out, a recorded harness error), in place: each new record replaces the errored "
        "one and says it is a retry; the old one is kept in trials.retried.jsonl.",
    ),
]


def _tasks(tasks: str | None, cfg: ExperimentConfig) -> list[str] | None:
    """`--tasks` parsed and checked against the config's task ids, or exit 2 naming them."""
    if tasks is None:
        return None
    from harness.experiment.task_select import check_config_tasks, parse_task_ids

    try:
        ids = parse_task_ids(tasks)
        check_config_tasks(cfg, ids)
    except ConfigError as exc:
        raise flag_error(exc) from None
    return ids


def _retry(
    run_dir: Path, jobs: int | None, quiet: bool, executor: str, scheduler: str | None,
    given: Mapping[str, object],
) -> None:  # fmt: skip
    """`run --retry-failed RUN_DIR`: re-run the run's errored trials in place, then report."""
    clash = [flag for flag, value in given.items() if value]
    if clash:
        raise typer.BadParameter(
            f"--retry-failed re-runs a run's errored trials from its stored config; it takes "
            f"no {clash[0]} (only --jobs, --quiet, --executor, --scheduler)",
            param_hint=clash[0],
        )
    from harness.analysis.runs import resolve_run
    from harness.experiment.interrupts import exit_code
    from harness.experiment.retry import retry_failed
    from harness.experiment.rundir import RunIOError

    try:
        run_dir = resolve_run(run_dir)
    except RunError as exc:
        fail(str(exc))

    def progress(done: int, total: int, record: dict[str, Any] | None) -> None:
        if not quiet and record is not None:
            from harness.experiment.retry import trial_error

            error = trial_error(record)
            what = f"still errored: {error}" if error else "ok"
            stderr().print(f"retried {done}/{total}: {record['key']}: {what}", soft_wrap=True)

    try:
        result = retry_failed(
            run_dir, jobs=jobs or jobs_default(), executor=executor, scheduler=scheduler,
            progress=progress,
        )  # fmt: skip
    except RunIOError as exc:
        fail(str(exc), EXIT_DISK)
    except RunError as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:
        fail(f"interrupted: {run_dir} is as it was before the retry", exit_code(exc))
    console = stdout()
    if not result.retried:
        console.print(f"{run_dir}: no errored trials; nothing to retry", soft_wrap=True)
        return
    write_report(run_dir)
    still = len(result.still_errored)
    console.print(
        f"retried {len(result.retried)} errored trial(s) of {run_dir}: "
        f"{len(result.retried) - still} ran through, {still} still errored"
        + (f" (e.g. atomix show {run_dir} {result.still_errored[0]})" if still else "")
        + "; replaced records are in trials.retried.jsonl",
        soft_wrap=True,
    )


@commands.command(
    "run",
    short_help="Run an experiment, then write and print its report.",
    epilog="Example: atomix run configs/synthetic_fault_class.yaml --trials 20 --modes tx-full,no-tx --jobs 4",
)
def run(
    config: OptionalConfigArg = None,
    trials: Trials = None,
    seed: Seed = None,
    jobs: Jobs = None,
    modes: Modes = None,
    out: Out = Path("results"),
    resume: Resume = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE overrides one config key (dotted, or a label such as fp); "
            "a key the grid varies is pinned to VALUE; repeatable.",
        ),
    ] = None,
    damaged: Damaged = DamagedChoice.rerun,
    max_cells: MaxCells = None,
    max_trials: MaxTrials = None,
    limit: Limit = None,
    tasks: TaskIds = None,
    retry_failed: RetryFailed = None,
    quiet: Quiet = False,
    executor: ExecutorChoice = "local",
    scheduler: Scheduler = None,
) -> None:
    """Run an experiment (every cell x trial x mode), then write and print its report.

    `atomix run --resume RUN_DIR` resumes a run from the config stored in it;
    `atomix run --retry-failed RUN_DIR` runs its errored trials again."""
    _check_executor(executor, scheduler, jobs)
    if retry_failed is not None:
        given = {
            "CONFIG.yaml": config, "--resume": resume, "--set": set_, "--trials": trials,
            "--seed": seed, "--modes": modes, "--limit": limit, "--tasks": tasks,
            "--max-cells": max_cells, "--max-trials": max_trials,
        }  # fmt: skip
        _retry(retry_failed, jobs, quiet, executor, scheduler, given)
        return
    from harness.experiment.overrides import flag_overrides, raw_config, run_sets, size_limits

    try:
        overrides = flag_overrides(trials, seed, modes)
    except ValueError as exc:
        raise flag_error(exc) from None
    try:
        raw = raw_config(config, resume) if set_ else {}
    except RunError as exc:
        fail(str(exc))
    try:
        extra, pinned = run_sets(raw, set_)
    except ValueError as exc:
        raise flag_error(exc) from None
    overrides.update(extra)
    cfg = _resolve(config, resume, overrides, pinned or None, size_limits(max_cells, max_trials))
    task_ids = _tasks(tasks, cfg)
    args = _again_args(set_, trials, seed, modes, max_cells, max_trials, executor, scheduler)
    # A grid key --set pins is an override of one value, as the caption should say it.
    given = {**overrides, **{k: v[0] for k, v in (pinned or {}).items()}}
    _execute(
        ["run", *args], config, cfg, jobs, out, resume, damaged.value, limit, quiet, executor,
        scheduler, given, task_ids,
    )  # fmt: skip


@commands.command(
    "sweep",
    short_help="Run a config over extra grid keys into one run directory.",
    epilog="Example: atomix sweep configs/synthetic_fault_class.yaml --set faults.rate=0,0.1,0.3 --set params.agents=1,4",
)
def sweep(
    config: OptionalConfigArg = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=V1,V2,... adds KEY to the grid (replacing it if present); repeatable "
            "(needed unless resuming).",
        ),
    ] = None,
    trials: Trials = None,
    seed: Seed = None,
    jobs: Jobs = None,
    modes: Modes = None,
    out: Out = Path("results"),
    resume: Resume = None,
    damaged: Damaged = DamagedChoice.rerun,
    max_cells: MaxCells = None,
    max_trials: MaxTrials = None,
    limit: Limit = None,
    tasks: TaskIds = None,
    quiet: Quiet = False,
    executor: ExecutorChoice = "local",
    scheduler: Scheduler = None,
) -> None:
    """Run a config over extra grid keys: one run directory holding every cell.

    `atomix sweep --resume RUN_DIR` resumes a sweep from the config stored in it."""
    if not set_ and resume is None:
        raise typer.BadParameter(
            "at least one KEY=V1,V2,... is needed (e.g. --set faults.rate=0,0.1)",
            param_hint="--set",
        )
    _check_executor(executor, scheduler, jobs)
    from harness.experiment.overrides import flag_overrides, size_limits, sweep_grid

    try:
        grid = sweep_grid(set_ or [])
        overrides = flag_overrides(trials, seed, modes)
    except ValueError as exc:
        raise flag_error(exc) from None
    cfg = _resolve(config, resume, overrides, grid or None, size_limits(max_cells, max_trials))
    task_ids = _tasks(tasks, cfg)
    args = _again_args(set_, trials, seed, modes, max_cells, max_trials, executor, scheduler)
    given = {**overrides, **{f"grid.{k}": v for k, v in (grid or {}).items()}}
    _execute(
        ["sweep", *args], config, cfg, jobs, out, resume, damaged.value, limit, quiet, executor,
        scheduler, given, task_ids,
    )  # fmt: skip

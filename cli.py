"""The `atomix` command: run experiments, sweep parameters, rebuild reports, compare modes.

Every command is a thin wrapper over `harness.experiment.config`, `harness.experiment.runner` and
`harness.analysis.runs`. Exit codes: 0 success, 1 the disk refused a write (full, read-only) or a
dask cluster was lost mid-run (the run stays resumable), 2 a bad config / bad option /
unusable or locked run directory (nothing is written), 130 interrupted by SIGINT (Ctrl-C),
143 by SIGTERM (finished trials are kept).
"""

from __future__ import annotations

# isort: off
import harness.experiment.startup  # noqa: F401 - first: a signal during the imports below exits in one line
# isort: on

import contextlib
import copy
import dataclasses
import importlib
import os
import shlex
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.core
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text
from typer._click import exceptions as click  # typer vendors click (BadParameter, ...)

from harness.errors import ConfigError, RunError

if TYPE_CHECKING:
    from rich.progress import Progress

    from harness.analysis.report import Table
    from harness.experiment.config import ExperimentConfig
    from harness.experiment.runner import RunResult


class _Lazy:
    """A module imported on first use: `atomix --version` and `--help` must not pay for the
    harness (pydantic) or the report stack (scipy, matplotlib, pandas)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


reporting: Any = _Lazy("harness.analysis.runs")


class _OneLineErrors(typer.core.TyperGroup):
    """A bad option or argument is one line naming it (`atomix run: Invalid value for
    '--trials': ...`), not a usage banner and a box."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.BadParameter as exc:
            where = exc.ctx.command_path if exc.ctx else "atomix"
            more = f" (see: {where} --help)" if exc.ctx else ""
            _err().print(Text(f"{where}: {exc.format_message()}{more}", style="red"))
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
            sys.exit(exc.exit_code)
        except typer.Abort:
            _err().print("Aborted!")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="atomix",
    help="Atomix evaluation harness: run agent workloads under settlement modes with injected faults.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    epilog="Example: atomix run configs/synthetic_fault_class.yaml --trials 20; atomix list modes",
)

EXIT_DISK = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130
LIST_KINDS = ("configs", "modes", "workloads", "faults")


def _out() -> Console:
    # Built per call so that it writes to the current sys.stdout (tests swap it). A pipe gets
    # a wide console, so tables are not squeezed to 80 columns.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=200 if wide else None, highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    _err().print(Text(message, style="red"))
    raise typer.Exit(code)


def _jobs_default() -> int:
    return min(os.cpu_count() or 1, 8)


# --------------------------------------------------------------------------- options

Trials = Annotated[
    int | None,
    typer.Option("--trials", min=1, help="Trials per cell and mode (overrides `trials`)."),
]
Seed = Annotated[int | None, typer.Option("--seed", help="Base seed (overrides `seed`).")]
Jobs = Annotated[
    int | None,
    typer.Option(
        "--jobs", "-j", min=1, help="Worker processes (default: the number of CPUs, at most 8)."
    ),
]
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
ConfigArg = Annotated[
    Path,
    typer.Argument(metavar="CONFIG.yaml", help="Experiment config (YAML).", show_default=False),
]
OptionalConfigArg = Annotated[
    Path | None,
    typer.Argument(
        metavar="[CONFIG.yaml]",
        help="Experiment config (YAML); optional with --resume (the run's stored config).",
        show_default=False,
    ),
]
MaxCells = Annotated[
    int | None,
    typer.Option("--max-cells", min=1, help="Refuse a config with more cells (default 1,000)."),
]
MaxTrials = Annotated[
    int | None,
    typer.Option(
        "--max-trials",
        min=1,
        help="Refuse a config planning more trials, cells x modes x trials (default 1,000,000).",
    ),
]


def _limits(max_cells: int | None, max_trials: int | None) -> Any:
    """The size caps for load_config: the defaults, raised (or lowered) by the options."""
    from harness.experiment.config import DEFAULT_LIMITS, SizeLimits

    return SizeLimits(
        max_cells=max_cells or DEFAULT_LIMITS.max_cells,
        max_trials=max_trials or DEFAULT_LIMITS.max_trials,
    )


def _limit_args(max_cells: int | None, max_trials: int | None) -> list[str]:
    """The size options as given, for the command that resumes an interrupted run."""
    pairs = (("--max-cells", max_cells), ("--max-trials", max_trials))
    return [arg for flag, value in pairs if value is not None for arg in (flag, str(value))]


def _set_value(item: str, text: str) -> Any:
    """One `--set` value parsed as YAML by the config loader's bounded parser."""
    from harness.experiment.yamlload import YamlInputError, load_yaml

    try:
        return load_yaml(text)
    except YamlInputError as exc:
        raise typer.BadParameter(f"{item!r}: {exc}", param_hint="--set") from None


def _split(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",")]
    if not all(items):
        raise typer.BadParameter(
            f"{what} must be a comma-separated list without empty items, got {value!r}"
        )
    return items


def _overrides(trials: int | None, seed: int | None, modes: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if trials is not None:
        out["trials"] = trials
    if seed is not None:
        out["seed"] = seed
    if modes is not None:
        out["modes"] = _check_modes(_split(modes, "--modes"))
    return out


def _check_modes(names: list[str]) -> list[str]:
    """`--modes` names checked here, so that a typo blames the flag, not the config file."""
    from harness.experiment.config import unknown_modes_message
    from harness.modes.base import modes as known_modes

    known = known_modes()
    bad = [m for m in names if m not in known]
    if bad:
        raise typer.BadParameter(unknown_modes_message(bad, list(known)), param_hint="--modes")
    if len(set(names)) != len(names):
        raise typer.BadParameter(f"a mode is listed twice in {','.join(names)!r}", param_hint="--modes")
    return names


def _check_set_key(item: str, key: str, labels: Any = ()) -> None:
    """A `--set` key that names no config key is refused naming the flag (did you mean?)."""
    from harness.experiment.config import DOTTED_KEY, did_you_mean, unknown_key

    if not DOTTED_KEY.fullmatch(key):
        return  # load_config says what a dotted key is
    problem = unknown_key(key)
    if problem is None:
        return
    if "did you mean" not in problem:
        problem += did_you_mean(key, list(labels))
    raise typer.BadParameter(f"{item!r}: {problem}", param_hint="--set")


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


def _executor_args(executor: str, scheduler: str | None) -> list[str]:
    """The executor options as given, for the command that resumes an interrupted run."""
    args = ["--executor", executor] if executor != "local" else []
    return args + (["--scheduler", scheduler] if scheduler is not None else [])


def _override_args(trials: int | None, seed: int | None, modes: str | None) -> list[str]:
    args: list[str] = []
    for flag, value in (("--trials", trials), ("--seed", seed), ("--modes", modes)):
        if value is not None:
            args += [flag, str(value)]
    return args


def _key_value(item: str, expected: str) -> tuple[str, str]:
    """Split one `--set` item at its first `=`, or refuse it saying what is expected."""
    key, eq, value = item.partition("=")
    key = key.strip()
    if not eq or not key or not value.strip():
        raise typer.BadParameter(f"expected {expected}, got {item!r}", param_hint="--set")
    return key, value


def _parse_sets(sets: list[str]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for item in sets:
        key, values = _key_value(item, "KEY=V1,V2,... (e.g. faults.rate=0,0.1)")
        _check_set_key(item, key)
        grid[key] = [_set_value(item, v) for v in _split(values, f"--set {key}")]
    return grid


def _raw_config(path: Path) -> dict[str, Any]:
    """The config file as a mapping, or {} (load_config reports the file's problem itself)."""
    from harness.experiment.yamlload import MAX_BYTES, YamlInputError, load_yaml

    try:
        with path.open("rb") as fh:
            raw = load_yaml(fh.read(MAX_BYTES + 1))
    except (OSError, YamlInputError):
        raw = None
    return raw if isinstance(raw, dict) else {}


def _run_sets(
    raw: dict[str, Any], sets: list[str] | None
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """`run --set KEY=VALUE`: (overrides, grid) for load_config; `raw` is the config file.

    KEY is a dotted config key or one of the config's labels (e.g. `fp`). A key the grid
    varies is pinned to the one value (a one-value grid), so the cell id still names it,
    spelled as the grid spells it (`fp=0` pins the grid's 0.0: cell `fp=0.0`).
    """
    if not sets:
        return {}, {}
    labels = raw.get("labels") if isinstance(raw.get("labels"), dict) else {}
    by_label = {str(label): str(key) for key, label in labels.items()}
    raw_grid = raw.get("grid") if isinstance(raw.get("grid"), dict) else {}
    overrides: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    for item in sets:
        key, value = _key_value(item, "KEY=VALUE (e.g. agent.kind=gold or fp=0.1)")
        if key not in by_label:
            _check_set_key(item, key, by_label)
        key = by_label.get(key, key)
        parsed = _set_value(item, value)
        if key in raw_grid:
            values = raw_grid[key] if isinstance(raw_grid[key], list) else []
            same = [v for v in values if v == parsed and isinstance(v, bool) == isinstance(parsed, bool)]
            grid[key] = [same[0] if same else parsed]
        else:
            overrides[key] = parsed
    return overrides, grid


def _load(
    path: Path,
    overrides: dict[str, Any] | None = None,
    grid: dict[str, list[Any]] | None = None,
    limits: Any = None,
) -> ExperimentConfig:
    """Load, validate and check a config's report section, or exit 2 with the message.

    `limits` (a harness.experiment.config.SizeLimits) defaults to the default caps.
    """
    try:
        from harness.experiment.config import DEFAULT_LIMITS, load_config

        config = load_config(path, overrides=overrides, grid=grid, limits=limits or DEFAULT_LIMITS)
        reporting.check_report(config, path)
    except ConfigError as exc:
        _fail(str(exc))
    return config


def _stored(
    run_dir: Path,
    overrides: dict[str, Any] | None = None,
    grid: dict[str, list[Any]] | None = None,
    limits: Any = None,
) -> ExperimentConfig:
    """The resolved config a run directory's manifest keeps, with any overrides applied, or
    exit 2 with the message."""
    from harness.experiment.config import DEFAULT_LIMITS, set_dotted, validate_config
    from harness.experiment.rundir import MANIFEST, read_manifest

    try:
        data = copy.deepcopy(read_manifest(run_dir)["config"])
    except RunError as exc:
        _fail(str(exc))
    path = run_dir / MANIFEST
    try:
        for key, value in (overrides or {}).items():
            try:
                set_dotted(data, key, value)
            except KeyError as exc:
                raise ConfigError(path, [f"--set {key}: {exc.args[0]}"]) from None
        if grid:
            data["grid"] = {**(data.get("grid") or {}), **grid}
        config = validate_config(data, path, limits or DEFAULT_LIMITS)
        reporting.check_report(config, path)
    except ConfigError as exc:
        _fail(str(exc))
    return config


def _resolve(
    config: Path | None,
    resume: Path | None,
    overrides: dict[str, Any],
    grid: dict[str, list[Any]] | None,
    limits: Any,
) -> ExperimentConfig:
    """The config to run: CONFIG.yaml with the overrides, or (with --resume and no
    CONFIG.yaml) the run's stored config with them."""
    if config is not None:
        return _load(config, overrides, grid, limits)
    if resume is None:
        raise typer.BadParameter(
            "give a CONFIG.yaml, or --resume RUN_DIR to resume a run from its stored config",
            param_hint="CONFIG.yaml",
        )
    return _stored(resume, overrides, grid, limits)


# --------------------------------------------------------------------------- running

#: Plain progress lines (stderr not a terminal): none before this many seconds, then one
#: per 5% of the trials (at most one a second) or every PROGRESS_EVERY_S seconds.
PROGRESS_QUIET_S = 2.0
PROGRESS_EVERY_S = 10.0
#: The time estimate: measured over the first ESTIMATE_AFTER_S seconds (or trials) of the
#: session, printed once when the rest would take longer than ESTIMATE_OVER_S.
ESTIMATE_AFTER_S = 3.0
ESTIMATE_AFTER_TRIALS = 200
ESTIMATE_OVER_S = 60.0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


class _Watch:
    """Progress of a run on stderr when it is not a terminal (plain lines) and the one-time
    estimate of a long run; `say` prints a line (through the bar's console on a terminal)."""

    def __init__(self, name: str, jobs: int, say: Any, lines: bool, estimate: bool) -> None:
        self.name, self.jobs, self.say = name, jobs, say
        self.lines, self.estimate = lines, estimate
        self.start = time.monotonic()
        self.first: int | None = None
        self.last_line = self.start
        self.last_step = 0
        self.printed = False
        self.estimated = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first, self.start, self.last_line = done, now, now
            return
        ran, elapsed = done - self.first, now - self.start
        rate = ran / elapsed if elapsed > 0 else 0.0
        left = (total - done) / rate if rate > 0 else 0.0
        if (
            self.estimate
            and not self.estimated
            and ran > 0
            and (elapsed >= ESTIMATE_AFTER_S or ran >= ESTIMATE_AFTER_TRIALS)
        ):
            self.estimated = True
            if left > ESTIMATE_OVER_S:
                workers = (
                    f"{self.jobs} worker{'s' if self.jobs != 1 else ''}"
                    if self.jobs
                    else "the dask cluster"  # its workers are not ours to count
                )
                todo = total - self.first
                self.say(
                    f"{todo:,} trials, about {_duration(todo / rate)} at ~{rate:,.0f} trials/s "
                    f"on {workers} (estimate from the first {ran:,} trials; about "
                    f"{_duration(left)} left)"
                )
        if not self.lines or total <= 0:
            return
        step = done * 20 // total  # 5% steps
        due = now - self.last_line >= PROGRESS_EVERY_S or (
            step > self.last_step and now - self.last_line >= 1.0
        )
        finished = done >= total and self.printed
        if finished or (due and elapsed >= PROGRESS_QUIET_S):
            eta = f", ETA {_duration(left)}" if done < total else ""
            self.say(
                f"{self.name}: {done:,}/{total:,} trials ({100 * done / total:.0f}%), "
                f"{rate:,.0f} trials/s{eta}"
            )
            self.printed, self.last_line, self.last_step = True, now, step


def _progress() -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeRemainingColumn,
    )

    class _TrialsPerSecond(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            text = f"{speed:.1f} trials/s" if speed else "- trials/s"
            return Text(text, style="progress.data.speed")

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("trials"),
        _TrialsPerSecond(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )


def _run_with_progress(
    config: ExperimentConfig,
    out: Path,
    jobs: int,
    resume: Path | None,
    started: list[Path],
    damaged: str = "rerun",
    limit: int | None = None,
    quiet: bool = False,
    executor: str = "local",
    scheduler: str | None = None,
) -> RunResult:
    """Run with a rich bar on a terminal, plain progress lines otherwise, none if quiet."""
    terminal = sys.stderr.isatty()
    with _progress() if terminal and not quiet else contextlib.nullcontext() as bar:
        console = bar.console if bar is not None else _err()
        task: list[Any] = []

        def say(text: str, style: str | None = None) -> None:
            console.print(Text(text, style=style or ""), soft_wrap=True)

        watch = _Watch(
            config.name or "run",
            0 if scheduler is not None else jobs,
            say,
            lines=not terminal and not quiet,
            estimate=not quiet,
        )

        def progress(done: int, total: int, record: dict[str, Any] | None) -> None:
            watch(done, total)
            if bar is None:
                return
            if not task:
                task.append(bar.add_task(config.name or "run", total=total, completed=done))
            else:
                bar.update(task[0], completed=done)

        from harness.experiment.runner import run as run_experiment

        return run_experiment(
            config,
            out=out,
            jobs=jobs,
            resume=resume,
            progress=progress,
            on_start=started.append,
            damaged=damaged,
            notice=lambda text: say(text, "yellow"),
            limit=limit,
            executor=executor,
            scheduler=scheduler,
        )


def _print_table(table: Table) -> None:
    """Print a report table; one too wide for the terminal is shown with cells as rows."""
    from rich.measure import Measurement

    from harness.analysis.report import to_rich

    console = _out()
    unlimited = console.options.update_width(1_000_000)

    def rich_of(display: Any) -> RichTable:
        return to_rich(dataclasses.replace(table, display=display))

    def fits(display: Any) -> bool:
        return Measurement.get(console, unlimited, rich_of(display)).maximum <= console.width

    transposed = table.display.T
    transposed.index.name = "cell"
    for display in (table.display, transposed):
        if fits(display):
            console.print(rich_of(display))
            return
    # Neither way fits: print it in parts of whole columns, each as wide as the terminal,
    # every part with all the row labels uncut (the orientation needing fewer parts).

    def parts(display: Any) -> list[list[Any]]:
        out: list[list[Any]] = [[]]
        for col in display.columns:
            if out[-1] and not fits(display[[*out[-1], col]]):
                out.append([])
            out[-1].append(col)
        return out

    display, chunks = min(
        ((d, parts(d)) for d in (table.display, transposed)), key=lambda dc: len(dc[1])
    )
    for i, cols in enumerate(chunks, 1):
        part = rich_of(display[cols])
        part.title = Text(f"{table.title} (part {i} of {len(chunks)})")
        if i < len(chunks):
            part.caption = None
        part.columns[0].no_wrap = True
        console.print(part)


def _report(run_dir: Path, report_from: ExperimentConfig | None = None) -> reporting.Report:
    from harness.experiment.rundir import RunIOError, damaged_summary, io_error

    try:
        run = reporting.load_run(run_dir, report_from)
    except RunIOError as exc:
        _fail(str(exc), EXIT_DISK)
    except (ConfigError, RunError) as exc:
        _fail(str(exc))
    if run.damaged:
        # The report is built from the whole records; the damaged lines are named, not fatal.
        _err().print(
            Text(
                f"{run_dir}/trials.jsonl: {damaged_summary(run.damaged)}: left out of the "
                "report; resuming the run moves them aside and runs their trials again",
                style="yellow",
            ),
            soft_wrap=True,
        )
    try:
        result = reporting.write_run_report(run)
    except OSError as exc:
        _fail(str(io_error(run_dir, exc, "cannot write the report:")), EXIT_DISK)
    if result.main is not None:
        _print_table(result.main)
    if run.status != "complete":
        _err().print(
            Text(
                f"note: run is {run.status}: {len(run.records)} of {run.planned} trials",
                style="yellow",
            )
        )
    for problem in result.problems:
        _err().print(Text(f"{run_dir}: {problem}", style="red"))
    return result


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
) -> None:
    """Run (or resume), then report; on SIGINT/SIGTERM, a disk error or a lost cluster print
    one line with the command that resumes the run."""
    from harness.experiment.executors import ExecutorLost
    from harness.experiment.interrupts import exit_code, set_note
    from harness.experiment.rundir import RunIOError

    started: list[Path] = []

    def again(run_dir: Path) -> str:
        given = [str(config_path)] if config_path is not None else []
        limited = ["--limit", str(limit)] if limit is not None else []
        return shlex.join(
            ["atomix", *command[:1], *given, "--resume", str(run_dir), *command[1:], *limited]
        )

    try:
        result = _run_with_progress(
            config, out, jobs or _jobs_default(), resume, started, damaged, limit, quiet,
            executor, scheduler,
        )
    except (RunIOError, ExecutorLost) as exc:
        run_dir = started[0] if started else resume
        once = "the disk is usable" if isinstance(exc, RunIOError) else "the cluster is back"
        hint = f"; the run is kept: once {once}, resume with: {again(run_dir)}"
        _fail(f"{exc}{hint if run_dir is not None else ''}", EXIT_DISK)
    except RunError as exc:
        _fail(str(exc))
    except KeyboardInterrupt as exc:
        run_dir = started[0] if started else resume
        if run_dir is None:
            _fail("interrupted before the run started; nothing was written", exit_code(exc))
        _fail(
            f"interrupted: finished trials are kept in {run_dir}; resume with: {again(run_dir)}",
            exit_code(exc),
        )
    set_note(
        f"interrupted while writing the report of the finished run {result.run_dir}; "
        f"rebuild it with: atomix report {shlex.quote(str(result.run_dir))}"
    )
    report = _report(result.run_dir)
    out_console = _out()
    out_console.print(f"run dir: {result.run_dir}", soft_wrap=True)
    out_console.print(
        f"wrote {len(report.paths)} report files under {result.run_dir} (tables/, plots/)",
        soft_wrap=True,
    )
    skipped = f"; {result.skipped} already done" if result.skipped else ""
    out_console.print(
        f"{result.ran} trials in {result.wall_s:.1f} s ({result.trials_per_s:.1f} trials/s){skipped}"
    )
    if report.problems:
        raise typer.Exit(EXIT_CONFIG)


# --------------------------------------------------------------------------- commands


def _version(value: bool) -> None:
    if value:
        # The installed distribution's version: importing atomix for __version__ would load
        # the whole runtime (the two agree; tests/test_cli.py checks it).
        from importlib.metadata import version

        typer.echo(f"atomix-tx {version('atomix-tx')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Atomix evaluation harness: run agent workloads under settlement modes with injected faults.

    Example: atomix run configs/synthetic_fault_class.yaml --trials 20
    """


@app.command(
    epilog="Example: atomix run configs/synthetic_fault_class.yaml --trials 20 --modes tx-full,no-tx --jobs 4"
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
    quiet: Quiet = False,
    executor: ExecutorChoice = "local",
    scheduler: Scheduler = None,
) -> None:
    """Run an experiment (every cell x trial x mode), then write and print its report.

    `atomix run --resume RUN_DIR` resumes a run from the config stored in it."""
    _check_executor(executor, scheduler, jobs)
    overrides = _overrides(trials, seed, modes)
    if config is None and resume is not None and set_:
        from harness.experiment.rundir import read_manifest

        try:
            raw = read_manifest(resume)["config"]
        except RunError as exc:
            _fail(str(exc))
    else:
        raw = _raw_config(config) if config is not None and set_ else {}
    extra, pinned = _run_sets(raw, set_)
    overrides.update(extra)
    cfg = _resolve(config, resume, overrides, pinned or None, _limits(max_cells, max_trials))
    sets = [arg for item in set_ or [] for arg in ("--set", item)]
    args = [
        "run", *sets, *_override_args(trials, seed, modes), *_limit_args(max_cells, max_trials),
        *_executor_args(executor, scheduler),
    ]
    _execute(
        args, config, cfg, jobs, out, resume, damaged.value, limit, quiet, executor, scheduler
    )


@app.command(
    epilog="Example: atomix sweep configs/synthetic_fault_class.yaml --set faults.rate=0,0.1,0.3 --set params.agents=1,4"
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
    grid = _parse_sets(set_ or [])
    overrides = _overrides(trials, seed, modes)
    cfg = _resolve(config, resume, overrides, grid or None, _limits(max_cells, max_trials))
    sets = [arg for item in set_ or [] for arg in ("--set", item)]
    args = [
        "sweep", *sets, *_override_args(trials, seed, modes), *_limit_args(max_cells, max_trials),
        *_executor_args(executor, scheduler),
    ]
    _execute(
        args, config, cfg, jobs, out, resume, damaged.value, limit, quiet, executor, scheduler
    )


@app.command(
    epilog="Example: atomix report results/synthetic/20250101-120000   (no argument: latest run of each config)"
)
def report(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="RUN_DIR",
            help="Run directories (or a config's directory: its latest run).",
            show_default=False,
        ),
    ] = None,
    results: Annotated[
        Path, typer.Option("--results", help="Where to look for runs when none is given.")
    ] = Path("results"),
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="Take the report section (tables, plots) from this config instead."
        ),
    ] = None,
) -> None:
    """Rebuild tables and plots from stored trial records only (no trial is re-run)."""
    report_from = _load(config) if config else None
    try:
        run_dirs = (
            [reporting.resolve_run(p) for p in runs] if runs else reporting.latest_runs(results)
        )
    except RunError as exc:
        _fail(str(exc))
    if not run_dirs:
        _fail(f"no runs under {results}/ (run one with: atomix run CONFIG.yaml)")
    failed = False
    for run_dir in run_dirs:
        result = _report(run_dir, report_from)
        _out().print(f"{run_dir}: wrote {len(result.paths)} files", soft_wrap=True)
        failed |= bool(result.problems)
    if failed:
        raise typer.Exit(EXIT_CONFIG)


@app.command(epilog="Example: atomix runs --out results")
def runs(
    out: Annotated[
        Path, typer.Option("--out", help="Results directory (as given to `atomix run --out`).")
    ] = Path("results"),
) -> None:
    """List past runs: config, start time, trials done/total, status (from manifests only;
    a run whose process was killed shows `interrupted`)."""
    # Only the standard-library run-directory module: listing must stay fast.
    from harness.experiment.rundir import list_runs

    found = list_runs(out)
    if not found:
        _fail(f"no runs under {out}/ (run one with: atomix run CONFIG.yaml)")
    table = RichTable(title=f"runs ({out})")
    for col in ("config", "run", "started (UTC)", "trials", "status"):
        table.add_column(col, justify="right" if col == "trials" else "left")
    for info in found:
        table.add_row(
            Text(info.config),
            Text(str(info.run_dir.relative_to(out) if info.run_dir.is_relative_to(out) else info.run_dir)),
            Text(info.started_at),
            Text(f"{info.done}/{info.planned}"),
            Text(info.status),
        )
    _out().print(table)


class CompareFormat(StrEnum):
    table = "table"
    md = "md"
    csv = "csv"
    tex = "tex"


@app.command(
    epilog="Example: atomix compare results/tau_retail --baseline tx-full --format tex"
)
def compare(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN_DIR",
            help="A run directory (or a config's directory: its latest run).",
            show_default=False,
        ),
    ],
    modes: Annotated[
        str | None,
        typer.Option(
            "--modes", help="Comma-separated modes (default: every mode of the run, config order)."
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="The mode every other is tested against (default: the first)."),
    ] = None,
    metric: Annotated[
        str,
        typer.Option(
            "--metric",
            help="A yes/no metric (exact McNemar) or a numeric one (Wilcoxon signed-rank).",
        ),
    ] = "clean",
    fmt: Annotated[
        CompareFormat,
        typer.Option(
            "--format",
            help="What to print: a terminal table, or the md/csv/tex text (all three are written).",
        ),
    ] = CompareFormat.table,
) -> None:
    """Each mode against a baseline on paired trials (same cell, seed and trial): exact
    McNemar or Wilcoxon signed-rank, an interval on the difference, Holm-adjusted p."""
    # Imported here so that `atomix --version` does not pay for scipy and pandas.
    from harness.analysis import paired
    from harness.experiment.config import cell_id, expand_cells

    mode_list = _split(modes, "--modes") if modes else None
    try:
        run = reporting.load_run(reporting.resolve_run(run_dir))
        present = {str(r["mode"]) for r in run.records}
        if mode_list is None:
            # Config order, then modes the config no longer lists (sorted).
            mode_list = [m for m in run.config.modes if m in present]
            mode_list += sorted(present - set(mode_list))
        if baseline is not None and baseline not in present:
            raise ValueError(
                f"--baseline: mode {baseline!r} has no trials in {run.run_dir}; "
                f"it has: {sorted(present)}"
            )
        order = [cell_id(run.config, c) for c in expand_cells(run.config)]
        cmp = paired.paired_compare(
            run.records,
            metric,
            mode_list,
            baseline=baseline,
            cell_order=order,
            explicit_modes=modes is not None,
        )
    except (ConfigError, RunError, ValueError) as exc:
        _fail(str(exc))
    paths = paired.write_paired(cmp, run.run_dir / "tables")
    if fmt is CompareFormat.table:
        _out().print(paired.paired_rich(cmp))
        for path in paths:
            _out().print(f"wrote {path}", soft_wrap=True)
        return
    # Machine-readable text on stdout (pipe-able); where the files went on stderr.
    sys.stdout.write(paired.RENDERERS[fmt.value](cmp))
    for path in paths:
        _err().print(f"wrote {path}")


def _list_configs(configs: Path) -> RichTable:
    table = RichTable(title=f"configs ({configs})")
    from harness.experiment.config import load_config

    for col in ("name", "file", "description"):
        table.add_column(col)
    for path in sorted([*configs.glob("*.yaml"), *configs.glob("*.yml")]):
        # Each file is validated as `validate` would; a broken one is listed with its first
        # problem instead of stopping the listing.
        try:
            config = load_config(path)
            name, description = config.name or path.stem, config.description.strip()
        except ConfigError as exc:
            more = f" (+{len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
            name, description = path.stem, f"INVALID: {exc.problems[0]}{more}"
        except Exception as exc:  # noqa: BLE001 - listing must not die on one broken file
            name, description = path.stem, f"INVALID: {exc.__class__.__name__}: {exc}"
        table.add_row(Text(name), Text(path.name), Text(description))
    return table


def _list_modes() -> RichTable:
    from harness.modes.base import modes

    table = RichTable(title="modes")
    for col in ("name", "family", "description"):
        table.add_column(col)
    rank = {"atomix": 0, "baseline": 1, "ablation": 2}
    # sorted() is stable: within a family, modes keep their registry order.
    for info in sorted(modes().values(), key=lambda m: rank.get(m.family, 3)):
        table.add_row(Text(info.name), Text(info.family), Text(info.description))
    return table


def _list_workloads() -> RichTable:
    import importlib

    from harness.workloads import WORKLOADS

    table = RichTable(title="workloads")
    for col in ("name", "description"):
        table.add_column(col)
    for name, (module, cls) in sorted(WORKLOADS.items()):
        try:
            obj = getattr(importlib.import_module(module), cls)
            text = getattr(obj, "description", "") or (obj.__doc__ or "").strip().split("\n")[0]
        except Exception as exc:  # noqa: BLE001 - listing must not die on one broken workload
            text = f"(cannot import: {exc})"
        table.add_row(Text(name), Text(text))
    return table


def _list_faults() -> RichTable:
    from harness.world.faults import FAULTS

    table = RichTable(title="fault classes")
    for col in ("class", "where", "description"):
        table.add_column(col)
    for name, spec in FAULTS.items():
        table.add_row(
            Text(str(name)),
            Text(", ".join(sorted(p.value for p in spec.points))),
            Text(spec.description),
        )
    return table


@app.command("list", epilog="Example: atomix list modes")
def list_(
    what: Annotated[
        str | None,
        typer.Argument(
            metavar="WHAT",
            help="configs, modes, workloads or faults (default: all four).",
            show_default=False,
        ),
    ] = None,
    configs: Annotated[
        Path | None,
        typer.Option(
            "--configs",
            help="Directory of experiment configs (default: ./configs, else the repo's).",
        ),
    ] = None,
) -> None:
    """List experiment configs, modes, workloads and fault classes."""
    if configs is None:
        configs = (
            Path("configs")
            if Path("configs").is_dir()
            else Path(__file__).resolve().parent / "configs"
        )
    if what is not None and what not in LIST_KINDS:
        raise typer.BadParameter(f"{what!r}; allowed: {', '.join(LIST_KINDS)}", param_hint="WHAT")
    makers = {
        "configs": lambda: _list_configs(configs),
        "modes": _list_modes,
        "workloads": _list_workloads,
        "faults": _list_faults,
    }
    for kind in [what] if what else LIST_KINDS:
        _out().print(makers[kind]())


@app.command(
    epilog="Example: atomix reproduce --quick --tables 6,16 --out results/reproduction"
)
def reproduce(
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="N per cell and mode = a fifth of each config's trials, at least 20 (at most "
            "the config's own); default: each config's own N.",
        ),
    ] = False,
    tables_: Annotated[
        str | None,
        typer.Option(
            "--tables", help="Comma-separated paper tables (default: all, 1-3 and 5-21)."
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Where runs go (OUT/<config>/<run-id>; finished ones are reused, unfinished "
            "ones resumed) and where REPRODUCTION.md is written.",
        ),
    ] = Path("results/reproduction"),
    jobs: Jobs = None,
    configs: Annotated[
        Path | None,
        typer.Option(
            "--configs",
            help="Directory of experiment configs (default: ./configs, else the repo's).",
        ),
    ] = None,
) -> None:
    """Run the configs that map the paper's result tables, then write OUT/REPRODUCTION.md:
    each paper cell beside ours, with our 95% interval and N, a verdict (reproduced,
    differs, not comparable) and, for a difference, its explanation by mechanism."""
    from harness.experiment.interrupts import exit_code
    from harness.experiment.rundir import RunIOError
    from harness.paper import reproduce as rp

    wanted = None
    if tables_ is not None:
        try:
            wanted = rp.parse_tables(tables_)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--tables") from None
    if configs is None:
        configs = (
            Path("configs")
            if Path("configs").is_dir()
            else Path(__file__).resolve().parent / "configs"
        )
    if not configs.is_dir():
        raise typer.BadParameter(f"{configs}: not a directory", param_hint="--configs")
    command = ["atomix", "reproduce", *(["--quick"] if quick else [])]
    command += [*(["--tables", ",".join(map(str, wanted))] if wanted else []), "--out", str(out)]
    try:
        outcome = rp.reproduce(
            wanted=wanted,
            quick=quick,
            out=out,
            jobs=jobs or _jobs_default(),
            configs_dir=configs,
            command=shlex.join(command),
            say=lambda line: _err().print(Text(line), soft_wrap=True),
        )
    except RunIOError as exc:
        _fail(f"{exc}; finished trials are kept: run the same command again to resume", EXIT_DISK)
    except (ConfigError, RunError) as exc:
        _fail(str(exc))
    except KeyboardInterrupt as exc:
        _fail(
            f"interrupted: finished trials are kept under {out}; run the same command again "
            "to resume",
            exit_code(exc),
        )
    counts = {rp.REPRODUCED: 0, rp.DIFFERS: 0, rp.UNEXPLAINED: 0, rp.NOT_COMPARABLE: 0}
    for section in outcome.sections:
        if not section.variant:
            for kind, n in section.counts().items():
                counts[kind] += n
    _out().print(
        f"wrote {outcome.path}: {counts[rp.REPRODUCED]} cells reproduced, "
        f"{counts[rp.DIFFERS]} differ ({counts[rp.UNEXPLAINED]} unexplained), "
        f"{counts[rp.NOT_COMPARABLE]} not comparable; {outcome.wall_s:.0f} s wall, "
        f"{outcome.cpu_s:.0f} s CPU",
        soft_wrap=True,
    )


@app.command(epilog="Example: atomix validate configs/synthetic_fault_class.yaml")
def validate(
    config: ConfigArg, max_cells: MaxCells = None, max_trials: MaxTrials = None
) -> None:
    """Validate a config and summarise what it would run."""
    info = reporting.summary(_load(config, limits=_limits(max_cells, max_trials)))
    table = RichTable(title=f"{config}: valid", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    cells = info["cells"]
    shown = (
        ", ".join(cells)
        if len(cells) <= 12
        else ", ".join(cells[:12]) + f", ... ({len(cells) - 12} more)"
    )
    rows = [
        ("name", info["name"]),
        ("workload", info["workload"]),
        ("modes", ", ".join(info["modes"])),
        ("cells", f"{len(cells)}: {shown}"),
        ("trials", f"{info['trials']} per cell and mode"),
        ("total", f"{info['total']} trials"),
        ("tables", ", ".join(info["tables"])),
    ]
    for key, value in rows:
        table.add_row(key, Text(str(value)))
    _out().print(table)


EXIT_UNFINISHED = 1


@app.command(
    epilog="Example: atomix recover ./atomix-log",
    help=(
        "Finish the committed transactions a dead program left in its durable log (each "
        "missing effect delivered once, by key), abort the rest, and say what needs a human."
        "\n\n"
        "Effects of the built-in adapters (files, SQLite rows, mail) are redone from the log "
        "alone; a user tool's effect needs the program's tools: it is reported as pending, and "
        "the program finishes it with rt.recover()."
        "\n\n"
        "Exit codes: 0 nothing left to do; 1 something is pending or needs a human; 2 no usable "
        "log at LOGDIR, or it is in use by a live process."
    ),
)
def recover(
    logdir: Annotated[
        Path,
        typer.Argument(
            metavar="LOGDIR",
            help="The durable log's directory (what the program passed as Runtime(log=...)).",
            show_default=False,
        ),
    ],
) -> None:
    """Recover a durable log (see the command's help)."""
    from atomix.log import LogError
    from atomix.recovery import recover as recover_log

    try:
        report = recover_log(logdir)
    except LogError as exc:
        _fail(f"atomix recover: {exc}")
    for line in report.lines():
        _out().print(Text(line), soft_wrap=True)
    if not report.clean:
        raise typer.Exit(EXIT_UNFINISHED)


@app.command(
    "mcp-proxy",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="--policy POLICY.yaml [--log DIR] -- SERVER_COMMAND...",
    epilog="Example: atomix mcp-proxy --policy policy.yaml -- python my_server.py --flag",
    help=(
        "Serve MCP on stdin/stdout in front of another MCP server (the command after `--`), "
        "settling its tool calls in Atomix transactions as POLICY says: irreversible calls "
        "wait at a gate until commit, reversible ones are compensated at abort."
        "\n\n"
        "Exit codes: 0 the client disconnected; 2 a bad policy (or one that does not fit the "
        "server's tools), or the server did not start; 128+N stopped by signal N (after "
        "settling as on_session_end says). See docs/mcp-proxy.md."
    ),
)
def mcp_proxy(
    ctx: typer.Context,
    policy: Annotated[
        Path,
        typer.Option(
            "--policy", metavar="POLICY.yaml", help="The proxy's policy file.", show_default=False
        ),
    ],
    log: Annotated[
        Path | None,
        typer.Option(
            "--log",
            metavar="DIR",
            help="A durable transaction log directory (Runtime(log=DIR)).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Front an MCP server with transactional tool calls (see the command's help)."""
    from atomix.integrations.mcp_proxy import PolicyError, ProxyStartError, load_policy, run_proxy

    command = list(ctx.args)
    if not command:
        _fail(
            "atomix mcp-proxy: no upstream server command; put it after `--`: "
            "atomix mcp-proxy --policy POLICY.yaml -- SERVER_COMMAND..."
        )
    try:
        code = run_proxy(load_policy(policy), policy, command, log_dir=log)
    except (PolicyError, ProxyStartError) as exc:
        _fail(f"atomix mcp-proxy: {exc}")
    raise typer.Exit(code)


@app.command(epilog="Example: atomix show results/tau_retail/<run-id> saga/fp=0.3/4")
def show(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN",
            help="A run directory (see `atomix runs`), or a config's results directory for its "
            "latest run.",
            show_default=False,
        ),
    ],
    trial: Annotated[
        str | None,
        typer.Argument(
            metavar="TRIAL",
            help="Line number in trials.jsonl, the trial's key, or a part of the key that only "
            "one trial has. Without it: list the run's trials.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show one trial's timeline: each call the substrates saw, the faults injected, and how
    each agent settled. The trial is replayed from the run's config and checked against its
    stored record."""
    from harness.analysis.show import (
        ShowError,
        find_trial,
        records_of,
        render,
        replay,
        resolve,
        summary,
    )

    try:
        run_dir = resolve(run_dir)
        records = records_of(run_dir)
        if trial is None:
            lines = summary(records)
        else:
            lines = render(replay(run_dir, find_trial(records, trial)))
    except ShowError as exc:
        _fail(f"atomix show: {exc}")
    except ConfigError as exc:
        _fail(f"atomix show: {exc}")
    for line in lines:
        _out().print(Text(line), soft_wrap=True)


if __name__ == "__main__":
    app()

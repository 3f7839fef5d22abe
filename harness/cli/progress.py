"""Progress of a run on stderr: a rich bar on a terminal, plain lines in a pipe or a log,
and a one-time estimate of a long run. A run whose agent is a real model also prints a line
per request to the model server (step k of max_steps, tokens and tokens per second, a
waiting request every 15 s, a time-out): above the bar on a terminal, plain in a pipe;
--quiet prints none."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from harness.cli.common import stderr

if TYPE_CHECKING:
    from rich.progress import Progress

    from harness.experiment.config import ExperimentConfig
    from harness.experiment.runner import RunResult

#: Plain progress lines (stderr not a terminal): none before this many seconds, then one
#: per 5% of the trials (at most one a second) or every PROGRESS_EVERY_S seconds.
PROGRESS_QUIET_S = 2.0
PROGRESS_EVERY_S = 10.0
#: The time estimate: measured over the first ESTIMATE_AFTER_S seconds (or trials) of the
#: session, printed once when the rest would take longer than ESTIMATE_OVER_S.
ESTIMATE_AFTER_S = 3.0
ESTIMATE_AFTER_TRIALS = 200
ESTIMATE_OVER_S = 60.0


def duration(seconds: float) -> str:
    """`42 s`, `12 min` or `3 h 5 min`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


class Watch:
    """Progress of a run on stderr when it is not a terminal (plain lines) and the one-time
    estimate of a long run; `say` prints a line (through the bar's console on a terminal)."""

    def __init__(
        self, name: str, jobs: int, say: Callable[[str], None], lines: bool, estimate: bool
    ) -> None:
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
            # The first report is where this session starts (a resumed run has trials done).
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
                    f"{todo:,} trials, about {duration(todo / rate)} at ~{rate:,.0f} trials/s "
                    f"on {workers} (estimate from the first {ran:,} trials; about "
                    f"{duration(left)} left)"
                )
        if not self.lines or total <= 0:
            return
        step = done * 20 // total  # 5% steps
        due = now - self.last_line >= PROGRESS_EVERY_S or (
            step > self.last_step and now - self.last_line >= 1.0
        )
        finished = done >= total and self.printed
        if finished or (due and elapsed >= PROGRESS_QUIET_S):
            eta = f", ETA {duration(left)}" if done < total else ""
            self.say(
                f"{self.name}: {done:,}/{total:,} trials ({100 * done / total:.0f}%), "
                f"{rate:,.0f} trials/s{eta}"
            )
            self.printed, self.last_line, self.last_step = True, now, step


def progress_bar() -> Progress:
    """The rich bar of a run on a terminal: done/total trials, trials/s, time left."""
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


def run_with_progress(
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
    overrides: dict[str, Any] | None = None,
    tasks: list[str] | None = None,
) -> RunResult:
    """Run with a rich bar on a terminal, plain progress lines otherwise, none if quiet;
    `started` gets the run directory as soon as it exists; `overrides` go to the manifest;
    `tasks` selects trials by task id (`--tasks`)."""
    terminal = sys.stderr.isatty()
    with progress_bar() if terminal and not quiet else contextlib.nullcontext() as bar:
        console = bar.console if bar is not None else stderr()
        task: list[Any] = []

        def say(text: str, style: str | None = None) -> None:
            console.print(Text(text, style=style or ""), soft_wrap=True)

        watch = Watch(
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

        with _request_lines(config, say, quiet):
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
                overrides=overrides,
                tasks=tasks,
            )


@contextlib.contextmanager
def _request_lines(
    config: ExperimentConfig, say: Callable[[str], None], quiet: bool
) -> Iterator[None]:
    """While a kind-llm run runs (and not quiet), every request to the model server is a
    line (harness.agents.llm.RequestEvent); forked workers inherit the callback."""
    if quiet or config.agent.kind != "llm":
        yield
        return
    from harness.agents.llm import RequestEvent, set_request_progress

    name = config.name or "run"

    def line(event: RequestEvent) -> None:
        if event.phase != "start":  # the answer's own line says the rest
            say(f"{name}: {event.line()}")

    set_request_progress(line)
    try:
        yield
    finally:
        set_request_progress(None)

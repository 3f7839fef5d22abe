"""Reading results: `report`, `runs`, `compare` and `show`."""

from __future__ import annotations

import dataclasses
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table as RichTable
from rich.text import Text

from harness.cli.common import (
    EXIT_CONFIG,
    EXIT_DISK,
    fail,
    flag_error,
    load_checked,
    stderr,
    stdout,
)
from harness.errors import ConfigError, RunError

if TYPE_CHECKING:
    from harness.analysis.runs import Report, Run
    from harness.analysis.table import Table
    from harness.experiment.config import ExperimentConfig

commands = typer.Typer()


def print_table(table: Table) -> None:
    """Print a report table; one too wide for the terminal is shown with cells as rows."""
    from rich.measure import Measurement

    from harness.analysis.render import to_rich

    console = stdout()
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
        chunks: list[list[Any]] = [[]]
        for col in display.columns:
            if chunks[-1] and not fits(display[[*chunks[-1], col]]):
                chunks.append([])
            chunks[-1].append(col)
        return chunks

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


def print_verdicts(run: Run, result: Report) -> None:
    """Under the main table: each mode against the baseline per cell (harness.analysis.verdicts),
    written to tables/ too; a metric the paired tests cannot take is a note, not a failure."""
    from harness.analysis.verdicts import run_verdicts, verdicts_rich, write_verdicts
    from harness.experiment.rundir import io_error

    try:
        block = run_verdicts(run)
    except ValueError as exc:
        stderr().print(Text(f"note: no paired verdicts: {exc}", style="yellow"), soft_wrap=True)
        return
    if block is None:
        return
    try:
        result.paths += write_verdicts(block, run.run_dir / "tables")
    except OSError as exc:
        fail(str(io_error(run.run_dir, exc, "cannot write the report:")), EXIT_DISK)
    stdout().print()
    stdout().print(verdicts_rich(block))


def write_report(run_dir: Path, report_from: ExperimentConfig | None = None) -> Report:
    """Write a run's report files and print its main table, damaged lines and problems;
    exit 1 if the disk refuses, 2 if the run or config is unusable."""
    from harness.analysis.runs import load_run, write_run_report
    from harness.experiment.rundir import RunIOError, damaged_summary, io_error

    try:
        run = load_run(run_dir, report_from)
    except RunIOError as exc:
        fail(str(exc), EXIT_DISK)
    except (ConfigError, RunError) as exc:
        fail(str(exc))
    if run.damaged:
        # The report is built from the whole records; the damaged lines are named, not fatal.
        stderr().print(
            Text(
                f"{run_dir}/trials.jsonl: {damaged_summary(run.damaged)}: left out of the "
                "report; resuming the run moves them aside and runs their trials again",
                style="yellow",
            ),
            soft_wrap=True,
        )
    try:
        result = write_run_report(run)
    except OSError as exc:
        fail(str(io_error(run_dir, exc, "cannot write the report:")), EXIT_DISK)
    if result.main is not None:
        print_table(result.main)
        print_verdicts(run, result)
    if run.status != "complete":
        stderr().print(
            Text(
                f"note: run is {run.status}: {len(run.records)} of {run.planned} trials",
                style="yellow",
            )
        )
    for problem in result.problems:
        stderr().print(Text(f"{run_dir}: {problem}", style="red"))
    return result


@commands.command(
    "report",
    short_help="Rebuild a run's tables and plots from its stored records.",
    epilog="Example: atomix report results/synthetic/20250101-120000   (no argument: latest run of each config)",
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
    report_from = load_checked(config) if config else None
    from harness.analysis.runs import latest_runs, resolve_run

    try:
        run_dirs = [resolve_run(p) for p in runs] if runs else latest_runs(results)
    except RunError as exc:
        fail(str(exc))
    if not run_dirs:
        fail(f"no runs under {results}/ (run one with: atomix run CONFIG.yaml)")
    failed = False
    for run_dir in run_dirs:
        result = write_report(run_dir, report_from)
        stdout().print(f"{run_dir}: wrote {len(result.paths)} files", soft_wrap=True)
        failed |= bool(result.problems)
    if failed:
        raise typer.Exit(EXIT_CONFIG)


@commands.command(
    "runs",
    short_help="List past runs: progress, limits, overrides, sweep keys.",
    epilog="Example: atomix runs --out results",
)
def runs(
    out_dir: Annotated[
        Path, typer.Option("--out", help="Results directory (as given to `atomix run --out`).")
    ] = Path("results"),
) -> None:
    """List past runs, oldest first: config and run id, status, start time, trials done of
    the whole plan (a run made with --limit or --tasks says so and reads `partial`), wall
    time, revision, the overrides it was run with, its sweep keys and any retried trials.

    Read from manifests only; a run whose process was killed shows `interrupted`."""
    # Only standard-library modules: listing must stay fast.
    from rich.padding import Padding

    from harness.experiment.runlist import list_summaries, value_text

    found = list_summaries(out_dir)
    if not found:
        fail(f"no runs under {out_dir}/ (run one with: atomix run CONFIG.yaml)")
    console = stdout()
    console.print(Text(f"Runs under {out_dir}/ (oldest first)", style="bold"))
    styles = {"complete": "green", "partial": "yellow", "interrupted": "red", "running": "cyan"}
    for info in found:
        where = info.run_dir
        name = str(where.relative_to(out_dir) if where.is_relative_to(out_dir) else where)
        console.print()
        head = Text(name, style="bold")
        head.append("  ")
        head.append(info.shown_status, style=styles.get(info.shown_status, "red"))
        console.print(head)
        started = info.started_at.replace("T", " ")[:16]
        facts = [f"started {started} UTC" if info.started_at != "?" else "start unknown"]
        trials = f"{info.done}/{info.total} trials"
        facts.append(trials + (f" ({info.subset})" if info.subset else ""))
        if info.wall_s is not None:
            facts.append(f"took {info.wall_s:.1f} s")
        if info.revision:
            facts.append(f"rev {info.revision}")
        lines = [", ".join(facts)]
        if info.overrides:
            shown = ", ".join(f"{k}={value_text(v)}" for k, v in info.overrides.items())
            lines.append(f"overrides: {shown}")
        if info.sweep:
            shown = "; ".join(f"{k}={value_text(v)}" for k, v in info.sweep.items())
            lines.append(f"sweep: {shown}")
        if info.retries:
            lines.append(f"retried: {info.retries} errored trial(s) (--retry-failed)")
        for line in lines:
            console.print(Padding(Text(line), (0, 0, 0, 2)))


class CompareFormat(StrEnum):
    table = "table"
    md = "md"
    csv = "csv"
    tex = "tex"


@commands.command(
    "compare",
    short_help="Compare modes, or two runs, on paired trials with verdicts.",
    epilog="Example: atomix compare results/tau_retail --baseline tx-full --format tex; "
    "atomix compare RUN_A RUN_B --metric goal",
)
def compare(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN_A",
            help="A run directory (or a config's directory: its latest run).",
            show_default=False,
        ),
    ],
    run_b: Annotated[
        Path | None,
        typer.Argument(
            metavar="[RUN_B]",
            help="A second run of the same workload: compare RUN_B against RUN_A, trial by "
            "trial (same mode, cell and trial index) instead of modes within RUN_A.",
            show_default=False,
        ),
    ] = None,
    modes: Annotated[
        str | None,
        typer.Option(
            "--modes", help="Comma-separated modes (default: every mode of the run, config order)."
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="The mode every other is tested against (default: the first); one run only.",
        ),
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
            help="What to print: a terminal table, or the md/csv/tex text (for one run, all "
            "three are written to its tables/).",
        ),
    ] = CompareFormat.table,
) -> None:
    """Test each mode against a baseline on paired trials (same cell, seed and trial), or
    RUN_B against RUN_A on the same (mode, cell, trial): exact McNemar or Wilcoxon
    signed-rank, an interval on the difference, Holm-adjusted p, and a verdict line."""
    # Imported here so that `atomix --version` does not pay for scipy and pandas.
    from harness.experiment.overrides import split_list

    try:
        mode_list = split_list(modes, "--modes") if modes else None
    except ValueError as exc:
        raise flag_error(exc) from None
    if run_b is not None:
        if baseline is not None:
            raise typer.BadParameter(
                "--baseline picks a mode within one run; with two runs every mode of RUN_B "
                "is tested against the same mode of RUN_A",
                param_hint="--baseline",
            )
        _compare_runs(run_dir, run_b, mode_list, metric, fmt)
        return
    from harness.analysis import paired, paired_render
    from harness.analysis.compare_runs import _better
    from harness.analysis.compare_text import Item, legend, render
    from harness.analysis.runs import load_run, resolve_run
    from harness.experiment.cells import cell_id, expand_cells

    try:
        run = load_run(resolve_run(run_dir))
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
        fail(str(exc))
    paths = paired_render.write_paired(cmp, run.run_dir / "tables")
    if fmt is CompareFormat.table:
        better = _better(run, metric)
        items = [
            Item(r.cell, r.mode, r, paired.verdict(r, better=better)) for r in cmp.rows
        ]
        lines = [f"Verdicts against {cmp.baseline} ({metric}, Holm, alpha 0.05):"]
        width = max(len(m) for m in cmp.modes[1:])
        for mode in cmp.modes[1:]:
            mine = [it.verdict for it in items if it.label == mode]
            lines.append(f"  {mode.ljust(width)}  {_tally(mine)}")
        console = stdout()
        console.print(
            render(
                cmp, items, console.width, title=cmp.title, label_header="mode",
                levels_header="base → mode",
                legend=legend(cmp, f"base ({cmp.baseline})", "the mode", "(cell, seed, trial)"),
                verdict_lines=lines,
            )  # fmt: skip
        )
        for path in paths:
            console.print(f"wrote {path}", soft_wrap=True)
        return
    # Machine-readable text on stdout (pipe-able); where the files went on stderr.
    sys.stdout.write(paired_render.RENDERERS[fmt.value](cmp))
    for path in paths:
        stderr().print(f"wrote {path}")


def _tally(verdicts: list[str]) -> str:
    """`better on 1 of 3 cells, worse on 0, no evidence on the rest`."""
    better, worse = verdicts.count("better"), verdicts.count("worse")
    idle = sum(1 for v in verdicts if v not in ("better", "worse", "no evidence"))
    text = (
        f"better on {better} of {len(verdicts)} cells, worse on {worse}, no evidence on the rest"
    )
    return text + (f" ({idle} not exercised)" if idle else "")


def _compare_runs(
    path_a: Path, path_b: Path, modes: list[str] | None, metric: str, fmt: CompareFormat
) -> None:
    """`compare RUN_A RUN_B`: RUN_B against RUN_A on the same (mode, cell, trial)."""
    from harness.analysis import paired_render
    from harness.analysis.compare_runs import ALPHA, compare_runs
    from harness.analysis.compare_text import Item, legend, render
    from harness.analysis.runs import load_run, resolve_run

    try:
        dir_a, dir_b = resolve_run(path_a), resolve_run(path_b)
        if dir_a.resolve() == dir_b.resolve():
            raise ValueError(f"RUN_A and RUN_B are the same run ({dir_a}): nothing to compare")
        result = compare_runs(load_run(dir_a), load_run(dir_b), metric, modes)
    except (ConfigError, RunError, ValueError) as exc:
        fail(str(exc))
    cmp = result.comparison
    if fmt is not CompareFormat.table:
        sys.stdout.write(paired_render.RENDERERS[fmt.value](cmp))
        return
    items = []
    for row, v in zip(result.rows, result.verdicts, strict=True):
        mode, cell = result.split(row)
        items.append(Item(mode, cell, row, v))
    groups = list(dict.fromkeys(it.group for it in items))
    per_mode = [f"Per mode, RUN_B against RUN_A ({metric}, Holm, alpha {ALPHA:g}):"]
    width = max(len(m) for m in groups)
    for mode in groups:
        mine = [it.verdict for it in items if it.group == mode]
        per_mode.append(f"  {mode.ljust(width)}  {_tally(mine)}")
    counts = result.counts()
    total = len(result.verdicts)
    final = (
        f"RUN_B vs RUN_A: better on {counts['better']} of {total} cells (mode x cell), worse on "
        f"{counts['worse']}, no evidence on the rest"
        + (f" ({counts['not exercised']} not exercised)" if counts["not exercised"] else "")
        + f" ({metric}, Holm, alpha {ALPHA:g})."
    )
    console = stdout()
    console.print(Text(f"RUN_A = {dir_a}", style="bold"), soft_wrap=True)
    console.print(Text(f"RUN_B = {dir_b}", style="bold"), soft_wrap=True)
    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    console.print(
        render(
            cmp, items, console.width,
            title=f"{metric}: RUN_B against RUN_A, per mode and cell, on paired trials",
            label_header="cell",
            levels_header="A → B",
            legend=legend(cmp, "RUN_A", "RUN_B", "(mode, cell, trial index)"),
            verdict_lines=[*per_mode, final] if len(per_mode) > 1 else [final],
        )  # fmt: skip
    )


@commands.command(
    "show",
    short_help="Show one trial's timeline, replayed from the run's config.",
    epilog="Example: atomix show results/tau_retail/<run-id> saga/fp=0.3/4")
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
    except (ShowError, ConfigError) as exc:
        fail(f"atomix show: {exc}")
    for line in lines:
        stdout().print(Text(line), soft_wrap=True)

"""`atomix reproduce`: run the configs that map the paper's result tables, then write
REPRODUCTION.md, the paper's cells beside ours with a verdict for each.

The comparison is generated from data only: the paper's cells (``harness/experiment/paper_cells.csv``),
each config's ``paper:`` section (``mapping``: which paper row is which of our modes and
cells, which paper column is which statistic of which metric), the trial records of the
runs (``measure``), and the notes file (``harness/paper/paper_notes.yaml``) that explains,
by mechanism, why a cell differs (``judge``, which also holds the verdict rule). Timings are
measured by a benchmark instead (``timing``); ``render`` writes the file.

This module decides which configs run and how: a finished run of the same config under the
output directory is reused, an unfinished one resumed, a config whose agent is a real model
is never started from here, and a config whose agent kind needs a package that is not
installed is skipped with one line saying what to install. ``--quick`` runs every config
with N = ``quick_trials(trials)`` (see ``mapping``).

After the paper's tables come three sections of our own: the retry budgets of every run
(``budgets``), and, when every table is reproduced (no ``--tables``), the claims table
(``claims``, its runs under ``OUT/claims``) and the sensitivity of the headline verdicts to
the llm-like agent's weights for ``SENSITIVITY_CONFIGS`` (``harness.analysis.sensitivity``),
and the results of configs with no paper table (``harness.paper.beyond``: tau2 airline).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.analysis.runs import KNOWN_METRICS, load_run, runs_of
from harness.analysis.sensitivity import SensitivityError, run_sensitivity, sensitivity_markdown
from harness.errors import ConfigError, RunError
from harness.experiment import runner
from harness.experiment.config import ExperimentConfig, config_hash, load_config
from harness.experiment.paper_cells import tables
from harness.experiment.paper_section import paper_problems
from harness.experiment.rundir import read_manifest, settle_status
from harness.experiment.trial import run_trial
from harness.paper.beyond import beyond_paper_markdown
from harness.paper.budgets import budgets_markdown
from harness.paper.claims import claims_markdown, run_claims
from harness.paper.judge import (
    DIFFERS,
    NOT_COMPARABLE,
    NOTES_PATH,
    REPRODUCED,
    UNEXPLAINED,
    Section,
    compare_table,
    load_notes,
    note_config_problems,
)
from harness.paper.mapping import Source, config_files, overlap_problems, parse_tables, sources
from harness.paper.measure import Measurer
from harness.paper.render import render, write_reproduction
from harness.paper.timing import BENCHMARKS, benchmark_section, run_benchmark
from harness.registry import did_you_mean

#: The configs whose paired verdicts the sensitivity section re-runs under other agent weights.
SENSITIVITY_CONFIGS: tuple[str, ...] = ("tau_retail", "tau_retail_notify")

__all__ = [
    # The verdicts and the --tables parser, for the command that calls `reproduce`.
    "DIFFERS",
    "NOT_COMPARABLE",
    "REPRODUCED",
    "UNEXPLAINED",
    "SENSITIVITY_CONFIGS",
    "Outcome",
    "check_all",
    "ensure_run",
    "parse_tables",
    "reproduce",
]


@dataclass
class Outcome:
    """What `reproduce` did: the file it wrote, the sections (one primary per table, then
    its variants) and the time it took."""

    path: Path
    sections: list[Section]
    runs: dict[str, Path]
    wall_s: float
    cpu_s: float


def _cpu_s() -> float:
    # Workers are child processes: their CPU counts too, once they have been waited for.
    own = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


# --------------------------------------------------------------------------- running


def _existing_run(config: ExperimentConfig, out: Path) -> tuple[Path, str] | None:
    """The latest run of `config` under `out` with this very config (same hash), and its
    status: `complete` only when it ran every trial (a run made with --limit has not)."""
    base = Path(out) / (config.name or "experiment")
    if not base.is_dir():
        return None
    digest = config_hash(config)
    for run_dir in reversed(runs_of(base)):
        try:
            manifest = read_manifest(run_dir)
        except RunError:
            continue
        if manifest.get("config_hash") == digest:
            status = settle_status(run_dir, manifest)
            return run_dir, "limited" if "limit" in manifest and status == "complete" else status
    return None


def ensure_run(
    config: ExperimentConfig,
    out: Path,
    jobs: int,
    say: Callable[[str], None] = lambda _: None,
) -> Path:
    """A complete run of `config` under `out`: the finished one there if any, else the
    unfinished one resumed, else a new one. Raises RunError (e.g. another process owns it)."""
    name = config.name or "experiment"
    found = _existing_run(config, out)
    total = len(runner.plan(config))
    if found is not None and found[1] == "complete":
        say(f"{name}: finished run {found[0]} reused ({total} trials)")
        return found[0]
    resume = found[0] if found is not None else None
    verb = f"resuming {resume}" if resume else "new run"
    say(f"{name}: {total} trials, N = {config.trials} per cell and mode ({verb})")
    result = runner.run(config, out=Path(out), jobs=jobs, resume=resume)
    say(f"{name}: {result.ran} trials in {result.wall_s:.1f} s -> {result.run_dir}")
    return result.run_dir


# --------------------------------------------------------------------------- reproduce


def reproduce(
    *,
    wanted: Sequence[int] | None = None,
    quick: bool = False,
    out: Path = Path("results/reproduction"),
    jobs: int = 1,
    configs_dir: Path = Path("configs"),
    notes_path: Path = NOTES_PATH,
    command: str = "atomix reproduce",
    say: Callable[[str], None] = lambda _: None,
    extras: bool | None = None,
) -> Outcome:
    """Run (or reuse, or resume) every config that maps a wanted table under `out`, then
    write `out/REPRODUCTION.md`. ConfigError for a bad config, mapping or notes file (before
    any trial runs), RunError when a run cannot start or resume. `extras` (default: when no
    table subset is `wanted`) adds the claims and sensitivity sections, which run their own
    trials."""
    start_wall, start_cpu = time.perf_counter(), _cpu_s()
    if extras is None:
        extras = wanted is None
    wanted = sorted(set(wanted or tables()))
    notes = load_notes(notes_path)
    skipped: dict[Path, tuple[str, str]] = {}
    srcs = sources(configs_dir, wanted, quick, skipped=skipped)
    not_run: dict[str, str] = {}
    for path, (name, why) in skipped.items():
        not_run[name] = f"skipped: {why}"
        say(f"{name} ({path}): skipped, {why}")
    problems = overlap_problems(srcs)
    names: dict[str, Path] = {}
    for src in srcs:
        if src.name in names:
            problems.append(f"{src.path}: name {src.name!r} is also the name of {names[src.name]}")
        names.setdefault(src.name, src.path)
    if problems:
        raise ConfigError(configs_dir, problems)
    for src in srcs:
        metric_problems = _metric_problems(src)
        if metric_problems:
            raise ConfigError(src.path, metric_problems)
    out = Path(out)
    runs: dict[str, tuple[Path, ExperimentConfig]] = {}
    measurers: dict[str, Measurer] = {}
    for src in srcs:
        if src.config.agent.kind == "llm":
            # A real model needs its server: never started from here, but a finished run
            # made with `atomix run CONFIG --out OUT` is used.
            found = _existing_run(src.config, out)
            if found is None or found[1] != "complete":
                trials = f" --trials {src.config.trials}" if quick else ""
                not_run[src.name] = (
                    "its agent is a real model (agent.kind llm), which needs a model server; "
                    f"run `atomix run {src.path}{trials} --out {out}` first"
                )
                say(f"{src.name}: not run ({not_run[src.name]})")
                continue
        run_dir = ensure_run(src.config, out, jobs, say)
        runs[src.name] = (run_dir, src.config)
        measurers[src.name] = Measurer(load_run(run_dir).records)
    sections: list[Section] = []
    measured: dict[str, str] = {}
    for table in wanted:
        if table in BENCHMARKS:
            bench = BENCHMARKS[table]
            path, data = run_benchmark(bench, out, quick, say)
            machine = data["machine"]
            shown = path.relative_to(out) if path.is_relative_to(out) else path
            measured[bench.name] = (
                f"`{shown}`: {data['date']}, Python {machine['python']}, {machine['cpus']} CPUs "
                f"({machine['processor']}), load average {machine['load_average']} before and "
                f"{data['load_average_after']} after"
            )
            sections.append(benchmark_section(bench, data, notes))
            continue
        sections.append(compare_table(table, srcs, measurers, notes, not_run=not_run))
        for src in srcs:
            if any(e.variant for _, e in src.entries(table)):
                sections.append(
                    compare_table(table, srcs, measurers, notes, variant=src, not_run=not_run)
                )
    appendix = [budgets_markdown([runs[name][1] for name in sorted(runs)])] if runs else []
    if extras:
        appendix += _extra_sections(out, quick, jobs, configs_dir, say)
    wall, cpu = time.perf_counter() - start_wall, _cpu_s() - start_cpu
    text = render(
        sections,
        runs,
        command=command,
        quick=quick,
        out=out,
        wall_s=wall,
        cpu_s=cpu,
        not_run=not_run,
        benchmarks=measured,
        appendix=appendix,
    )
    path = write_reproduction(out, text)
    return Outcome(path, sections, {k: v[0] for k, v in runs.items()}, wall, cpu)


def _extra_sections(
    out: Path, quick: bool, jobs: int, configs_dir: Path, say: Callable[[str], None]
) -> list[str]:
    """The claims section and the sensitivity sections, as Markdown."""
    say("claims: tx-full against each ablation")
    claims = run_claims(
        quick=quick, out=out / "claims", jobs=jobs, configs_dir=configs_dir,
        command=f"atomix claims{' --quick' if quick else ''} --out {out / 'claims'}", say=say,
    )
    sections = [claims_markdown(claims, level=2)]
    parts = [
        "## Sensitivity of the verdicts to the agent's weights",
        "",
        "Does a headline verdict depend on the llm-like agent's assumed weights? Each config "
        "below was re-run under other weights on the same trials.",
        "",
    ]
    for name in SENSITIVITY_CONFIGS:
        say(f"sensitivity: {name}")
        try:
            result = run_sensitivity(configs_dir / f"{name}.yaml", quick=quick, jobs=jobs, say=say)
        except SensitivityError as exc:
            raise RunError(f"sensitivity of {name}: {exc}") from None
        parts.append(sensitivity_markdown(result, level=3))
    sections.append("\n".join(parts))
    sections.append(beyond_paper_markdown(out, jobs, configs_dir, quick, ensure_run, say))
    return sections


def _metric_problems(src: Source) -> list[str]:
    """Mapped columns whose metric no trial record has (one probe trial for a name that is
    not a known metric, as `check_report` does)."""
    named = [
        (i, label, col.metric)
        for i, entry in enumerate(src.config.paper)
        for label, col in entry.columns.items()
        if col.metric is not None
    ]
    unknown = [x for x in named if x[2] not in KNOWN_METRICS]
    if not unknown:
        return []
    metrics = sorted(run_trial(runner.plan(src.config)[0])["metrics"])
    return [
        f"paper.{i}.columns.{label}.metric: unknown metric {m!r}{did_you_mean(m, metrics)}; "
        f"allowed: {', '.join(metrics)}"
        for i, label, m in unknown
        if m not in metrics
    ]


def check_all(configs_dir: Path, notes_path: Path = NOTES_PATH) -> list[str]:
    """Every problem of every config's `paper:` section, of overlaps between them and of the
    notes file."""
    srcs: list[Source] = []
    problems: list[str] = []
    for path in config_files(configs_dir):
        try:
            config = load_config(path)
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        problems += [f"{path}: {p}" for p in paper_problems(config)]
        srcs.append(Source(path, config))
    try:
        problems += note_config_problems(load_notes(notes_path), notes_path, configs_dir)
    except ConfigError as exc:
        problems.append(str(exc))
    return problems + overlap_problems(srcs)

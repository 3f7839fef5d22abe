"""The claims table: each claim of the paper tested by removing one mechanism component.

A row of ``ROWS`` names a claim, the component of tx-full it tests, the ablation that removes
only that component (a mode of ``harness.modes.registry``), the config whose trials exercise
it, the cells of that config it pools and the metric (one of that config's report tables)
that measures the claim. Adding a row is one line.

How a row is measured (``atomix claims``; ``--quick`` for a smaller N):

* rows are grouped by config; each config runs once with ``tx-full`` and every ablation
  its rows name, on the cells its rows need, so every mode meets the same tasks, seeds and
  fault draws and trials pair on ``(cell, seed, trial)``;
* a row pools its cells: tx-full against the ablation on the matched trials
  (``harness.analysis.paired.paired_compare``): a yes/no metric by the exact McNemar test
  with Newcombe's paired interval, a numeric one by the Wilcoxon signed-rank test with a t
  interval on the mean paired difference;
* the p-values of every row of the table are Holm-adjusted together;
* the effect is tx-full minus the ablation, signed so that a positive effect means tx-full
  did better (for a metric where lower is better the difference is negated); a yes/no
  metric's effect is in percentage points;
* the verdict: ``supported`` (Holm p < 0.05, tx-full better), ``contradicted`` (Holm p <
  0.05, the ablation better), ``not supported on our workloads`` (otherwise), ``n/a (not
  exercised)`` (no pairs, or the row's condition never occurred in its trials).

A component no row separates (no row supported or contradicted) is listed as such in the
Markdown, never left out.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis.paired import PairRow, format_p, holm, paired_compare, verdict
from harness.analysis.records import REQUIRES_TEXT
from harness.analysis.runs import load_run, runs_of
from harness.analysis.table import NOT_EXERCISED_TEXT
from harness.errors import ConfigError, RunError
from harness.experiment import runner
from harness.experiment.cells import cell_id, expand_cells
from harness.experiment.config import ExperimentConfig, config_hash, load_config
from harness.experiment.rundir import read_manifest, settle_status
from harness.paper.claim_rows import (
    ALPHA,
    CLAIMS,
    COMPONENTS,
    CONTRADICTED,
    FULL,
    METRICS,
    NOT_SUPPORTED,
    ROWS,
    SUPPORTED,
    VERDICTS,
    ClaimRow,
    Metric,
    check_rows,
)

__all__ = [
    "ALPHA",
    "CLAIMS",
    "COMPONENTS",
    "CONTRADICTED",
    "DISPLAY_HEADER",
    "FULL",
    "METRICS",
    "NOT_SUPPORTED",
    "ROWS",
    "SUPPORTED",
    "VERDICTS",
    "ClaimResult",
    "ClaimRow",
    "ClaimsResult",
    "Metric",
    "OutError",
    "check_out",
    "check_rows",
    "claims_csv",
    "claims_markdown",
    "display_rows",
    "evaluate",
    "plan_configs",
    "quick_trials",
    "run_claims",
    "unseparated",
    "write_claims",
]

# --------------------------------------------------------------------------- planning

#: N per cell and mode under --quick: the config's N divided by this, at least QUICK_FLOOR.
QUICK_DIVISOR = 5
QUICK_FLOOR = 20


def quick_trials(trials: int) -> int:
    """N per cell and mode under --quick (never above the config's own N)."""
    return min(trials, max(QUICK_FLOOR, math.ceil(trials / QUICK_DIVISOR)))


def _modes_for(rows: Sequence[ClaimRow]) -> list[str]:
    return [FULL, *dict.fromkeys(r.ablation for r in rows if r.ablation != FULL)]


def _cell_overrides(
    config: ExperimentConfig, wanted: set[str] | None
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(overrides, grid) that keep only the cells in `wanted` (None: all) where the config's
    shape allows it without respelling a cell id: an explicit cell list without a grid is
    filtered; a grid without explicit cells keeps, per key, the values wanted cells use."""
    if wanted is None:
        return {}, {}
    cells = expand_cells(config)
    keep = [c for c in cells if cell_id(config, c) in wanted]
    if len(keep) == len(cells):
        return {}, {}
    if config.cells and not config.grid:
        return {"cells": [c for c in config.cells if cell_id(config, c) in wanted]}, {}
    if config.grid and not config.cells:
        return {}, {
            k: [v for v in vs if any(c[k] == v for c in keep)] for k, vs in config.grid.items()
        }
    return {}, {}


def plan_configs(
    rows: Sequence[ClaimRow], configs_dir: Path, quick: bool
) -> dict[str, ExperimentConfig]:
    """The config each run uses, by name: the file's, with tx-full and the ablations its
    rows need as its modes, only the cells its rows pool, and (quick) `quick_trials` N.
    ConfigError names the file or row at fault; nothing runs before every row checks out."""
    files: dict[str, ExperimentConfig] = {}
    for name in dict.fromkeys(r.config for r in rows):
        path = Path(configs_dir) / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(path, [f"no such config for the claims rows naming {name!r}"])
        files[name] = load_config(path)
    problems = check_rows(rows, files)
    if problems:
        raise ConfigError("claims rows", problems)
    planned: dict[str, ExperimentConfig] = {}
    for name, base in files.items():
        own = [r for r in rows if r.config == name]
        wanted = None if any(not r.cells for r in own) else {c for r in own for c in r.cells}
        overrides, grid = _cell_overrides(base, wanted)
        overrides["modes"] = _modes_for(own)
        if quick:
            overrides["trials"] = quick_trials(base.trials)
        planned[name] = load_config(
            Path(configs_dir) / f"{name}.yaml", overrides=overrides, grid=grid
        )
    return planned


# --------------------------------------------------------------------------- evaluating


@dataclass(frozen=True)
class ClaimResult:
    """One row measured. Levels and effect are in percent / percentage points for a yes/no
    metric, in the metric's unit otherwise; `effect` > 0 means tx-full did better, and
    [`ci_low`, `ci_high`] is its interval on the same sign. `full_better` / `full_worse`
    count the pairs where tx-full did better / worse than the ablation (the rest are ties).
    `p` is raw, `p_holm` adjusted over every row of the table (both nan when the row was not
    tested)."""

    row: ClaimRow
    kind: str  # "binary" | "numeric"
    pairs: int
    unmatched: int
    full_better: int
    full_worse: int
    full: float
    ablated: float
    effect: float
    ci_low: float
    ci_high: float
    p: float
    p_holm: float
    exercised: bool
    verdict: str

    @property
    def better(self) -> str:
        return METRICS[self.row.metric].better


def _pooled(records: Sequence[Mapping[str, Any]], row: ClaimRow) -> list[dict[str, Any]]:
    """The row's records as one cell: trials keep their own cell in their identity, so a
    pair still matches on (cell, seed, trial)."""
    label = "+".join(row.cells) if row.cells else "all"
    out = []
    for rec in records:
        if rec["mode"] not in (FULL, row.ablation):
            continue
        if row.cells and rec["cell_id"] not in row.cells:
            continue
        out.append({**rec, "cell_id": label, "trial": f"{rec['cell_id']}#{rec['trial']}"})
    return out


def _measure(records: Sequence[Mapping[str, Any]], row: ClaimRow) -> tuple[str, PairRow | None]:
    """(kind, the paired row of tx-full against the ablation), None when no trial of either
    mode is in the row's cells."""
    pooled = _pooled(records, row)
    modes = {r["mode"] for r in pooled}
    if modes != {FULL, row.ablation}:
        return "numeric", None
    cmp = paired_compare(
        pooled, row.metric, [row.ablation, FULL], baseline=row.ablation, requires=row.requires
    )
    (paired,) = cmp.rows
    return cmp.kind, paired


def _result(row: ClaimRow, kind: str, paired: PairRow | None, p_holm: float) -> ClaimResult:
    if paired is None:
        nan = math.nan
        return ClaimResult(row, kind, 0, 0, 0, 0, nan, nan, nan, nan, nan, nan, nan, False,
                           NOT_EXERCISED_TEXT)  # fmt: skip
    better = METRICS[row.metric].better
    # paired.diff is tx-full minus the ablation; negated where lower is better.
    sign = 1.0 if better == "higher" else -1.0
    scale = 100.0 if kind == "binary" else 1.0
    lo, hi = sorted((sign * scale * paired.lo, sign * scale * paired.hi))
    said = verdict(dataclasses.replace(paired, p_holm=p_holm), better=better, alpha=ALPHA)
    reading = {"better": SUPPORTED, "worse": CONTRADICTED, "no evidence": NOT_SUPPORTED}
    return ClaimResult(
        row=row,
        kind=kind,
        pairs=paired.pairs,
        unmatched=paired.unmatched,
        # gained / lost: pairs where tx-full's value was the higher / the lower.
        full_better=paired.gained if better == "higher" else paired.lost,
        full_worse=paired.lost if better == "higher" else paired.gained,
        full=scale * paired.value,
        ablated=scale * paired.base,
        effect=sign * scale * paired.diff + 0.0,  # + 0.0: no "-0.0"
        ci_low=lo + 0.0,
        ci_high=hi + 0.0,
        p=paired.p,
        p_holm=p_holm,
        exercised=paired.exercised and paired.pairs > 0,
        verdict=reading.get(said, NOT_EXERCISED_TEXT) if paired.pairs else NOT_EXERCISED_TEXT,
    )


def evaluate(
    rows: Sequence[ClaimRow], records: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[ClaimResult]:
    """Measure every row on `records` (config name -> its trial records) and Holm-adjust the
    p-values of all rows together."""
    measured = [_measure(records.get(row.config, ()), row) for row in rows]
    raw = [math.nan if p is None or not p.pairs else p.p for _, p in measured]
    adjusted = holm(raw)
    return [
        _result(row, kind, paired, p_holm)
        for row, (kind, paired), p_holm in zip(rows, measured, adjusted, strict=True)
    ]


def unseparated(results: Sequence[ClaimResult]) -> list[str]:
    """Components (in `COMPONENTS` order, then any others) that no row separates: none of
    their rows is supported or contradicted (a component with no row at all included)."""
    names = list(dict.fromkeys([*COMPONENTS, *(r.row.component for r in results)]))
    separated = {r.row.component for r in results if r.verdict in (SUPPORTED, CONTRADICTED)}
    return [c for c in names if c not in separated]


# --------------------------------------------------------------------------- running


@dataclass
class ClaimsResult:
    """What `run_claims` measured: one result per row, the run each config used and its
    N per cell and mode, and the command that made it."""

    results: list[ClaimResult]
    runs: dict[str, Path] = field(default_factory=dict)
    trials: dict[str, int] = field(default_factory=dict)
    quick: bool = False
    command: str = "atomix claims"
    paths: list[Path] = field(default_factory=list)


def _ensure_run(config: ExperimentConfig, out: Path, jobs: int, say: Callable[[str], None]) -> Path:
    """A complete run of `config` under `out`: a finished one of this very config (same
    hash) reused, an unfinished one resumed, else a new one."""
    name = config.name or "experiment"
    base = out / name
    digest = config_hash(config)
    resume = None
    if base.is_dir():
        for run_dir in reversed(runs_of(base)):
            try:
                manifest = read_manifest(run_dir)
            except RunError:
                continue
            if manifest.get("config_hash") != digest:
                continue
            status = settle_status(run_dir, manifest)
            if status == "complete" and "limit" not in manifest:
                say(f"{name}: finished run {run_dir} reused")
                return run_dir
            resume = run_dir
            break
    total = len(runner.plan(config))
    say(f"{name}: {total} trials ({', '.join(config.modes)}; N = {config.trials} per cell)"
        + (f", resuming {resume}" if resume else ""))  # fmt: skip
    result = runner.run(config, out=out, jobs=jobs, resume=resume)
    say(f"{name}: {result.ran} trials in {result.wall_s:.1f} s -> {result.run_dir}")
    return result.run_dir


class OutError(RunError):
    """The output directory cannot be created or written."""


def check_out(out: Path) -> None:
    """Refuse an output directory that cannot be created or written (OutError), before any
    trial runs."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".claims-probe-"):
            pass
    except OSError as exc:
        raise OutError(f"{out}: cannot write there ({exc.strerror or exc})") from None


def run_claims(
    *,
    rows: Sequence[ClaimRow] = ROWS,
    quick: bool = False,
    out: Path = Path("results/claims"),
    jobs: int = 1,
    configs_dir: Path = Path("configs"),
    command: str = "atomix claims",
    say: Callable[[str], None] = lambda _: None,
) -> ClaimsResult:
    """Run (or reuse, or resume) one run per config the rows name under `out`, measure every
    row, and write `out/claims.csv` and `out/claims.md`. ConfigError for a bad row or config
    and OutError (a RunError) for an unusable `out`, both before any trial runs."""
    out = Path(out)
    planned = plan_configs(rows, configs_dir, quick)
    check_out(out)
    records: dict[str, list[Mapping[str, Any]]] = {}
    runs: dict[str, Path] = {}
    for name, config in planned.items():
        run_dir = _ensure_run(config, out, jobs, say)
        runs[name] = run_dir
        records[name] = [dict(r) for r in load_run(run_dir).records]
    result = ClaimsResult(
        evaluate(rows, records),
        runs,
        {name: c.trials for name, c in planned.items()},
        quick,
        command,
    )
    result.paths = write_claims(result, out)
    return result


# --------------------------------------------------------------------------- rendering

CSV_COLUMNS: tuple[str, ...] = (
    "claim", "component", "workload", "cells", "ablation", "metric", "unit", "better",
    "pairs", "unmatched", "full_better", "full_worse", "tx_full", "ablation_value",
    "effect", "ci_low", "ci_high", "p", "p_holm", "verdict",
)  # fmt: skip


def _num(v: float) -> str:
    """A number for the CSV: 10 significant digits, empty when there is none."""
    return "" if math.isnan(v) else f"{v:.10g}"


def _unit(r: ClaimResult) -> str:
    # Levels of a yes/no metric are percentages, its effect and interval percentage points.
    return "percent; effect in percentage points" if r.kind == "binary" else "mean per trial"


def claims_csv(result: ClaimsResult | Sequence[ClaimResult]) -> str:
    """One line per row, numbers as numbers (empty: none); a function of the records only."""
    results = result.results if isinstance(result, ClaimsResult) else result
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in results:
        w.writerow([
            r.row.claim, r.row.component, r.row.config, ";".join(r.row.cells) or "all",
            r.row.ablation, r.row.metric, _unit(r), r.better, r.pairs, r.unmatched,
            r.full_better, r.full_worse,
            _num(r.full), _num(r.ablated), _num(r.effect), _num(r.ci_low), _num(r.ci_high),
            _num(r.p), _num(r.p_holm), r.verdict,
        ])  # fmt: skip
    return buf.getvalue()


def _fmt(v: float, kind: str, signed: bool = False) -> str:
    if math.isnan(v):
        return "n/a"
    if kind == "binary":  # percent: whole points, one decimal below 10 unless whole
        digits = 0 if v == round(v) or abs(v) >= 10 else 1
    else:
        digits = 1 if abs(v) >= 10 else 2
    text = f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"
    return "0" if signed and float(text) == 0 else text


def display_rows(results: Sequence[ClaimResult]) -> list[list[str]]:
    """Text cells in `DISPLAY_HEADER` order, for Markdown and the terminal (a newline where
    the terminal may break a cell; Markdown shows it as a space)."""
    out = []
    for r in results:
        unit = " (%)" if r.kind == "binary" else ""
        head = [r.row.claim, r.row.component, r.row.workload, r.row.ablation,
                f"{r.row.metric}{unit},\n{r.better} is better", str(r.pairs)]  # fmt: skip
        if r.verdict == NOT_EXERCISED_TEXT and (r.pairs == 0 or not r.exercised):
            out.append([*head, "", "", "", "", "", r.verdict])
            continue
        pp = " pp" if r.kind == "binary" else ""
        ci = f"[{_fmt(r.ci_low, r.kind, True)}, {_fmt(r.ci_high, r.kind, True)}]"
        out.append([
            *head,
            f"+{r.full_better}/-{r.full_worse}",
            f"{_fmt(r.full, r.kind)} vs {_fmt(r.ablated, r.kind)}",
            f"{_fmt(r.effect, r.kind, True)}{pp}",
            ci,
            format_p(r.p_holm),
            r.verdict,
        ])  # fmt: skip
    return out


DISPLAY_HEADER: tuple[str, ...] = (
    "claim", "component", "workload", "ablation", "metric", "pairs", "+/-",
    "tx-full vs ablation", "effect", "95% CI", "p (Holm)", "verdict",
)  # fmt: skip


def _md(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


def claims_markdown(result: ClaimsResult | Sequence[ClaimResult], level: int = 2) -> str:
    """The claims section for REPRODUCTION.md (or claims.md): the table, how to read it,
    the metrics compared, and what no workload separates."""
    results = result.results if isinstance(result, ClaimsResult) else list(result)
    h = "#" * level
    tested = sum(1 for r in results if not math.isnan(r.p))
    lines = [
        f"{h} Claims and ablations",
        "",
        "Each row tests one claim of the paper by removing one mechanism component of "
        f"{FULL}: {FULL} against the ablation that removes only that component, on the same "
        "trials (same config, tasks, seeds and fault draws; pairs matched on (cell, seed, "
        "trial), pooled over the cells the workload column names).",
        "",
        f"**Effect = {FULL} minus the ablation, signed so that a positive effect means {FULL} "
        "did better** (for a metric where lower is better the difference is negated). A yes/no "
        "metric's effect is in percentage points (pp), with Newcombe's paired 95% interval "
        "and the exact McNemar test; a numeric metric's is the mean paired difference, with a "
        "95% t interval and the Wilcoxon signed-rank test. "
        "+/-: the pairs where tx-full did better / worse than the ablation (the rest tie); "
        f"p is Holm-adjusted over the {tested} rows tested (the intervals are per row, not "
        "adjusted, so an interval may exclude 0 where the adjusted p does not). "
        f"Verdict: *{SUPPORTED}* (Holm p < "
        f"{ALPHA:g} and {FULL} better), *{CONTRADICTED}* (Holm p < {ALPHA:g} and the "
        f"ablation better), *{NOT_SUPPORTED}* (otherwise), *{NOT_EXERCISED_TEXT}* (no pairs, "
        "or the condition the row needs never occurred in its trials).",
        "",
    ]
    if isinstance(result, ClaimsResult) and result.trials:
        sizes = ", ".join(f"{name} {n}" for name, n in result.trials.items())
        quick = " (--quick)" if result.quick else ""
        lines += [f"N per cell and mode{quick}: {sizes}.", ""]
    header = DISPLAY_HEADER
    lines.append("| " + " | ".join(header) + " |")
    lines.append("| " + " | ".join([":---"] * 5 + ["---:"] * (len(header) - 6) + [":---"]) + " |")
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in display_rows(results)]
    lines += ["", "Metrics compared:", ""]
    for name in dict.fromkeys(r.row.metric for r in results):
        m = METRICS[name]
        lines.append(f"- `{name}`: {m.text} ({m.better} is better).")
    for q in sorted({r.row.requires for r in results if r.row.requires}):
        why = REQUIRES_TEXT[q].replace("the cell's", "its pooled")
        lines += ["", f"A row requiring `{q}` reads {NOT_EXERCISED_TEXT} when {why}."]
    lines += ["", f"{h}# What no workload separates", ""]
    none = unseparated(results)
    if none:
        lines.append(
            f"No row separates these components from {FULL} on our workloads (no row with "
            f"Holm p < {ALPHA:g} either way):"
        )
        lines.append("")
        for comp in none:
            lines.append(
                f"- **{comp}**: {_unseparated_text([r for r in results if r.row.component == comp])}"
            )
        lines += ["", "The claims these components are meant to carry are not shown by these rows."]
    else:
        lines.append(f"Every component is separated by at least one row (Holm p < {ALPHA:g}).")
    lines.append("")
    return "\n".join(lines)


def _unseparated_text(own: Sequence[ClaimResult]) -> str:
    """Why a component is not separated: no row, rows not exercised, the ablation identical
    to tx-full on every pair, or differences too small for the test."""
    if not own:
        return "no row tests it."
    parts = []
    for r in own:
        where = f"{r.row.ablation} on {r.row.workload}, {r.row.metric}"
        if r.verdict == NOT_EXERCISED_TEXT:
            parts.append(f"{where}: {NOT_EXERCISED_TEXT}")
        elif r.full_better == r.full_worse == 0:
            parts.append(f"{where}: the same value as {FULL} on all {r.pairs} pairs")
        else:
            parts.append(
                f"{where}: {FULL} better on {r.full_better} and worse on {r.full_worse} of "
                f"{r.pairs} pairs, Holm p = {format_p(r.p_holm)}"
            )
    return "; ".join(parts) + "."


def _document(result: ClaimsResult) -> str:
    lines = [
        "# Claims of the paper, tested by ablation",
        "",
        f"Made by `{result.command}`"
        + (" (--quick: a fifth of each config's N per cell and mode, at least "
           f"{QUICK_FLOOR})" if result.quick else " (each config's own N)")
        + ". The rows are defined in `harness/paper/claims.py` (`ROWS`).",
        "",
        claims_markdown(result),
        "## Runs",
        "",
    ]  # fmt: skip
    for name, run_dir in result.runs.items():
        lines.append(f"- `{name}`: N = {result.trials.get(name, '?')} per cell and mode, "
                     f"records in `{run_dir}`")  # fmt: skip
    lines.append("")
    return "\n".join(lines)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_claims(result: ClaimsResult, out: Path) -> list[Path]:
    """Write `out/claims.csv` and `out/claims.md` (each whole or not at all)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "claims.csv", out / "claims.md"]
    try:
        _write_atomic(paths[0], claims_csv(result))
        _write_atomic(paths[1], _document(result))
    except OSError as exc:
        raise RunError(f"{out}: cannot write the claims table ({exc.strerror or exc})") from None
    return paths

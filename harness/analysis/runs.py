"""Glue between experiment configs, run directories and `harness.analysis.report`.

* a config's `report` section -> `TableSpec`s and `PlotSpec`s (checked before a run starts,
  so a typo in a table never costs a run);
* a run directory -> its tables and plots, rebuilt from the stored records and the config
  stored in the manifest (never by running a trial);
* finding runs (the latest run of each config under a results directory);
* the `compare` table: modes side by side per cell, each tested against the first;
* what every mode x cell exercised (`tables/exercised.*`), and no rate or test for a cell
  whose condition never occurred (it reads `n/a (not exercised)`).

Everything written here is a pure function of the records and the config, so regenerating
a report gives byte-identical files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.analysis.exercised import exercised_counts_by, is_exercised
from harness.analysis.records import (
    METRIC_REQUIREMENT,
    exercised_records_frame,
    format_value,
    records_frame,
)
from harness.analysis.render import EXERCISED_NAME, write_exercised, write_table
from harness.analysis.report import PlotSpec, draw_plot
from harness.analysis.table import Table, TableSpec, build_table
from harness.errors import RunError
from harness.experiment.cells import cell_id, cell_label, expand_cells
from harness.experiment.config import ConfigError, ExperimentConfig, validate_config
from harness.experiment.record import TrialRecord
from harness.experiment.rundir import (
    DamagedLine,
    foreign_message,
    read_manifest,
    scan_records,
    settle_status,
)
from harness.experiment.runner import plan
from harness.experiment.sections import PlotModel, TableModel
from harness.experiment.trial import run_trial
from harness.world.oracle import Verdict

if TYPE_CHECKING:
    import pandas as pd

MANIFEST = "manifest.json"
TRIALS = "trials.jsonl"
DEFAULT_METRIC = "clean"
#: Record columns a table may use as its rows besides the cell parameters.
ROW_COLUMNS: tuple[str, ...] = ("mode", "cell_id", "trial", "seed")
COMPARE_METHOD = "clopper-pearson"
COMPARE_CONFIDENCE = 0.95

# --------------------------------------------------------------------------- config -> specs


def cell_params(config: ExperimentConfig) -> dict[str, list[Any]]:
    """Cell parameters as records name them (labels), each with its values in cell order."""
    params: dict[str, list[Any]] = {}
    for cell in expand_cells(config):
        for key, value in cell.items():
            values = params.setdefault(cell_label(config, key), [])
            if value not in values:
                values.append(value)
    return params


def _param(config: ExperimentConfig, name: str) -> str:
    """A cell parameter given by its dotted key or by its label -> its label."""
    return cell_label(config, name)


#: A placeholder in a table title: a dotted config key in braces, e.g. ``{agent.max_steps}``.
TITLE_KEY = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\}")


def _dotted(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, Mapping) or part not in data:
            raise KeyError(key)
        data = data[part]
    return data


def fill_title(config: ExperimentConfig, title: str) -> str:
    """``title`` with every ``{dotted.key}`` replaced by that key's value in the run's
    config, so a title never states a budget or size an override changed. A key the cells
    set is the values of the cells, in cell order (``10 or 30``). ValueError names a key
    the config does not have."""
    if "{" not in title:
        return title
    base = config.model_dump(mode="json")
    cells = expand_cells(config)

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        try:
            default = _dotted(base, key)
        except KeyError:
            default = None
            if not all(key in cell for cell in cells):
                raise ValueError(
                    f"title: {{{key}}} names no config key (a placeholder is a dotted config "
                    "key, e.g. {agent.max_steps})"
                ) from None
        values = [cell.get(key, default) for cell in cells]
        return " or ".join(dict.fromkeys(format_value(_hashable_value(v)) for v in values))

    return TITLE_KEY.sub(value, title)


def _hashable_value(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, list | dict) else v


def overrides_caption(manifest: Mapping[str, Any]) -> str:
    """``Run with overrides: trials=20, agent.max_steps=10.`` from the manifest's
    ``overrides`` (what the command line changed in the config file), or "" when none."""
    given = manifest.get("overrides")
    if not isinstance(given, Mapping) or not given:
        return ""

    def text(v: Any) -> str:
        if isinstance(v, list):
            return ",".join(text(x) for x in v)
        if isinstance(v, dict):
            return json.dumps(v, sort_keys=True)
        return format_value(v)

    return "Run with overrides: " + ", ".join(f"{k}={text(v)}" for k, v in given.items()) + "."


def _table_spec(config: ExperimentConfig, t: TableModel) -> TableSpec:
    rows = _param(config, t.rows)
    return TableSpec(
        name=t.name,
        metric=t.metric,
        kind=t.kind,
        columns=tuple(_param(config, c) for c in t.columns),
        rows=rows,
        title=fill_title(config, t.title),
        method=t.method,
        row_order=tuple(config.modes) if rows == "mode" else (),
        requires=t.requires,
        label_order=tuple(cell_params(config)),
    )


def _plot_spec(config: ExperimentConfig, p: PlotModel) -> PlotSpec:
    return PlotSpec(table=p.table, kind=p.kind, x=_param(config, p.x) if p.x else None, name=p.name)


def default_table(config: ExperimentConfig) -> TableSpec:
    """Used when a config defines no tables: `clean` as a proportion, cell parameters as columns."""
    return TableSpec(
        name=DEFAULT_METRIC,
        metric=DEFAULT_METRIC,
        kind="proportion",
        columns=tuple(cell_params(config)),
        title=f"{config.name or 'experiment'}: {DEFAULT_METRIC} trials (%)",
        row_order=tuple(config.modes),
        label_order=tuple(cell_params(config)),
    )


def table_specs(config: ExperimentConfig) -> list[TableSpec]:
    if not config.report.tables:
        return [default_table(config)]
    return [_table_spec(config, t) for t in config.report.tables]


def plot_specs(config: ExperimentConfig) -> list[PlotSpec]:
    if not config.report.tables:
        return [PlotSpec(table=DEFAULT_METRIC, kind="bar")]
    return [_plot_spec(config, p) for p in config.report.plots]


def main_table(config: ExperimentConfig) -> str:
    """The table printed in the terminal: `report.main`, else the first."""
    return config.report.main or table_specs(config)[0].name


def check_report(config: ExperimentConfig, path: str | Path = "<config>") -> None:
    """Check the `report` section against the cells; raise ConfigError naming the key."""
    params = cell_params(config)
    names = sorted({*params, *(key for cell in expand_cells(config) for key in cell)})
    problems: list[str] = []
    seen: set[str] = set()
    for i, t in enumerate(config.report.tables):
        if t.name in seen:
            problems.append(f"report.tables.{i}.name: table {t.name!r} is defined twice")
        if t.name == EXERCISED_NAME:
            problems.append(
                f"report.tables.{i}.name: {t.name!r} is reserved for the table of what every "
                "cell exercised; choose another name"
            )
        seen.add(t.name)
        for c in t.columns:
            if _param(config, c) not in params:
                problems.append(
                    f"report.tables.{i}.columns: unknown cell parameter {c!r}; allowed: {names}"
                )
        if _param(config, t.rows) not in (*ROW_COLUMNS, *params):
            problems.append(
                f"report.tables.{i}.rows: unknown rows {t.rows!r}; "
                f"allowed: {[*ROW_COLUMNS, *names]}"
            )
        try:
            _table_spec(config, t)
        except ValueError as exc:
            problems.append(f"report.tables.{i}: {exc}")
    columns = {t.name: [_param(config, c) for c in t.columns] for t in config.report.tables}
    stems: set[str] = set()
    for j, p in enumerate(config.report.plots):
        try:
            spec = _plot_spec(config, p)
        except ValueError as exc:
            problems.append(f"report.plots.{j}: {exc}")
            continue
        if spec.stem in stems:
            problems.append(f"report.plots.{j}.name: plot {spec.stem!r} is defined twice")
        stems.add(spec.stem)
        if spec.x is None or p.table not in columns:
            continue  # an unknown table is reported by validate_config
        if spec.x not in columns[p.table]:
            problems.append(
                f"report.plots.{j}.x: {p.x!r} is not a column of table {p.table!r}; "
                f"its columns: {columns[p.table]}"
            )
        elif any(
            isinstance(v, bool) or not isinstance(v, int | float) for v in params.get(spec.x, [])
        ):
            problems.append(f"report.plots.{j}.x: {p.x!r} must have numeric values for a line plot")
    problems += _metric_problems(config)
    if problems:
        raise ConfigError(path, problems)


#: Metrics every trial record has (the oracle's verdict plus the trial's counts and times).
#: Only a speed-up: a metric not listed here is looked up in one probe trial.
KNOWN_METRICS = frozenset(f.name for f in fields(Verdict)) | {
    "leaked",
    "committed",
    "agents",
    "attempts",
    "aborts",
    "wait_ms",
    "blocked",
    "makespan_ms",
    "stuck",
}


def _metric_problems(config: ExperimentConfig) -> list[str]:
    """Tables whose metric no trial record has. Metrics are whatever a trial reports, so a
    name that is not a known one is checked against one trial run in memory (nothing is
    written); that costs one trial, and only for such a name."""
    known = KNOWN_METRICS
    if config.agent.kind == "llm":  # a probe trial would need the model server
        from harness.agents.llm import LLM_METRICS

        known = known | set(LLM_METRICS)
    unknown = [(i, t.metric) for i, t in enumerate(config.report.tables) if t.metric not in known]
    if not unknown:
        return []
    metrics = sorted(run_trial(plan(config)[0])["metrics"])
    return [
        f"report.tables.{i}.metric: unknown metric {m!r}; allowed: {', '.join(metrics)}"
        for i, m in unknown
        if m not in metrics
    ]


# --------------------------------------------------------------------------- run directories


@dataclass
class Run:
    """A run directory as stored: its manifest, the config it ran and its whole records.

    Guarantees: `records` are this run's config's records only (another config's records
    make `load_run` refuse), one per key; lines that are not usable records are in
    `damaged`, never in `records`.
    """

    run_dir: Path
    manifest: dict[str, Any]
    config: ExperimentConfig
    records: list[TrialRecord]
    damaged: list[DamagedLine] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "?"))

    @property
    def planned(self) -> int:
        return int(self.manifest.get("trials_planned") or 0)


def load_run(run_dir: Path, report_from: ExperimentConfig | None = None) -> Run:
    """Read a run directory; `report_from` replaces the stored config's `report` section.

    Raises RunError (one line) for a missing or damaged manifest and for records of another
    config; a run whose owner was killed is marked `interrupted` on the way.
    """
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    path = run_dir / MANIFEST
    settle_status(run_dir, manifest)
    config = validate_config(manifest["config"], path)
    if report_from is not None:
        config = config.model_copy(update={"report": report_from.report})
        check_report(config, path)
    name = manifest.get("config_name") or config.name or "experiment"
    digest = manifest.get("config_hash")
    trials = run_dir / TRIALS
    # Name and hash, not the planned keys: a stored config re-validated by newer code may
    # spell a cell id differently, and that must not make a run's own records foreign.
    scan = scan_records(trials, name, digest)
    if scan.foreign:
        raise RunError(foreign_message(trials, scan.foreign, name, digest))
    return Run(run_dir, manifest, config, scan.records, scan.damaged)


def _run_sort_key(run_dir: Path) -> tuple[str, str, int, str]:
    # Start time first; then the run id, a UTC stamp with "-N" added on a clash
    # ("...-183715" < "...-183715-2" < "...-183715-10").
    try:
        started = str(json.loads((run_dir / MANIFEST).read_text(encoding="utf-8"))["started_at"])
    except (OSError, ValueError, KeyError, TypeError):
        started = ""
    m = re.fullmatch(r"(\d{8}-\d{6})(?:-(\d+))?", run_dir.name)
    if m is None:
        return started, "", 0, run_dir.name
    return started, m.group(1), int(m.group(2) or 1), run_dir.name


def runs_of(config_dir: Path) -> list[Path]:
    """Run directories of one config, oldest first."""
    dirs = [d for d in Path(config_dir).iterdir() if (d / MANIFEST).is_file()]
    return sorted(dirs, key=_run_sort_key)


def latest_runs(results: Path) -> list[Path]:
    """The latest run of each config under `results` (one per config directory)."""
    results = Path(results)
    if not results.is_dir():
        return []
    out = []
    for config_dir in sorted(d for d in results.iterdir() if d.is_dir()):
        runs = runs_of(config_dir)
        if runs:
            out.append(runs[-1])
    return out


def resolve_run(path: Path) -> Path:
    """A run directory, or a config's directory under results (-> its latest run)."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    if path.is_dir():
        runs = runs_of(path)
        if runs:
            return runs[-1]
    raise RunError(f"{path}: not a run directory (no {MANIFEST}) and holds no runs")


# --------------------------------------------------------------------------- writing reports


@dataclass
class Report:
    """What `write_run_report` wrote, the table for the terminal, and any problems."""

    paths: list[Path] = field(default_factory=list)
    main: Table | None = None
    problems: list[str] = field(default_factory=list)


def _spec_key(config: ExperimentConfig, i: int, spec: TableSpec) -> str:
    return f"report.tables.{i}" if config.report.tables else f"default table {spec.name!r}"


def write_run_report(run: Run) -> Report:
    """Write every table (md, csv, tex), the exercised table (md, csv) and every plot
    (png, pdf) of a run from its records."""
    out = Report()
    if not run.records:
        out.problems.append("no trial records yet; nothing to report")
        return out
    df = records_frame(run.records)
    metrics = sorted(c.removeprefix("m.") for c in df.columns if c.startswith("m."))
    tables: dict[str, Table] = {}
    for i, spec in enumerate(table_specs(run.config)):
        if spec.metric not in metrics:
            out.problems.append(
                f"{_spec_key(run.config, i, spec)}.metric: unknown metric {spec.metric!r}; "
                f"the records have: {', '.join(metrics)}"
            )
            continue
        try:
            tables[spec.name] = build_table(df, spec)
        except ValueError as exc:
            out.problems.append(f"{_spec_key(run.config, i, spec)}: {exc}")
            continue
        tables[spec.name].overrides = overrides_caption(run.manifest)
        out.paths += write_table(tables[spec.name], run.run_dir / "tables")
    out.paths += write_exercised(
        df, run.run_dir / "tables", run.config.modes, _cell_order(run.config, df["cell_id"])
    )
    for p in plot_specs(run.config):
        if p.table not in tables:
            continue  # its table failed and is reported above
        out.paths += draw_plot(tables[p.table], p, run.run_dir / "plots")
    out.main = tables.get(main_table(run.config))
    return out


# --------------------------------------------------------------------------- compare


def exercised_by_cell(
    records: Sequence[Mapping[str, Any]],
    modes: Sequence[str],
    requires: str | None,
    frame: pd.DataFrame | None = None,
) -> dict[tuple[str, str], bool]:
    """(cell_id, mode) -> did its trials exercise `requires` (see `is_exercised`).
    `frame`: `records_frame(records)` where the caller has it (its rows of `modes` are
    read: no frame is built)."""
    metric = ""
    if requires is not None and requires.startswith(METRIC_REQUIREMENT):
        metric = requires[len(METRIC_REQUIREMENT) :]
    if frame is not None:
        df = frame[frame["mode"].isin([str(m) for m in modes])]
    else:
        # Only the columns the counts read: the whole frame would cost several times more.
        df = exercised_records_frame(
            [r for r in records if r["mode"] in modes], [metric] if metric else ()
        )
    positions: dict[tuple[str, str], list[int]] = {}
    for i, (c, m) in enumerate(zip(df["cell_id"].tolist(), df["mode"].tolist(), strict=True)):
        positions.setdefault((str(c), str(m)), []).append(i)
    counts = exercised_counts_by(df, positions, requires)
    return {key: is_exercised(c, requires) for key, c in counts.items()}


def _cell_order(config: ExperimentConfig, present: Iterable[str]) -> list[str]:
    """Cells in the config's order; cells not in the config (if any) after, sorted."""
    planned = [cell_id(config, c) for c in expand_cells(config)]
    present = set(present)
    return [c for c in planned if c in present] + sorted(present - set(planned))


def summary(config: ExperimentConfig) -> Mapping[str, Any]:
    """What a config will run: workload, modes, cells, trials and the total trial count."""
    cells = [cell_id(config, c) for c in expand_cells(config)]
    return {
        "name": config.name or "experiment",
        "workload": config.workload,
        "modes": list(config.modes),
        "cells": cells,
        "trials": config.trials,
        "total": len(cells) * config.trials * len(config.modes),
        "tables": [s.name for s in table_specs(config)],
    }

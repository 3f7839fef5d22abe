"""`atomix reproduce`: run the configs that map the paper's result tables, then write
REPRODUCTION.md, the paper's cells beside ours with a verdict for each.

The comparison is generated from data only: the paper's cells (``harness/paper/paper_cells.csv``),
each config's ``paper:`` section (which paper row is which of our modes and cells, which
paper column is which statistic of which metric), the trial records of the runs, and the
notes file (``harness/paper/paper_notes.yaml``) that explains, by mechanism, why a cell differs.
A note never changes a number; a differing cell with no note is flagged ``UNEXPLAINED``.

The verdict rule (``judge``; also written at the top of every REPRODUCTION.md): a paper
value p, printed with a rounding of h (half a unit of its last printed digit), is
*reproduced* when it lies in our two-sided 95% interval widened by h: lo - h <= p <= hi + h.
The interval is Clopper-Pearson for proportions (and for counts, compared as the rate
count / the paper's N), Student t for means (a cell whose every trial gave the same value
has the one-point interval [v, v], so a deterministic 0 must be 0), exact (Clopper-Pearson
or Poisson) for rates per 1,000. A trial count (`trials`) is reproduced when equal. A value
outside is *differs*. *Not comparable*: no config maps the table yet, the cell is not mapped
(the config says why), our cell was not exercised (its condition never occurred), it has no
trials, the paper's value is approximate (``~50``), or a trial count differs (another N).

``--quick`` runs every config with N = ``quick_trials(trials)``: a fifth of the config's
trials, at least ``QUICK_FLOOR`` and never more than the config's own.

A table of wall-clock timings (Table 17) cannot come from trial records, which must be the
same for the same seed: it is measured by a benchmark (``BENCHMARKS``) in a fresh process,
with the paper's N, and judged by the timing rule (``judge_timing``, ``TIMING_RULE``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import ConfigError, RunError
from harness.experiment.config import (
    ExperimentConfig,
    PaperColumnModel,
    PaperRowModel,
    PaperTableModel,
    cell_label,
    config_hash,
    did_you_mean,
    format_cell,
    load_config,
    paper_problems,
)
from harness.experiment.yamlload import MAX_BYTES, YamlInputError, load_yaml
from harness.paper.cells import PaperCell, cells_by_table, half_unit, split_part, tables

__all__ = [
    "BENCHMARKS",
    "NOTES_PATH",
    "QUICK_DIVISOR",
    "QUICK_FLOOR",
    "Measure",
    "Note",
    "Outcome",
    "Source",
    "Verdict",
    "judge",
    "judge_timing",
    "load_notes",
    "measure",
    "overlap_problems",
    "parse_tables",
    "quick_trials",
    "reproduce",
    "sources",
]

#: The notes file: why a cell differs, by mechanism.
NOTES_PATH = Path(__file__).with_name("paper_notes.yaml")
#: --quick: N = max(QUICK_FLOOR, ceil(trials / QUICK_DIVISOR)), capped at the config's trials.
QUICK_FLOOR = 20
QUICK_DIVISOR = 5
REPORT_NAME = "REPRODUCTION.md"

REPRODUCED = "reproduced"
DIFFERS = "differs"
NOT_COMPARABLE = "not comparable"
UNEXPLAINED = "UNEXPLAINED"
NO_CONFIG = "no config yet"

RULE = (
    "A paper value p, printed with a rounding of h (half a unit of its last printed digit), "
    "is **reproduced** when it lies in our two-sided 95% interval widened by h: "
    "lo - h <= p <= hi + h. Intervals: Clopper-Pearson for proportions (a count is compared "
    "as the rate count / the paper's N), Student t for means (a cell whose every trial gave "
    "the same value has the one-point interval [v, v], so a deterministic 0 must be exactly "
    "0), exact Clopper-Pearson or Poisson for rates per 1,000. A trial count is reproduced "
    "when equal. Otherwise the cell **differs**; its explanation by mechanism comes from "
    "`harness/paper/paper_notes.yaml`, and a differing cell without one is flagged "
    f"**{UNEXPLAINED}**. **Not comparable**: no config maps the table yet ({NO_CONFIG}), "
    "the cell is not mapped (the reason is given), our cell was not exercised (its condition "
    "never occurred), it has no trials, the paper's value is approximate, or a trial count "
    "differs (another N). Interval bounds, half-widths and counts the paper prints beside a "
    "value are shown with it and not judged on their own; the counts below are of judged "
    "cells. A labelled variant (another protocol) is judged by the same rule and listed "
    "after the table; it never counts as the table's reproduction."
)


def quick_trials(trials: int) -> int:
    """N per cell and mode under --quick: a fifth of `trials`, at least QUICK_FLOOR, at most
    `trials`."""
    return min(trials, max(QUICK_FLOOR, math.ceil(trials / QUICK_DIVISOR)))


def parse_tables(text: str) -> list[int]:
    """`"1,6, 16"` -> [1, 6, 16] (sorted, once each); ValueError naming a bad item, the
    nearest result table and the allowed ones."""
    known = sorted(tables())
    out: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            number = int(item.removeprefix("Table").removeprefix("table").strip())
        except ValueError:
            raise ValueError(
                f"{item!r} is not a table number; allowed: {_ranges(known)}"
            ) from None
        if number not in known:
            best = min(abs(k - number) for k in known)
            near = [str(k) for k in known if abs(k - number) == best]
            why = " (Table 4 is the adapter specification and holds no results)" if number == 4 else ""
            raise ValueError(
                f"{number} is not a result table of the paper{why}; did you mean "
                f"{' or '.join(near)}?; allowed: {_ranges(known)}"
            )
        out.add(number)
    if not out:
        raise ValueError(f"no table given; allowed: {_ranges(known)}")
    return sorted(out)


def _ranges(numbers: Iterable[int]) -> str:
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


# --------------------------------------------------------------------------- notes


@dataclass(frozen=True)
class Note:
    """Why cells of one paper table differ, by mechanism. It applies to the differing cells
    of `table` in `rows` and `columns` (empty: all) compared through the config `config`
    (None: any); the most specific matching note wins, then the first in the file."""

    table: int
    why: str
    rows: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    config: str | None = None

    def matches(self, table: int, row: str, column: str, config: str | None) -> bool:
        return (
            table == self.table
            and (not self.rows or row in self.rows)
            and (not self.columns or column in self.columns)
            and (self.config is None or self.config == config)
        )

    @property
    def specificity(self) -> int:
        return bool(self.rows) + bool(self.columns) + (self.config is not None)


_NOTE_KEYS = ("table", "why", "rows", "columns", "config")


def load_notes(path: Path = NOTES_PATH) -> list[Note]:
    """The notes of `path` (a YAML list of mappings with `table`, `why` and optionally
    `rows`, `columns`, `config`), checked against the paper's cells: ConfigError naming the
    file and the entry's key for an unknown table, row, column or key."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = load_yaml(fh.read(MAX_BYTES + 1))
    except FileNotFoundError:
        raise ConfigError(path, ["no such file"]) from None
    except (OSError, YamlInputError) as exc:
        raise ConfigError(path, [str(exc)]) from None
    if not isinstance(data, list):
        raise ConfigError(path, ["(top level): must be a list of notes ({table, why, ...})"])
    by_table = cells_by_table()
    notes: list[Note] = []
    problems: list[str] = []
    for i, entry in enumerate(data):
        at = str(i)
        if not isinstance(entry, dict):
            problems.append(f"{at}: must be a mapping with table and why")
            continue
        unknown = [k for k in entry if k not in _NOTE_KEYS]
        for key in unknown:
            problems.append(f"{at}.{key}: unknown key{did_you_mean(str(key), _NOTE_KEYS)}; allowed: {', '.join(_NOTE_KEYS)}")
        table, why = entry.get("table"), entry.get("why")
        if isinstance(table, bool) or not isinstance(table, int) or table not in by_table:
            problems.append(f"{at}.table: {table!r} is not a result table; allowed: {_ranges(by_table)}")
            continue
        if not isinstance(why, str) or not why.strip():
            problems.append(f"{at}.why: required, the explanation by mechanism (text)")
            continue
        cells = by_table[table]
        labels: dict[str, list[str]] = {
            "rows": list(dict.fromkeys(c.row for c in cells)),
            "columns": list(dict.fromkeys(split_part(c.column)[0] for c in cells)),
        }
        picked: dict[str, tuple[str, ...]] = {}
        for key, allowed in labels.items():
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problems.append(f"{at}.{key}: must be a list of Table {table}'s {key}")
                continue
            for v in value:
                if v not in allowed:
                    problems.append(
                        f"{at}.{key}: {v!r} is not one of Table {table}'s {key}"
                        f"{did_you_mean(v, allowed)}; allowed: {allowed}"
                    )
            picked[key] = tuple(value)
        config = entry.get("config")
        if config is not None and not isinstance(config, str):
            problems.append(f"{at}.config: must be a config name")
        notes.append(
            Note(table, " ".join(why.split()), picked.get("rows", ()), picked.get("columns", ()), config)
        )
    if problems:
        raise ConfigError(path, problems)
    return notes


def note_config_problems(notes: Sequence[Note], notes_path: Path, configs_dir: Path) -> list[str]:
    """Notes whose `config` names no config file under `configs_dir` (they would never match)."""
    names = [p.stem for p in config_files(configs_dir)]
    return [
        f"{notes_path}: the note on Table {n.table} names config {n.config!r}, which is not in "
        f"{configs_dir}{did_you_mean(n.config, names)}"
        for n in notes
        if n.config is not None and n.config not in names
    ]


def find_note(notes: Sequence[Note], table: int, row: str, column: str, config: str | None) -> Note | None:
    """The most specific note for a differing cell (the first of equals), or None."""
    found = [n for n in notes if n.matches(table, row, column, config)]
    return max(found, key=lambda n: n.specificity) if found else None  # max keeps the first


# --------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class Source:
    """A config file and the config loaded from it (with the run's trial count)."""

    path: Path
    config: ExperimentConfig

    @property
    def name(self) -> str:
        return self.config.name or self.path.stem

    def entries(self, table: int) -> list[tuple[int, PaperTableModel]]:
        return [(i, e) for i, e in enumerate(self.config.paper) if e.table == table]


def _paper_tables(path: Path) -> set[int] | None:
    """The tables a config file's `paper:` section names, read without validating the
    config (None when the file cannot be read as a mapping: load it to see why)."""
    try:
        with path.open("rb") as fh:
            data = load_yaml(fh.read(MAX_BYTES + 1))
    except (OSError, YamlInputError):
        return None
    if not isinstance(data, dict):
        return None
    entries = data.get("paper") or []
    if not isinstance(entries, list):
        return None
    return {e.get("table") for e in entries if isinstance(e, dict) and isinstance(e.get("table"), int)}


def config_files(configs_dir: Path) -> list[Path]:
    return sorted([*Path(configs_dir).glob("*.yaml"), *Path(configs_dir).glob("*.yml")])


def sources(configs_dir: Path, wanted: Iterable[int], quick: bool) -> list[Source]:
    """Every config under `configs_dir` whose `paper:` section maps one of `wanted`, loaded
    and checked (ConfigError otherwise), with its trials cut to `quick_trials` if `quick`."""
    wanted = set(wanted)
    out: list[Source] = []
    for path in config_files(configs_dir):
        named = _paper_tables(path)
        if named is not None and not named & wanted:
            continue
        config = load_config(path)
        if not {e.table for e in config.paper} & wanted:
            continue
        if quick and quick_trials(config.trials) != config.trials:
            config = load_config(path, overrides={"trials": quick_trials(config.trials)})
        out.append(Source(path, config))
    return out


def _targets(entry: PaperTableModel, row: str) -> list[PaperRowModel]:
    target = entry.rows.get(row)
    if target is None:
        return []
    targets = target if isinstance(target, list) else [target]
    return [PaperRowModel(mode=t) if isinstance(t, str) else t for t in targets]


def overlap_problems(all_sources: Sequence[Source]) -> list[str]:
    """Paper cells that two configs both claim as the primary reproduction, one line each."""
    claimed: dict[tuple[int, str, int, str], str] = {}
    problems: list[str] = []
    for src in all_sources:
        for i, entry in enumerate(src.config.paper):
            if entry.variant:
                continue
            for row, target in entry.rows.items():
                count = len(target) if isinstance(target, list) else 1
                for k in range(count):
                    for column in entry.columns:
                        key = (entry.table, row, k, column)
                        where = f"{src.path}: paper.{i}"
                        if key in claimed:
                            problems.append(
                                f"{where}: Table {entry.table} row {row!r} column {column!r} is "
                                f"also mapped by {claimed[key]}; one config reproduces a cell, "
                                "another may map it only as a `variant`"
                            )
                        claimed.setdefault(key, where)
    return problems


# --------------------------------------------------------------------------- running


def _existing_run(config: ExperimentConfig, out: Path) -> tuple[Path, str] | None:
    """The latest run of `config` under `out` with this very config (same hash), and its
    status: `complete` only when it ran every trial (a run made with --limit has not)."""
    from harness.analysis.runs import runs_of
    from harness.experiment.rundir import read_manifest, settle_status

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
    from harness.experiment import runner

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


# --------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Measure:
    """Our side of one paper cell: the statistic over the selected trials, on the paper's
    scale (percent for proportions, per 1,000, the metric's units times `scale` for means,
    the count for counts, N for trials), with its 95% interval [lo, hi] on the same scale
    (for a count, [lo, hi] is the interval of the rate as a fraction). `exercised` false:
    the cell's condition never occurred (`why_not` says which), so no value is claimed."""

    stat: str
    value: float
    lo: float
    hi: float
    n: int
    successes: int | None = None
    exercised: bool = True
    why_not: str = ""

    @property
    def text(self) -> str:
        if self.n == 0:
            return "no trials"
        if not self.exercised:
            return "n/a (not exercised)"
        if self.stat == "trials":
            return str(self.n)
        if self.stat == "count":
            rate = 100 * (self.successes or 0) / self.n
            bounds = f"[{_pct(100 * self.lo)}, {_pct(100 * self.hi)}]"
            return f"{self.successes}/{self.n} = {_pct(rate)}% {bounds}"
        if self.stat == "proportion":
            return f"{_pct(self.value)} [{_pct(self.lo)}, {_pct(self.hi)}]"
        return f"{_num(self.value)} [{_num(self.lo)}, {_num(self.hi)}]"


def _pct(v: float) -> str:
    from harness.analysis.stats import format_pct

    return format_pct(v)


def _num(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    text = f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"
    return "0" if float(text) == 0 else text


# The report's table kind each statistic is built with (a count is a proportion's numerator;
# N is read off any table).
_SPEC_KIND = {
    "proportion": "proportion",
    "count": "proportion",
    "trials": "mean",
    "mean": "mean",
    "per_1000": "per_1000",
}


class Measurer:
    """Measures paper cells on one run's records; tables are built once per statistic."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        from harness.analysis.report import records_frame

        self.df = records_frame(records)
        self._tables: dict[tuple[Any, ...], Any] = {}

    def table(self, column: PaperColumnModel, params: tuple[str, ...], requires: str | None) -> Any:
        from harness.analysis.report import TableSpec, build_table

        assert column.metric is not None and column.stat is not None  # checked by the model
        key = (column.metric, column.stat, column.zero, params, requires)
        if key not in self._tables:
            metric = column.metric
            if column.stat in ("proportion", "count"):
                # A trial counts when its metric is true (a count: nonzero), or with `zero`
                # when it is false (0): e.g. "classified clean" = no residue reported.
                metric = f"__paper_{'zero' if column.zero else 'yes'}_{column.metric}"
                source = self.df[f"m.{column.metric}"]
                self.df[f"m.{metric}"] = [
                    None if _missing(v) else (not v if column.zero else bool(v)) for v in source
                ]
            spec = TableSpec(
                name="paper",
                metric=metric,
                kind=_SPEC_KIND[column.stat],
                columns=params,
                requires=requires,
            )
            self._tables[key] = build_table(self.df, spec)
        return self._tables[key]


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def selection(config: ExperimentConfig, *parts: Mapping[str, Any]) -> dict[str, Any]:
    """Cell parameters by their labels (as records name them), later parts winning."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[cell_label(config, key)] = value
    return out


def measure(
    measurer: Measurer,
    mode: str,
    cell: Mapping[str, Any],
    column: PaperColumnModel,
    requires: str | None = None,
) -> Measure:
    """The statistic `column` asks for over the trials of `mode` in the cells matching
    `cell` (labels -> values; the other cell parameters pooled)."""
    stat = column.stat
    assert stat is not None
    params = tuple(sorted(cell))
    table = measurer.table(column, params, requires)
    data = table.data
    mask = [r == mode for r in data["row"]]
    for p in params:
        mask = [m and _same(v, cell[p]) for m, v in zip(mask, data[f"cell.{p}"], strict=True)]
    if not any(mask):
        return Measure(stat, math.nan, math.nan, math.nan, 0)
    row = data.iloc[mask.index(True)]
    n = int(row["n"])
    if n == 0:
        return Measure(stat, math.nan, math.nan, math.nan, 0)
    if not bool(row["exercised"]):
        return Measure(stat, math.nan, math.nan, math.nan, n, exercised=False,
                       why_not=_why_not(requires))
    value, lo, hi = float(row["value"]), float(row["lo"]), float(row["hi"])
    if stat == "proportion":
        return Measure(stat, 100 * value, 100 * lo, 100 * hi, n, int(row["total"]))
    if stat == "count":
        return Measure(stat, float(row["total"]), lo, hi, n, int(row["total"]))
    if stat == "trials":
        return Measure(stat, float(n), float(n), float(n), n)
    scale = column.scale if stat == "mean" else 1.0
    return Measure(stat, scale * value, scale * lo, scale * hi, n)


def _why_not(requires: str | None) -> str:
    """What did not occur in a cell that was not exercised (harness.analysis.report.is_exercised)."""
    if requires is None:
        return "the cell injects faults but none was injected in its trials"
    if requires == "faults" or requires.startswith("F"):
        which = "" if requires == "faults" else f"{requires} "
        return f"no {which}fault was injected in the cell's trials"
    return f"no {requires.replace('_', ' ').removesuffix('s')} occurred in the cell's trials"


def _same(a: Any, b: Any) -> bool:
    if _missing(a):
        return False
    return a == b and isinstance(a, bool) == isinstance(b, bool)


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Verdict:
    """One cell's verdict: `kind` is reproduced, differs or not comparable; `reason` says
    why in a few words (for not comparable, which of the reasons; for the others, the
    comparison made)."""

    kind: str
    reason: str = ""


def judge(paper: PaperCell, ours: Measure) -> Verdict:
    """The verdict rule (module docstring and `RULE`) for one paper cell and our measure."""
    if ours.n == 0:
        return Verdict(NOT_COMPARABLE, "no trials of ours match the mapping")
    if not ours.exercised:
        return Verdict(NOT_COMPARABLE, f"not exercised: {ours.why_not}")
    if paper.value.strip().startswith("~"):
        return Verdict(NOT_COMPARABLE, f"the paper's value {paper.value} is approximate")
    if ours.stat == "trials":
        if paper.number == ours.n:
            return Verdict(REPRODUCED, "same N")
        return Verdict(NOT_COMPARABLE, f"different N: the paper's {paper.value}, ours {ours.n}")
    h = half_unit(paper.value)
    p = paper.number
    if ours.stat == "count":
        if not paper.n:
            return Verdict(NOT_COMPARABLE, "the paper states no N for this count")
        p, h = p / paper.n, h / paper.n
    if math.isnan(ours.lo) or math.isnan(ours.hi):
        return Verdict(NOT_COMPARABLE, "no interval (too few trials)")
    inside = ours.lo - h <= p <= ours.hi + h
    shown = f"{paper.value}/{paper.n} = {100 * p:.3g}%" if ours.stat == "count" else paper.value
    if inside:
        return Verdict(REPRODUCED, f"{shown} within ours")
    side = "below" if p < ours.lo - h else "above"
    return Verdict(DIFFERS, f"{shown} {side} our interval")


# --------------------------------------------------------------------------- the comparison


@dataclass
class Line:
    """One judged paper cell (with the parts the paper prints beside it) and ours."""

    row: str
    occurrence: int  # 0 for the first row of that label (Table 16 repeats labels)
    column: str
    paper: str
    paper_n: str
    ours: str = "—"
    where: str = ""
    ours_n: str = ""
    verdict: Verdict = field(default_factory=lambda: Verdict(NOT_COMPARABLE))
    note: Note | None = None


@dataclass
class Section:
    """One table's comparison through one config (or its primary comparison across
    configs), or a labelled variant."""

    table: int
    lines: list[Line]
    variant: str = ""
    configs: list[str] = field(default_factory=list)
    interval: str = "95% CI"  # what the bracket beside our value is

    def counts(self) -> dict[str, int]:
        out = {REPRODUCED: 0, DIFFERS: 0, UNEXPLAINED: 0, NOT_COMPARABLE: 0}
        for line in self.lines:
            out[line.verdict.kind] += 1
            if line.verdict.kind == DIFFERS and line.note is None:
                out[UNEXPLAINED] += 1
        return out


def _paper_text(base: PaperCell, parts: Mapping[str, PaperCell]) -> str:
    text = base.value
    if "lower" in parts and "upper" in parts:
        text += f" [{parts['lower'].value}, {parts['upper'].value}]"
    if "half-width" in parts:
        text += f" ± {parts['half-width'].value}"
    if "count" in parts:
        count = parts["count"]
        text += f" ({count.value}/{count.n})" if count.n else f" ({count.value})"
    return text


def _judged_cells(
    cells: Sequence[PaperCell], extra_parts: Mapping[str, tuple[str, str]]
) -> list[tuple[PaperCell, int, dict[str, PaperCell]]]:
    """(base cell, occurrence of its row label, its parts) in the paper's order. A column
    is a part when its name says so (`... / 95% CI lower`) or a config maps it `of` another
    (`extra_parts`: column -> (base column, part))."""
    columns = {c.column for c in cells}
    seen: dict[tuple[str, str], int] = {}
    bases: list[tuple[PaperCell, int, dict[str, PaperCell]]] = []
    index: dict[tuple[str, int, str], dict[str, PaperCell]] = {}
    pending: list[tuple[str, int, str, str, PaperCell]] = []
    for cell in cells:
        occurrence = seen.get((cell.row, cell.column), 0)
        seen[(cell.row, cell.column)] = occurrence + 1
        base, part = split_part(cell.column)
        if part is None and cell.column in extra_parts:
            base, part = extra_parts[cell.column]
        if part is not None and base in columns:
            pending.append((cell.row, occurrence, base, part, cell))
            continue
        parts: dict[str, PaperCell] = {}
        index[(cell.row, occurrence, cell.column)] = parts
        bases.append((cell, occurrence, parts))
    for row, occurrence, base, part, cell in pending:
        target = index.get((row, occurrence, base))
        if target is not None:
            target[part] = cell
    return bases


def _mapping_for(
    srcs: Sequence[Source], table: int, row: str, occurrence: int, column: str, variant: bool
) -> tuple[Source, PaperTableModel, PaperRowModel, PaperColumnModel] | str:
    """The (source, entry, row, column) that maps a cell, or the reason none does."""
    reasons: list[str] = []
    for src in srcs:
        for _, entry in src.entries(table):
            if bool(entry.variant) != variant:
                continue
            col = entry.columns.get(column)
            targets = _targets(entry, row)
            if col is not None and occurrence < len(targets):
                return src, entry, targets[occurrence], col
            if col is not None or column in entry.unmapped:
                why = entry.unmapped.get(row) or entry.unmapped.get(column)
                if why is None:
                    why = f"row {row!r} is not mapped" if col is not None else f"column {column!r} is not mapped"
                reasons.append(f"{why} ({src.name})")
            elif row in entry.unmapped:
                reasons.append(f"{entry.unmapped[row]} ({src.name})")
    if reasons:
        return "not mapped: " + "; ".join(dict.fromkeys(reasons))
    names = ", ".join(s.name for s in srcs)
    return f"not mapped: no config maps column {column!r}" + (f" ({names})" if names else "")


def compare_table(
    table: int,
    srcs: Sequence[Source],
    measurers: Mapping[str, Measurer],
    notes: Sequence[Note],
    variant: Source | None = None,
    not_run: Mapping[str, str] | None = None,
) -> Section:
    """The comparison of one paper table: through every config that maps it as its primary
    reproduction, or (`variant`) through one labelled variant. A config in `not_run` (name
    -> why) has no records: its cells are not comparable, for that reason."""
    cells = cells_by_table()[table]
    pool = [variant] if variant is not None else [s for s in srcs if any(not e.variant for _, e in s.entries(table))]
    extra: dict[str, tuple[str, str]] = {}
    for src in pool:
        for _, entry in src.entries(table):
            for label, col in entry.columns.items():
                if col.of is not None and col.part is not None:
                    extra[label] = (col.of, col.part)
    lines: list[Line] = []
    for base, occurrence, parts in _judged_cells(cells, extra):
        line = Line(
            row=base.row,
            occurrence=occurrence,
            column=base.column,
            paper=_paper_text(base, parts),
            paper_n=str(base.n) if base.n else "—",
        )
        lines.append(line)
        if not pool:
            line.verdict = Verdict(NOT_COMPARABLE, NO_CONFIG)
            continue
        found = _mapping_for(pool, table, base.row, occurrence, base.column, variant is not None)
        if isinstance(found, str):
            line.verdict = Verdict(NOT_COMPARABLE, found)
            continue
        src, entry, target, column = found
        mode = target.mode or src.config.modes[0]
        cell = selection(src.config, target.cell, column.cell)
        line.where = f"{src.name}: {mode}" + (f", {format_cell(sorted(cell.items()))}" if cell else "")
        if src.name not in measurers:
            why = (not_run or {}).get(src.name, "no run")
            line.verdict = Verdict(NOT_COMPARABLE, f"not run: {why}")
            continue
        ours = measure(measurers[src.name], mode, cell, column, column.requires or entry.requires)
        line.ours = ours.text
        line.ours_n = str(ours.n)
        line.verdict = judge(base, ours)
        if line.verdict.kind == DIFFERS:
            line.note = find_note(notes, table, base.row, base.column, src.name)
    names = [s.name for s in pool]
    # A config may map a table and, in another entry, a variant of it: label the variant's.
    label = next((e.variant for _, e in variant.entries(table) if e.variant), "") if variant else ""
    return Section(table, lines, label, names)


# --------------------------------------------------------------------------- benchmarks

#: A timing is reproduced when ours is within this factor of the paper's, either way.
TIMING_FACTOR = 3.0
#: Repeats of a benchmark's measurement (each with the paper's N): full, --quick.
BENCH_REPEATS = (5, 3)
BENCH_DIR = "benchmarks"

TIMING_RULE = (
    "**Timings** (Table 17, µs) cannot come from trial records, which are the same for the "
    "same seed: `atomix reproduce` measures them with `harness.bench.runtime` in a fresh process, with "
    f"the paper's N (runs per row), repeated {BENCH_REPEATS[0]} times ({BENCH_REPEATS[1]} "
    "with --quick); ours is the median of the repeats' figures, shown with their range. Two "
    "machines' wall-clock figures differ by their speed and load, so a timing is "
    f"**reproduced** when 1/{TIMING_FACTOR:g} <= ours / paper <= {TIMING_FACTOR:g} and "
    "**differs** otherwise (the machine, its load and the measurement file are listed under "
    "Runs; delete that file to measure again)."
)


@dataclass(frozen=True)
class Benchmark:
    """A paper table measured by a timing benchmark rather than by trial records. `measure`
    (runs, repeats) returns, per paper row and column label, one figure per repeat; `row_name`
    says what a row label is (Table 17's rows are K)."""

    table: int
    name: str
    runs: int
    measure: Callable[[int, int], dict[str, dict[str, list[float]]]]
    row_name: str = "row"


_SPECULATION_COLUMNS = {"setup": "Setup (μs)", "commit": "Commit (μs)", "total": "Total (μs)", "p99": "p99 (μs)"}


def speculation_latency(runs: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Table 17 by `harness.bench.runtime.speculation_table`, in a fresh process (so that this one's
    heap and caches neither slow nor flatter it): row K -> column -> one figure per repeat."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import json, sys, harness.bench.runtime as b; "
        "json.dump(b.speculation_table(int(sys.argv[1]), int(sys.argv[2])), sys.stdout)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code, str(runs), str(repeats)],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RunError(f"the speculation benchmark failed: {proc.stderr.strip()[-2000:]}")
    table = json.loads(proc.stdout)
    return {
        k: {_SPECULATION_COLUMNS[name]: [rep[name] for rep in reps] for name in _SPECULATION_COLUMNS}
        for k, reps in table.items()
    }


#: Paper tables measured by a benchmark, not by a config's trials.
BENCHMARKS: dict[int, Benchmark] = {
    17: Benchmark(17, "harness.bench.runtime speculation_table", 200, speculation_latency, row_name="K"),
}


def judge_timing(paper: PaperCell, ours: float) -> Verdict:
    """The timing rule (`TIMING_RULE`) for one paper cell and our figure, both in µs."""
    if paper.value.strip().startswith("~"):
        return Verdict(NOT_COMPARABLE, f"the paper's value {paper.value} is approximate")
    if math.isnan(ours) or paper.number <= 0:
        return Verdict(NOT_COMPARABLE, "no figure to compare")
    ratio = ours / paper.number
    shown = f"ours / paper = {ratio:.2g}"
    if 1 / TIMING_FACTOR <= ratio <= TIMING_FACTOR:
        return Verdict(REPRODUCED, f"{shown}, within a factor of {TIMING_FACTOR:g}")
    return Verdict(DIFFERS, f"{shown}, {'below' if ratio < 1 else 'above'} a factor of {TIMING_FACTOR:g}")


def _machine() -> dict[str, Any]:
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average": load}


def run_benchmark(bench: Benchmark, out: Path, quick: bool,
                  say: Callable[[str], None] = lambda _: None) -> tuple[Path, dict[str, Any]]:
    """The benchmark's measurement file under `out` (reused when it has the same runs and
    repeats), measuring now if there is none."""
    repeats = BENCH_REPEATS[1] if quick else BENCH_REPEATS[0]
    path = Path(out) / BENCH_DIR / f"table{bench.table}.json"
    if path.is_file():
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            found = None
        if isinstance(found, dict) and found.get("runs") == bench.runs and found.get("repeats") == repeats:
            say(f"Table {bench.table}: measurement {path} reused")
            return path, found
    say(f"Table {bench.table}: {bench.name}, {bench.runs} runs per row x {repeats} repeats")
    before = _machine()
    figures = bench.measure(bench.runs, repeats)
    data = {"table": bench.table, "benchmark": bench.name, "runs": bench.runs, "repeats": repeats,
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": before,
            "load_average_after": _machine()["load_average"], "figures": figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)
    return path, data


def benchmark_section(bench: Benchmark, data: Mapping[str, Any], notes: Sequence[Note]) -> Section:
    """A benchmark table's comparison: every paper cell judged by `judge_timing`."""
    figures: Mapping[str, Mapping[str, list[float]]] = data["figures"]
    lines: list[Line] = []
    for base, occurrence, parts in _judged_cells(cells_by_table()[bench.table], {}):
        line = Line(row=base.row, occurrence=occurrence, column=base.column,
                    paper=_paper_text(base, parts), paper_n=str(base.n) if base.n else "—")
        lines.append(line)
        values = figures.get(base.row, {}).get(base.column)
        if not values:
            line.verdict = Verdict(NOT_COMPARABLE, f"{bench.name} gives no figure for this cell")
            continue
        ours = statistics.median(values)
        line.ours = f"{_num(ours)} [{_num(min(values))}, {_num(max(values))}]"
        line.ours_n = f"{data['runs']} x {data['repeats']}"
        line.where = f"{bench.name}: {bench.row_name} = {base.row}"
        line.verdict = judge_timing(base, ours)
        if line.verdict.kind == DIFFERS:
            line.note = find_note(notes, bench.table, base.row, base.column, None)
    return Section(bench.table, lines, configs=[bench.name], interval="range of the repeats")


# --------------------------------------------------------------------------- the file


@dataclass
class Outcome:
    """What `reproduce` did: the file it wrote, the sections (one primary per table, then
    its variants) and the time it took."""

    path: Path
    sections: list[Section]
    runs: dict[str, Path]
    wall_s: float
    cpu_s: float


def revision() -> str:
    """`git describe` and the commit of the checkout, or "unknown"."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=here)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() or None if out.returncode == 0 else None

    described = git("describe", "--always", "--dirty", "--tags")
    commit = git("rev-parse", "HEAD")
    if commit is None:
        return "unknown"
    return f"{described} ({commit})" if described and not commit.startswith(described) else commit


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def _md(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


def _row_label(line: Line, repeats: Mapping[str, int]) -> str:
    if repeats.get(line.row, 1) > 1:
        return f"{line.row} ({line.occurrence + 1} of {repeats[line.row]})"
    return line.row


def _section_markdown(section: Section) -> list[str]:
    repeats: dict[str, int] = {}
    for line in section.lines:
        repeats[line.row] = max(repeats.get(line.row, 0), line.occurrence + 1)
    out: list[str] = []
    counts = section.counts()
    out.append(
        f"Configs: {', '.join(f'`{n}`' for n in section.configs) or 'none'}. "
        f"Reproduced {counts[REPRODUCED]}, differs {counts[DIFFERS]}"
        f"{f' ({counts[UNEXPLAINED]} {UNEXPLAINED})' if counts[UNEXPLAINED] else ''}, "
        f"not comparable {counts[NOT_COMPARABLE]}."
    )
    out += ["", f"| paper row | paper column | paper | ours [{section.interval}] | our mode, cell | N paper / ours | verdict |"]
    out.append("| :--- | :--- | ---: | ---: | :--- | ---: | :--- |")
    footnotes: list[Note] = []
    for line in section.lines:
        verdict = line.verdict.kind
        if line.verdict.kind == DIFFERS:
            if line.note is None:
                verdict += f" — **{UNEXPLAINED}** ({line.verdict.reason})"
            else:
                if line.note not in footnotes:
                    footnotes.append(line.note)
                verdict += f" [{footnotes.index(line.note) + 1}] ({line.verdict.reason})"
        elif line.verdict.kind == NOT_COMPARABLE:
            verdict += f": {line.verdict.reason}"
        n = f"{line.paper_n} / {line.ours_n or '—'}"
        out.append(
            "| "
            + " | ".join(
                _md(x)
                for x in (
                    _row_label(line, repeats), line.column, line.paper, line.ours,
                    line.where or "—", n, verdict,
                )
            )
            + " |"
        )
    out.append("")
    for i, note in enumerate(footnotes, 1):
        out += [f"[{i}] {note.why}", ""]
    return out


def render(
    sections: Sequence[Section],
    runs: Mapping[str, tuple[Path, ExperimentConfig]],
    *,
    command: str,
    quick: bool,
    out: Path,
    wall_s: float,
    cpu_s: float,
    when: str | None = None,
    rev: str | None = None,
    not_run: Mapping[str, str] | None = None,
    benchmarks: Mapping[str, str] | None = None,
) -> str:
    """REPRODUCTION.md: header, rule, summary, then each table in order with its variants.
    `benchmarks`: name -> what was measured where (listed under Runs)."""
    when = when or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mode = (
        f"quick (N per cell and mode = a fifth of each config's trials, at least {QUICK_FLOOR}, "
        "at most the config's own)"
        if quick
        else "full (each config's own N, the paper's where the config follows it)"
    )
    captions = tables()
    lines = [
        "# Reproduction of the paper's result tables",
        "",
        f"- Revision: {rev or revision()}",
        f"- Date: {when}",
        f"- Command: `{command}`",
        f"- Mode: {mode}",
        f"- Time: {wall_s:.0f} s wall, {cpu_s:.0f} s CPU (this process and its workers) for "
        "this invocation; finished runs under the output directory are reused, not re-run",
        "",
        "Generated by `atomix reproduce` from `harness/paper/paper_cells.csv` (the paper's cells), "
        "each config's `paper:` section (the mapping), the runs' trial records and "
        "`harness/paper/paper_notes.yaml` (the explanations). Do not edit by hand.",
        "",
        "## Verdict rule",
        "",
        RULE,
        "",
        TIMING_RULE,
        "",
        "## Runs",
        "",
        "| config | run | N per cell and mode |",
        "| :--- | :--- | ---: |",
    ]
    for name, (run_dir, config) in sorted(runs.items()):
        base = out.resolve()  # runs are listed relative to the output directory
        shown = run_dir.resolve().relative_to(base) if run_dir.resolve().is_relative_to(base) else run_dir
        lines.append(f"| `{name}` | `{shown}` | {config.trials} |")
    for name, why in sorted((not_run or {}).items()):
        lines.append(f"| `{name}` | not run: {_md(why)} | — |")
    for name, what in sorted((benchmarks or {}).items()):
        lines.append(f"| `{name}` (benchmark) | {_md(what)} | see the table |")
    if not runs and not not_run and not benchmarks:
        lines.append("| — | — | — |")
    lines += [
        "",
        "## Summary",
        "",
        "Counts of judged cells (a value with its interval or count is one cell).",
        "",
        "| table | configs | reproduced | differs | of which unexplained | not comparable |",
        "| :--- | :--- | ---: | ---: | ---: | ---: |",
    ]
    for s in sections:
        c = s.counts()
        label = f"{s.table}" if not s.variant else f"{s.table} (variant)"
        configs = ", ".join(f"`{n}`" for n in s.configs) or NO_CONFIG
        lines.append(
            f"| {label} | {configs} | {c[REPRODUCED]} | {c[DIFFERS]} | {c[UNEXPLAINED]} | "
            f"{c[NOT_COMPARABLE]} |"
        )
    lines.append("")
    for s in sections:
        if s.variant:
            lines += [
                f"### Table {s.table}, labelled variant: `{', '.join(s.configs)}`",
                "",
                f"Not the reproduction of Table {s.table}: {_md(s.variant)}",
                "",
            ]
        else:
            lines += [f"## Table {s.table}", "", f"> {captions[s.table]}", ""]
        lines += _section_markdown(s)
    return "\n".join(lines).rstrip() + "\n"


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
) -> Outcome:
    """Run (or reuse, or resume) every config that maps a wanted table under `out`, then
    write `out/REPRODUCTION.md`. ConfigError for a bad config, mapping or notes file (before
    any trial runs), RunError when a run cannot start or resume."""
    start_wall, start_cpu = time.perf_counter(), _cpu_s()
    wanted = sorted(set(wanted or tables()))
    notes = load_notes(notes_path)
    srcs = sources(configs_dir, wanted, quick)
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
    from harness.analysis.runs import load_run

    not_run: dict[str, str] = {}
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
    wall, cpu = time.perf_counter() - start_wall, _cpu_s() - start_cpu
    text = render(
        sections, runs, command=command, quick=quick, out=out, wall_s=wall, cpu_s=cpu,
        not_run=not_run, benchmarks=measured,
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_NAME
    tmp = path.with_name(f".{REPORT_NAME}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return Outcome(path, sections, {k: v[0] for k, v in runs.items()}, wall, cpu)


def _metric_problems(src: Source) -> list[str]:
    """Mapped columns whose metric no trial record has (one probe trial for a name that is
    not a known metric, as `check_report` does)."""
    from harness.analysis.runs import KNOWN_METRICS
    from harness.experiment.runner import plan
    from harness.experiment.trial import run_trial

    named = [
        (i, label, col.metric)
        for i, entry in enumerate(src.config.paper)
        for label, col in entry.columns.items()
        if col.metric is not None
    ]
    unknown = [x for x in named if x[2] not in KNOWN_METRICS]
    if not unknown:
        return []
    metrics = sorted(run_trial(plan(src.config)[0])["metrics"])
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

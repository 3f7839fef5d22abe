"""Tables and plots built from trial records only; this module never runs a trial.

A trial record is one JSON object per line (see ``results/``) with ``mode``, ``cell``,
``cell_id``, ``trial``, ``metrics`` and ``exercised``. ``records_frame`` flattens records,
``build_table`` aggregates one metric into a :class:`Table` (long form + display strings),
and the renderers turn a Table into Markdown, CSV, LaTeX, a rich table, or deterministic
plots.

A condition that never occurred is not a result (DESIGN.md §5): a table cell whose
trials never exercised what the table measures (``TableSpec.requires``; by default, a
cell configured to inject faults that injected none) reads ``n/a (not exercised)``, has
``exercised`` false and no value in the CSV, and is left out of plots.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table as RichTable
from rich.text import Text

from harness.analysis.stats import (
    INTERVAL_METHODS,
    METHOD_LABELS,
    interval,
    mean_ci,
    poisson_interval,
)

__all__ = [
    "EXERCISED_COUNTS",
    "KINDS",
    "NOT_EXERCISED_TEXT",
    "PLOT_KINDS",
    "REQUIRES",
    "PlotSpec",
    "Table",
    "TableSpec",
    "bar_plot",
    "build_table",
    "exercised_counts",
    "exercised_csv",
    "exercised_frame",
    "exercised_markdown",
    "is_exercised",
    "latex_escape",
    "line_plot",
    "read_records",
    "records_frame",
    "to_csv",
    "to_latex",
    "to_markdown",
    "to_rich",
    "write_exercised",
    "write_report",
    "write_table",
]

KINDS: tuple[str, ...] = ("proportion", "mean", "per_1000", "sum")
PLOT_KINDS: tuple[str, ...] = ("bar", "line")
BASE_COLUMNS: tuple[str, ...] = ("key", "mode", "cell_id", "trial", "seed")
NA_TEXT = "n/a"
NOT_EXERCISED_TEXT = "n/a (not exercised)"
#: The stem of the per-run table of what every mode x cell exercised (a reserved table name).
EXERCISED_NAME = "exercised"

FAULT_CLASSES: tuple[str, ...] = ("F1", "F2", "F3", "F4", "F5")
#: Counts a trial record's ``exercised`` holds, as ``records_frame`` names them (``x.<name>``)
#: and as table CSVs and the exercised table name them.
EXERCISED_COUNTS: tuple[str, ...] = (
    *(f"faults_{c}" for c in FAULT_CLASSES),
    "faults_total",
    "aborts",
    "compensations",
    "irreversible_calls",
    "sends",
)
#: What a table may require to have occurred in a cell for the cell to be a result.
#: "none" turns the check off; no `requires` applies the default rule (see is_exercised).
REQUIRES: tuple[str, ...] = (
    "faults",
    *FAULT_CLASSES,
    "aborts",
    "compensations",
    "irreversible_calls",
    "sends",
    "none",
)
_REQUIRES_COUNT = {"faults": "faults_total", **{c: f"faults_{c}" for c in FAULT_CLASSES}}
_REQUIRES_TEXT = {
    None: "the cell injects faults but none was injected in its trials",
    "faults": "no fault was injected in the cell's trials",
    **{c: f"no {c} fault was injected in the cell's trials" for c in FAULT_CLASSES},
    "aborts": "no transaction aborted in the cell's trials",
    "compensations": "nothing was compensated in the cell's trials",
    "irreversible_calls": "no irreversible call was made in the cell's trials",
    "sends": "no message reached the sink in the cell's trials",
    "none": "",
}

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# --------------------------------------------------------------------------- records


def read_records(path: Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file of trial records (blank lines are skipped)."""
    records: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not a JSON record: {exc}") from None
    return records


def _fmt_value(v: Any) -> str:
    """Label text for a cell parameter or row value: 0.1 -> "0.1", 0.0 -> "0"."""
    if v is None:
        return "NA"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NA"
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


def _hashable(v: Any) -> Any:
    # Lists/dicts in a cell cannot be grouped on; a canonical JSON string can.
    if isinstance(v, list | dict | tuple):
        return json.dumps(v, sort_keys=True)
    return v


def _norm(v: Any) -> Any:
    """Missing values (None, NaN, pd.NA) become None; numpy scalars become Python ones."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _sort_key(v: Any) -> tuple[int, Any]:
    # Numbers sort numerically, then strings, then missing: never a mixed-type comparison.
    if v is None:
        return (3, "")
    if isinstance(v, bool):
        return (0, int(v))
    if isinstance(v, int | float):
        return (1, float(v))
    return (2, str(v))


def _exercised_columns(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A record's ``exercised`` as ``x.<count>``, ``x.fault_classes`` and ``x.faults_armed``.

    A record written before trials said what they exercised has its fault counts read from
    its ``faults`` list and its aborts from its metrics; what cannot be recovered (the
    other counts, whether faults were armed) is None, which never makes a cell n/a.
    """
    ex = rec.get("exercised")
    if isinstance(ex, Mapping):
        per_class = ex.get("faults") or {}
        out: dict[str, Any] = {f"x.faults_{c}": int(per_class.get(c, 0)) for c in FAULT_CLASSES}
        for name in EXERCISED_COUNTS[len(FAULT_CLASSES) :]:
            v = ex.get(name)
            out[f"x.{name}"] = None if v is None else int(v)
        classes = ex.get("fault_classes")
        out["x.fault_classes"] = None if classes is None else ",".join(map(str, classes))
        armed = ex.get("faults_armed")
        out["x.faults_armed"] = None if armed is None else bool(armed)
        return out
    out = {f"x.{name}": None for name in EXERCISED_COUNTS}
    injected = rec.get("faults")
    if isinstance(injected, list):
        for c in FAULT_CLASSES:
            out[f"x.faults_{c}"] = sum(1 for f in injected if str(f.get("fault")) == c)
        out["x.faults_total"] = len(injected)
    aborts = (rec.get("metrics") or {}).get("aborts")
    if isinstance(aborts, int | float) and not isinstance(aborts, bool):
        out["x.aborts"] = int(aborts)
    out["x.fault_classes"] = None
    out["x.faults_armed"] = None
    return out


#: Columns of ``records_frame`` that come from a record's ``exercised``.
X_COLUMNS: tuple[str, ...] = (
    *(f"x.{name}" for name in EXERCISED_COUNTS),
    "x.fault_classes",
    "x.faults_armed",
)


def records_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per trial record.

    Columns: ``key, mode, cell_id, trial, seed``, then ``cell.<param>`` and ``m.<metric>``
    (each group sorted by name), then what the trial exercised: ``x.<count>`` for each of
    ``EXERCISED_COUNTS``, ``x.fault_classes`` (comma-separated) and ``x.faults_armed``
    (None where a record does not say). Metric values are kept as given, so bools stay
    bool. Rows are sorted by (mode, cell_id, trial, key). A repeated ``key`` raises
    ValueError, because a trial counted twice would silently inflate N.
    """
    rows: list[dict[str, Any]] = []
    seen: dict[Any, int] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise TypeError(f"record {i} is {type(rec).__name__}, not a mapping")
        missing = [f for f in ("mode", "metrics") if f not in rec]
        if missing:
            raise ValueError(f"record {i} lacks {', '.join(missing)}")
        cell = rec.get("cell") or {}
        cell_id = rec.get("cell_id")
        if cell_id is None:
            cell_id = ", ".join(f"{k}={_fmt_value(_hashable(cell[k]))}" for k in sorted(cell))
        row: dict[str, Any] = {
            "key": rec.get("key"),
            "mode": str(rec["mode"]),
            "cell_id": str(cell_id),
            "trial": rec.get("trial"),
            "seed": rec.get("seed"),
        }
        row.update({f"cell.{k}": _hashable(v) for k, v in cell.items()})
        row.update({f"m.{k}": v for k, v in rec["metrics"].items()})
        row.update(_exercised_columns(rec))
        key = row["key"]
        if key is not None:
            if key in seen:
                raise ValueError(
                    f"duplicate trial key {key!r} in records {seen[key]} and {i}: "
                    "a repeated trial would inflate N"
                )
            seen[key] = i
        rows.append(row)
    cell_cols = sorted({c for r in rows for c in r if c.startswith("cell.")})
    metric_cols = sorted({c for r in rows for c in r if c.startswith("m.")})
    df = pd.DataFrame(rows, columns=[*BASE_COLUMNS, *cell_cols, *metric_cols, *X_COLUMNS])
    if not df.empty:
        df = df.sort_values(
            ["mode", "cell_id", "trial", "key"], kind="mergesort", na_position="last"
        )
    return df.reset_index(drop=True)


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class TableSpec:
    """What one table aggregates. Validated on construction (kind, method, confidence).

    ``columns`` are cell parameters that become columns; ``rows`` is a record column
    (default ``mode``) or a cell parameter. ``row_order`` lists rows to put first.
    ``requires`` names what must have occurred in a cell's trials for the cell to be a
    result (one of ``REQUIRES``; see :func:`is_exercised`).
    """

    name: str
    metric: str
    kind: str  # "proportion" | "mean" | "per_1000" | "sum"
    columns: tuple[str, ...] = ()
    rows: str = "mode"
    title: str = ""
    method: str = "clopper-pearson"
    row_order: tuple[str, ...] = ()
    confidence: float = 0.95
    requires: str | None = None
    #: The cell parameters in the order cell ids name them: a column header lists its
    #: parameters in this order, so it reads exactly as the records' cell_id.
    label_order: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"table name {self.name!r} must match {_NAME_RE.pattern}")
        if self.kind not in KINDS:
            raise ValueError(f"unknown table kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.method not in INTERVAL_METHODS:
            allowed = ", ".join(sorted(INTERVAL_METHODS))
            raise ValueError(f"unknown interval method {self.method!r}; allowed: {allowed}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if self.rows in self.columns:
            raise ValueError(f"{self.rows!r} cannot be both the rows and a column")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"repeated column parameter in {self.columns!r}")
        if self.requires is not None and self.requires not in REQUIRES:
            raise ValueError(
                f"requires: unknown requirement {self.requires!r}; allowed: {', '.join(REQUIRES)}"
            )


@dataclass
class Table:
    """An aggregated table: ``data`` (long form) and ``display`` (wide form of strings).

    ``data`` has one row per (row, column) cell of the full grid, including cells with no
    trials (n == 0), with columns ``row, column, cell.<param>..., n, total, value, lo, hi,
    method, text, exercised, requires``, then the cell's summed ``EXERCISED_COUNTS``
    (``faults_F1`` ... ``sends``; empty where the records do not say). ``total`` is
    successes (proportion) or the metric's sum; ``value``, ``lo``, ``hi`` are fractions for
    proportions, per-1,000 rates for per_1000, raw units for mean, and the total (no
    interval, lo/hi NaN) for sum. A cell that was not exercised (``exercised`` false, with
    trials) has NaN value/lo/hi and the text ``n/a (not exercised)``; ``requires`` is the
    requirement applied (``default`` when the spec names none). ``display`` has the row
    labels as index (named ``spec.rows``) and the column labels as columns, in order.
    """

    spec: TableSpec
    data: pd.DataFrame
    display: pd.DataFrame

    @property
    def title(self) -> str:
        return self.spec.title or self.spec.name

    def n_by_cell(self) -> dict[tuple[str, str], int]:
        """N for every (row label, column label)."""
        return {
            (r, c): int(n)
            for r, c, n in zip(self.data["row"], self.data["column"], self.data["n"], strict=True)
        }

    @property
    def n_text(self) -> str:
        """Text like ``N = 30 per cell``; N is stated per column or per cell if it varies."""
        return _n_text(self)

    @property
    def not_exercised(self) -> list[tuple[str, str]]:
        """(row label, column label) of every cell with trials that was not exercised."""
        d = self.data
        mask = (d["n"] > 0) & ~d["exercised"].astype(bool)
        return list(zip(d.loc[mask, "row"], d.loc[mask, "column"], strict=True))

    @property
    def exercised_note(self) -> str:
        """What an ``n/a (not exercised)`` cell means, or "" when the table has none."""
        if not self.not_exercised:
            return ""
        return f" {NOT_EXERCISED_TEXT}: {_REQUIRES_TEXT[self.spec.requires]}; no rate is claimed."

    @property
    def footer(self) -> str:
        """N per cell plus what the cells and intervals are."""
        return f"{self.n_text}; {_method_text(self)}{self.exercised_note}"

    @property
    def plot_note(self) -> str:
        """Footnote for plots: N per cell plus what the bars/points and intervals are."""
        # Plots have room for about two lines; the full per-cell N is in the CSV.
        note = f"{_n_text(self, max_chars=160)}; {_method_text(self, plot=True)}"
        if self.not_exercised:
            note += f" Cells not exercised ({_REQUIRES_TEXT[self.spec.requires]}) are not drawn."
        return note


def _resolve(df: pd.DataFrame, name: str, prefer_cell: bool) -> str:
    candidates = [f"cell.{name}", name] if prefer_cell else [name, f"cell.{name}"]
    for c in candidates:
        if c in df.columns:
            return c
    params = sorted(c.removeprefix("cell.") for c in df.columns if c.startswith("cell."))
    raise ValueError(f"no record column or cell parameter {name!r}; cell parameters: {params}")


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool | np.bool_)


def _as_binary(values: list[Any], metric: str) -> list[int]:
    out: list[int] = []
    for v in values:
        if _is_bool(v) or (isinstance(v, int | float) and v in (0, 1)):
            out.append(int(v))
        else:
            raise ValueError(
                f"metric {metric!r} has non-boolean value {v!r}; "
                "use kind 'per_1000', 'sum' or 'mean' for counts"
            )
    return out


def _as_counts(values: list[Any], metric: str) -> list[int]:
    out: list[int] = []
    for v in values:
        if not isinstance(v, int | float) or v < 0 or not float(v).is_integer():
            raise ValueError(f"metric {metric!r} must be a non-negative count, got {v!r}")
        out.append(int(v))
    return out


def _fmt_number(v: float, decimals: int) -> str:
    """Fixed decimals, but never print a non-zero value as zero."""
    if math.isnan(v):
        return NA_TEXT
    d = decimals
    text = f"{v:.{d}f}"
    while v != 0 and float(text) == 0 and d < 12:
        d += 1
        text = f"{v:.{d}f}"
    # Only an exact zero gets here with float(text) == 0; do not print it as "-0.00".
    return text.lstrip("-") if float(text) == 0 else text


def _fmt_mean(m: float) -> str:
    return _fmt_number(m, 2 if abs(m) < 10 else 1)


def _fmt_rate(v: float) -> str:
    if math.isnan(v):
        return NA_TEXT
    if float(v).is_integer():
        return str(int(v))
    return _fmt_number(v, 0 if abs(v) >= 100 else 1)


def _cell(spec: TableSpec, values: list[Any], bool_metric: bool) -> dict[str, Any]:
    """Aggregate one cell's metric values (missing values already dropped)."""
    n = len(values)
    conf = spec.confidence
    if spec.kind == "proportion":
        k = sum(_as_binary(values, spec.metric))
        p = interval(k, n, spec.method, conf)
        return dict(n=n, total=k, value=p.rate, lo=p.lo, hi=p.hi, method=spec.method, text=p.pct())
    if spec.kind == "mean":
        xs = [float(v) for v in values]
        m, lo, hi = mean_ci(xs, conf)
        return dict(n=n, total=math.fsum(xs), value=m, lo=lo, hi=hi, method="t", text=_fmt_mean(m))
    if spec.kind == "per_1000":
        if bool_metric:
            k = sum(_as_binary(values, spec.metric))
            p = interval(k, n, spec.method, conf)
            lo, hi, method = 1000 * p.lo, 1000 * p.hi, spec.method
        else:
            # Counts can exceed 1 per trial, so a binomial interval does not apply.
            k = sum(_as_counts(values, spec.metric))
            c_lo, c_hi = poisson_interval(k, conf)
            lo, hi, method = 1000 * c_lo / max(n, 1), 1000 * c_hi / max(n, 1), "poisson-exact"
        value = 1000 * k / n if n else math.nan
        if n == 0:
            lo = hi = math.nan  # no trials: no rate and no interval to claim
        return dict(n=n, total=k, value=value, lo=lo, hi=hi, method=method, text=_fmt_rate(value))
    # sum: raw totals, no interval claimed.
    if bool_metric:
        total: float | int = sum(_as_binary(values, spec.metric))
    else:
        xs = [float(v) for v in values]
        total = math.fsum(xs)
        if all(x.is_integer() for x in xs):
            total = int(total)
    total_text = str(total) if isinstance(total, int) else _fmt_mean(total)
    return dict(
        n=n,
        total=total,
        value=float(total),
        lo=math.nan,
        hi=math.nan,
        method="",
        text=f"{total_text}/{n}",
    )


def _sum_known(values: Iterable[Any]) -> int | None:
    """The sum of the known values, or None when no value is known."""
    known = [int(v) for v in (_norm(x) for x in values) if v is not None]
    return sum(known) if known else None


def exercised_counts(df: pd.DataFrame, index: Sequence[int] | None = None) -> dict[str, Any]:
    """Summed ``EXERCISED_COUNTS`` (None: unknown) over rows ``index`` of a records frame,
    plus ``faults_armed``: True when every one of those trials was set to inject faults."""
    sub = df if index is None else df.iloc[list(index)]
    out: dict[str, Any] = {}
    for name in EXERCISED_COUNTS:
        col = f"x.{name}"
        out[name] = _sum_known(sub[col].tolist()) if col in sub.columns else None
    armed = sub["x.faults_armed"].tolist() if "x.faults_armed" in sub.columns else []
    out["faults_armed"] = bool(armed) and all(_norm(a) is True for a in armed)
    return out


def is_exercised(counts: Mapping[str, Any], requires: str | None = None) -> bool:
    """Did a cell's trials exercise what is measured? ``counts`` as from :func:`exercised_counts`.

    ``requires`` None (the default rule): a cell whose every trial was set to inject faults
    (nonzero rate, or bursty arrival) must have had at least one injected; a fault-free
    cell (rate 0, e.g. a calibration column) is a result as it is. "faults": at least one
    fault injected (so a rate-0 cell is n/a too); "F1".."F5": one of that class; "aborts",
    "compensations", "irreversible_calls", "sends": at least one occurred; "none": always a
    result. A count the records do not hold (older records) never makes a cell n/a.
    """
    if requires == "none":
        return True
    if requires is None:
        if not counts.get("faults_armed"):
            return True
        name = "faults_total"
    else:
        if requires not in REQUIRES:
            raise ValueError(
                f"requires: unknown requirement {requires!r}; allowed: {', '.join(REQUIRES)}"
            )
        name = _REQUIRES_COUNT.get(requires, requires)
    value = counts.get(name)
    return value is None or value > 0


def build_table(df: pd.DataFrame, spec: TableSpec) -> Table:
    """Aggregate ``m.<spec.metric>`` over rows x column-parameter combinations.

    Every (row, column) pair of the grid appears in ``data``; one with no trials has
    n == 0 and shows ``n/a``; one whose trials did not exercise ``spec.requires`` (see
    :func:`is_exercised`) shows ``n/a (not exercised)`` and has no value. Missing metric
    values (NaN/None) are not counted in N.
    Rows: ``spec.row_order`` first (those present), then the rest sorted; columns sorted
    by parameter values (numbers numerically).
    """
    metric_col = f"m.{spec.metric}"
    if metric_col not in df.columns:
        metrics = sorted(c.removeprefix("m.") for c in df.columns if c.startswith("m."))
        raise ValueError(f"no metric {spec.metric!r} in records; metrics: {metrics}")
    row_col = _resolve(df, spec.rows, prefer_cell=False)
    col_cols = [_resolve(df, p, prefer_cell=True) for p in spec.columns]

    row_vals = [_norm(v) for v in df[row_col].tolist()]
    if col_cols:
        combos = list(zip(*[[_norm(v) for v in df[c].tolist()] for c in col_cols], strict=True))
    else:
        combos = [()] * len(df)
    metric_vals = [_norm(v) for v in df[metric_col].tolist()]
    present = [v for v in metric_vals if v is not None]
    # Decide bool-ness per table, not per cell, so every cell uses the same interval method.
    bool_metric = bool(present) and all(_is_bool(v) for v in present)

    groups: dict[tuple[Any, tuple[Any, ...]], list[Any]] = {}
    members: dict[tuple[Any, tuple[Any, ...]], list[int]] = {}
    for i, (r, c, v) in enumerate(zip(row_vals, combos, metric_vals, strict=True)):
        bucket = groups.setdefault((r, c), [])
        members.setdefault((r, c), []).append(i)
        if v is not None:
            bucket.append(v)

    unique_rows = list(dict.fromkeys(row_vals))
    by_label = {_fmt_value(r): r for r in unique_rows}
    first = [by_label[lbl] for lbl in dict.fromkeys(spec.row_order) if lbl in by_label]
    rest = sorted((r for r in unique_rows if r not in first), key=_sort_key)
    row_keys = first + rest
    col_keys = sorted(dict.fromkeys(combos), key=lambda c: tuple(_sort_key(v) for v in c))

    def col_label(combo: tuple[Any, ...]) -> str:
        if not spec.columns:
            return spec.metric
        from harness.experiment.config import format_cell  # the one spelling of a cell (as cell_id)

        pairs = list(zip(spec.columns, combo, strict=True))
        rank = {p: i for i, p in enumerate(spec.label_order)}
        pairs.sort(key=lambda pv: rank.get(pv[0], len(rank)))
        return format_cell(pairs)

    row_labels = [_fmt_value(r) for r in row_keys]
    col_labels = [col_label(c) for c in col_keys]
    long_rows: list[dict[str, Any]] = []
    matrix: list[list[str]] = []
    for r, r_label in zip(row_keys, row_labels, strict=True):
        texts: list[str] = []
        for c, c_label in zip(col_keys, col_labels, strict=True):
            cell = _cell(spec, groups.get((r, c), []), bool_metric)
            index = members.get((r, c), [])
            counts = exercised_counts(df, index)
            exercised = bool(index) and is_exercised(counts, spec.requires)
            if cell["n"] == 0:
                cell["text"] = NA_TEXT
            elif not exercised:
                # A condition that never occurred is not a result: no value, no interval.
                cell.update(value=math.nan, lo=math.nan, hi=math.nan, text=NOT_EXERCISED_TEXT)
            params = {f"cell.{p}": v for p, v in zip(spec.columns, c, strict=True)}
            long_rows.append(
                {
                    "row": r_label,
                    "column": c_label,
                    **params,
                    **cell,
                    "exercised": exercised,
                    "requires": spec.requires or "default",
                    **{name: counts[name] for name in EXERCISED_COUNTS},
                }
            )
            texts.append(cell["text"])
        matrix.append(texts)

    cols = [
        "row",
        "column",
        *(f"cell.{p}" for p in spec.columns),
        "n",
        "total",
        "value",
        "lo",
        "hi",
        "method",
        "text",
        "exercised",
        "requires",
        *EXERCISED_COUNTS,
    ]
    data = pd.DataFrame(long_rows, columns=cols)
    for name in EXERCISED_COUNTS:  # object dtype: counts stay ints, unknown stays None
        data[name] = pd.Series([row[name] for row in long_rows], index=data.index, dtype=object)
    display = pd.DataFrame(
        matrix, index=pd.Index(row_labels, name=spec.rows), columns=col_labels, dtype=object
    )
    return Table(spec=spec, data=data, display=display)


def _n_text(table: Table, max_chars: int | None = None) -> str:
    """Paper-style N statement; every cell's N can be read off it.

    Uniform: "N = 30 per cell". Otherwise N is stated per column, per row or per cell,
    whichever is constant, as the most common N plus exceptions ("N = 30 per cell except 10
    (fp=0)") or, when no N is in the majority, as a full list. With ``max_chars`` a longer
    statement is replaced by the range of N and a pointer to the CSV (for plot footnotes).
    """
    d = table.data
    nonzero = d[d["n"] > 0]
    if nonzero.empty:
        return "no trials"
    suffix = f" ({NA_TEXT}: no trials)" if (d["n"] == 0).any() else ""
    ns = sorted(set(nonzero["n"].tolist()))
    if len(ns) == 1:
        return f"N = {ns[0]} per cell{suffix}"
    groups: dict[str, int] | None = None
    for key in ("column", "row"):
        per = nonzero.groupby(key, sort=False)["n"].unique()
        if all(len(v) == 1 for v in per):
            groups = {str(k): int(v[0]) for k, v in per.items()}
            break
    if groups is None:
        groups = {
            f"{r}, {c}": int(n)
            for r, c, n in zip(nonzero["row"], nonzero["column"], nonzero["n"], strict=True)
        }
    counts = pd.Series(list(groups.values())).value_counts()
    # Most common N; ties go to the larger N so the exceptions are the smaller cells.
    common = max(counts.index, key=lambda n: (counts[n], n))
    if 2 * counts[common] > len(groups):
        parts = ", ".join(f"{n} ({g})" for g, n in groups.items() if n != common)
        text = f"N = {common} per cell except {parts}{suffix}"
    else:
        parts = ", ".join(f"{n} ({g})" for g, n in groups.items())
        text = f"N = {parts} per cell{suffix}"
    if max_chars is not None and len(text) > max_chars:
        text = f"N = {ns[0]}–{ns[-1]} per cell (per-cell N in the table's CSV){suffix}"
    return text


def _conf_pct(conf: float) -> str:
    return f"{100 * conf:.10g}%"


def _method_text(table: Table, plot: bool = False) -> str:
    spec = table.spec
    conf = _conf_pct(spec.confidence)
    methods = [m for m in dict.fromkeys(table.data["method"].tolist()) if m]
    label = ", ".join(METHOD_LABELS.get(m, m) for m in methods)
    if spec.kind == "proportion":
        if plot:
            return f"percent with {conf} {label} intervals."
        return f"{conf} {label} intervals. Values are percentages."
    what = {
        "mean": f"means of {spec.metric}",
        "per_1000": f"{spec.metric} per 1,000 trials",
        "sum": f"total {spec.metric}",
    }[spec.kind]
    if spec.kind == "sum":
        return f"{what} (no interval)." if plot else f"cells are {what} / N (no interval)."
    if plot:
        return f"{what} with {conf} {label} intervals."
    return f"cells are {what}; {conf} {label} intervals in the CSV."


# --------------------------------------------------------------------------- renderers


def _md_escape(s: str) -> str:
    return s.replace("|", r"\|")


def to_markdown(table: Table) -> str:
    """GitHub pipe table with a bold title line and a footer stating N and the method."""
    disp = table.display
    header = [str(disp.index.name), *map(str, disp.columns)]
    lines = [f"**{_md_escape(table.title)}**", ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    lines.append("| " + " | ".join([":---", *["---:"] * len(disp.columns)]) + " |")
    for label, row in zip(disp.index, disp.itertuples(index=False), strict=True):
        cells = [str(label), *map(str, row)]
        lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    lines += ["", _md_escape(table.footer), ""]
    return "\n".join(lines)


def _csv_value(v: Any) -> str:
    v = _norm(v)
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # shortest round-trip text: deterministic and lossless
    return str(v)


def to_csv(table: Table) -> str:
    """The long form with numeric value/lo/hi (repr floats, empty for NaN), "\\n" lines.

    Prefixed with ``table, metric, kind, confidence`` so the file describes itself.
    """
    spec = table.spec
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    cols = list(table.data.columns)
    writer.writerow(["table", "metric", "kind", "confidence", *cols])
    for rec in table.data.itertuples(index=False):
        writer.writerow(
            [
                spec.name,
                spec.metric,
                spec.kind,
                repr(spec.confidence),
                *(_csv_value(v) for v in rec),
            ]
        )
    return buf.getvalue()


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "–": "--",
    "—": "---",
}


def latex_escape(s: str) -> str:
    """Escape LaTeX specials (``% _ & # $ { } ~ ^ \\``) and map en/em dashes to ``--``/``---``."""
    out = "".join(_LATEX_SPECIALS.get(ch, ch) for ch in s)
    # A cell starting with "[" right after "\\" would be read as its optional argument.
    return "{" + out + "}" if out.startswith("[") else out


def to_latex(table: Table) -> str:
    """A booktabs table with headers grouped by cell parameter, sized to fit a column or
    the page (see :func:`harness.analysis.latex.table_latex`), captioned with N and the method."""
    from harness.analysis.latex import table_latex  # a sibling module that imports this one

    return table_latex(table)


def to_rich(table: Table) -> RichTable:
    """A rich Table for the terminal; cell text is literal (no rich markup parsing)."""
    disp = table.display
    rt = RichTable(title=Text(table.title), caption=Text(table.footer))
    rt.add_column(Text(str(disp.index.name)))
    for c in disp.columns:
        rt.add_column(Text(str(c)), justify="right")
    for label, row in zip(disp.index, disp.itertuples(index=False), strict=True):
        rt.add_row(Text(str(label)), *(Text(str(v)) for v in row))
    return rt


def _write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    return path


def write_table(table: Table, out_dir: Path) -> list[Path]:
    """Write ``<name>.md``, ``<name>.csv`` and ``<name>.tex`` into ``out_dir``."""
    out_dir = Path(out_dir)
    name = table.spec.name
    return [
        _write_text(out_dir / f"{name}.md", to_markdown(table)),
        _write_text(out_dir / f"{name}.csv", to_csv(table)),
        _write_text(out_dir / f"{name}.tex", to_latex(table)),
    ]


# --------------------------------------------------------------------------- exercised

EXERCISED_TITLE = "What each cell exercised (counts summed over its trials)"


def exercised_frame(
    df: pd.DataFrame, mode_order: Sequence[str] = (), cell_order: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per (mode, cell_id): how many trials, the summed ``EXERCISED_COUNTS`` (None:
    the records do not say), the fault classes the cell asked for and whether it was set to
    inject faults at all (``faults_armed``; None when the records do not say).

    Modes in ``mode_order`` first, then the rest sorted; cells likewise by ``cell_order``.
    """
    cols = ["mode", "cell_id", "trials", *EXERCISED_COUNTS, "fault_classes", "faults_armed"]
    positions: dict[tuple[str, str], list[int]] = {}
    for i, (m, c) in enumerate(zip(df["mode"].tolist(), df["cell_id"].tolist(), strict=True)):
        positions.setdefault((str(m), str(c)), []).append(i)

    def order(values: Iterable[str], first: Sequence[str]) -> list[str]:
        present = list(dict.fromkeys(values))
        head = [v for v in dict.fromkeys(first) if v in present]
        return head + sorted(v for v in present if v not in head)

    modes = order((m for m, _ in positions), mode_order)
    cells = order((c for _, c in positions), cell_order)
    rows: list[dict[str, Any]] = []
    for m in modes:
        for c in cells:
            index = positions.get((m, c))
            if not index:
                continue
            sub = df.iloc[index]
            counts = exercised_counts(df, index)
            classes = [_norm(v) for v in sub.get("x.fault_classes", pd.Series(dtype=object))]
            armed = [_norm(v) for v in sub.get("x.faults_armed", pd.Series(dtype=object))]
            known_classes = sorted({v for v in classes if v is not None})
            rows.append(
                {
                    "mode": m,
                    "cell_id": c,
                    "trials": len(index),
                    **{name: counts[name] for name in EXERCISED_COUNTS},
                    "fault_classes": "; ".join(known_classes) if known_classes else None,
                    "faults_armed": None if any(a is None for a in armed) else all(armed),
                }
            )
    return pd.DataFrame(rows, columns=cols, dtype=object)


def exercised_csv(frame: pd.DataFrame) -> str:
    """The exercised frame as CSV ("\n" lines; empty where the records do not say)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(list(frame.columns))
    for rec in frame.itertuples(index=False):
        writer.writerow([_csv_value(v) for v in rec])
    return buf.getvalue()


def exercised_markdown(frame: pd.DataFrame) -> str:
    """The exercised frame as a pipe table; "?" where the records do not say."""
    header = ["mode", "cell", "trials", *(n.removeprefix("faults_") for n in EXERCISED_COUNTS)]
    header[3 + len(FAULT_CLASSES)] = "faults"
    lines = [f"**{EXERCISED_TITLE}**", ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    lines.append("| " + " | ".join([":---", ":---", *["---:"] * (len(header) - 2)]) + " |")
    for rec in frame.to_dict("records"):
        cells = [rec["mode"], rec["cell_id"], rec["trials"], *(rec[n] for n in EXERCISED_COUNTS)]
        text = ["?" if _norm(v) is None else str(_norm(v)) for v in cells]
        lines.append("| " + " | ".join(_md_escape(t) for t in text) + " |")
    lines += [
        "",
        "Counts are summed over the cell's trials: injected faults per class and in total, "
        "aborts, compensations (undo deliveries in the op log), calls to irreversible tools, "
        "and messages the sink holds.",
        "",
    ]
    return "\n".join(lines)


def write_exercised(
    df: pd.DataFrame,
    out_dir: Path,
    mode_order: Sequence[str] = (),
    cell_order: Sequence[str] = (),
) -> list[Path]:
    """Write ``exercised.md`` and ``exercised.csv`` (one row per mode x cell) into ``out_dir``."""
    frame = exercised_frame(df, mode_order, cell_order)
    out_dir = Path(out_dir)
    return [
        _write_text(out_dir / f"{EXERCISED_NAME}.md", exercised_markdown(frame)),
        _write_text(out_dir / f"{EXERCISED_NAME}.csv", exercised_csv(frame)),
    ]


# --------------------------------------------------------------------------- plots


def bar_plot(table: Table, out_stem: Path) -> list[Path]:
    """Grouped dot-and-whisker bars, faceted; see :func:`harness.analysis.plots.bar_plot`."""
    from harness.analysis import plots  # imports this module; loaded only when a plot is drawn

    return plots.bar_plot(table, out_stem)


def line_plot(table: Table, x_param: str, out_stem: Path) -> list[Path]:
    """One line per row over ``x_param``, faceted; see :func:`harness.analysis.plots.line_plot`."""
    from harness.analysis import plots

    return plots.line_plot(table, x_param, out_stem)


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class PlotSpec:
    """A plot of one table: ``kind`` "bar", or "line" over the numeric cell parameter ``x``.

    Output stem is ``name`` or ``<table>-<kind>``.
    """

    table: str
    kind: str
    x: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PLOT_KINDS:
            raise ValueError(f"unknown plot kind {self.kind!r}; allowed: {', '.join(PLOT_KINDS)}")
        if self.kind == "line" and not self.x:
            raise ValueError("a line plot needs x (a numeric swept cell parameter)")
        if self.kind == "bar" and self.x:
            raise ValueError("x is only used by line plots")
        if self.name and not _NAME_RE.match(self.name):
            raise ValueError(f"plot name {self.name!r} must match {_NAME_RE.pattern}")

    @property
    def stem(self) -> str:
        return self.name or f"{self.table}-{self.kind}"


def write_report(
    records: Iterable[Mapping[str, Any]],
    specs: Sequence[TableSpec],
    out_dir: Path,
    plots: Sequence[PlotSpec] = (),
) -> list[Path]:
    """Write every table to ``out_dir/tables`` and every plot to ``out_dir/plots``.

    Also writes ``tables/exercised.md|.csv``: what every mode x cell exercised. Returns the
    written paths in order (tables in spec order, the exercised table, then plots).
    Existing files of the same names are overwritten; nothing else in ``out_dir`` is
    touched.
    """
    out_dir = Path(out_dir)
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate table names: {dup}")
    if EXERCISED_NAME in names:
        raise ValueError(f"table name {EXERCISED_NAME!r} is reserved for what cells exercised")
    stems = [p.stem for p in plots]
    dup = sorted({n for n in stems if stems.count(n) > 1})
    if dup:
        raise ValueError(f"duplicate plot names: {dup}")
    unknown = sorted({p.table for p in plots} - set(names))
    if unknown:
        raise ValueError(f"plots refer to unknown tables {unknown}; tables: {names}")

    df = records_frame(records)
    tables: dict[str, Table] = {}
    paths: list[Path] = []
    for spec in specs:
        tables[spec.name] = build_table(df, spec)
        paths += write_table(tables[spec.name], out_dir / "tables")
    order = specs[0].row_order if specs else ()
    paths += write_exercised(df, out_dir / "tables", mode_order=order)
    for p in plots:
        stem = out_dir / "plots" / p.stem
        if p.kind == "bar":
            paths += bar_plot(tables[p.table], stem)
        else:
            assert p.x is not None  # checked in PlotSpec
            paths += line_plot(tables[p.table], p.x, stem)
    return paths

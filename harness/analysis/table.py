"""The table model: one metric of a records frame aggregated into a :class:`Table`.

``build_table`` aggregates one metric of ``records_frame`` over rows (modes, by default) x
combinations of cell parameters into a long form (numbers, intervals, N, what each cell
exercised) and a wide form of display strings; the renderers (``render``, ``latex``,
``plots``) only read a Table.

A condition that never occurred is not a result: a table cell whose trials never exercised
what the table measures (``TableSpec.requires``; by default, a cell configured to inject
faults that injected none) reads ``n/a (not exercised)``, has ``exercised`` false and no
value, and is left out of plots.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from harness.analysis.exercised import exercised_counts_by, is_exercised
from harness.analysis.records import (
    EXERCISED_COUNTS,
    REQUIRES,
    UNJUDGED_COLUMN,
    format_value,
    is_bool,
    is_requirement,
    metric_bounds,
    normalize,
    normalized,
    requirement_text,
    value_sort_key,
)
from harness.analysis.stats import (
    INTERVAL_METHODS,
    METHOD_LABELS,
    interval,
    mean_ci,
    poisson_interval,
)
from harness.experiment.budget import modes_text

__all__ = [
    "KINDS",
    "NAME_RE",
    "NA_TEXT",
    "NOT_EXERCISED_TEXT",
    "Table",
    "TableSpec",
    "budget_caption",
    "unjudged_caption",
    "build_table",
]

KINDS: tuple[str, ...] = ("proportion", "mean", "per_1000", "sum")
NA_TEXT = "n/a"
NOT_EXERCISED_TEXT = "n/a (not exercised)"
#: What a table or plot name must look like: it becomes a file stem.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
        if not NAME_RE.match(self.name):
            raise ValueError(f"table name {self.name!r} must match {NAME_RE.pattern}")
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
        if not is_requirement(self.requires):
            raise ValueError(
                f"requires: unknown requirement {self.requires!r}; allowed: {', '.join(REQUIRES)}, or metric:NAME"
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
    #: What each mode and the agent were allowed to retry (``budget_caption``); "" when the
    #: records do not say.
    budget: str = ""
    #: The task-reward components the clean verdict could not judge (``unjudged_caption``);
    #: "" when none.
    unjudged: str = ""
    #: The config keys the run was made with that differ from its config file
    #: (``overrides_caption``; e.g. ``Run with overrides: trials=20.``); "" when none.
    overrides: str = ""
    #: The metric's declared range (lower, upper; None: unbounded) that the intervals of a
    #: mean are cut at (``metric_bounds``).
    bounds: tuple[float | None, float | None] = (None, None)

    @property
    def title(self) -> str:
        """The spec's title, else its name."""
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
        return f" {NOT_EXERCISED_TEXT}: {requirement_text(self.spec.requires)}; no rate is claimed."

    @property
    def footer(self) -> str:
        """N per cell plus what the cells and intervals are, then the retry budgets and the
        overrides the run was made with."""
        budget = f" {self.budget}" if self.budget else ""
        unjudged = f" {self.unjudged}" if self.unjudged else ""
        overrides = f" {self.overrides}" if self.overrides else ""
        return (f"{self.n_text}; {_method_text(self)}{self.exercised_note}{budget}{unjudged}"
                f"{overrides}")

    @property
    def plot_note(self) -> str:
        """Footnote for plots: N per cell plus what the bars/points and intervals are."""
        # Plots have room for about two lines; the full per-cell N is in the CSV.
        note = f"{_n_text(self, max_chars=160)}; {_method_text(self, plot=True)}"
        if self.not_exercised:
            note += f" Cells not exercised ({requirement_text(self.spec.requires)}) are not drawn."
        if self.overrides:
            note += f" {self.overrides}"
        return note


def _resolve(df: pd.DataFrame, name: str, prefer_cell: bool) -> str:
    candidates = [f"cell.{name}", name] if prefer_cell else [name, f"cell.{name}"]
    for c in candidates:
        if c in df.columns:
            return c
    params = sorted(c.removeprefix("cell.") for c in df.columns if c.startswith("cell."))
    raise ValueError(f"no record column or cell parameter {name!r}; cell parameters: {params}")


def _as_binary(values: list[Any], metric: str) -> list[int]:
    out: list[int] = []
    for v in values:
        if is_bool(v) or (isinstance(v, int | float) and v in (0, 1)):
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
        # Cut at the metric's declared range: no impossible mean (a negative count or wait).
        m, lo, hi = mean_ci(xs, conf, *metric_bounds(spec.metric, bool_metric))
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


def _with_facets(df: pd.DataFrame, spec: TableSpec, row_col: str) -> TableSpec:
    """``spec`` with the cell parameters its columns leave out, where they tell cells apart.

    A table cell must hold the trials of one cell of the experiment: if the configured
    columns (say ``fp``) leave two cells (``fp=0.5`` at ``max_steps`` 10 and 30) under one
    header, the parameters that differ between them become leading columns, in the order
    cell ids name them, so every renderer (text, Markdown, CSV, LaTeX, plot panels) shows
    them and no interval pools two settings."""
    if "cell_id" not in df.columns or df.empty:
        return spec
    params = [c.removeprefix("cell.") for c in df.columns if c.startswith("cell.")]
    rank = {p: i for i, p in enumerate(spec.label_order)}
    candidates = sorted(
        (p for p in params if p not in spec.columns and f"cell.{p}" != row_col),
        key=lambda p: (rank.get(p, len(rank)), p),
    )
    if not candidates:
        return spec  # every cell parameter is a column already
    ids = [str(v) for v in df["cell_id"].tolist()]
    rows = normalized(df[row_col])

    def groups(columns: list[str]) -> list[tuple[Any, ...]]:
        cols = [normalized(df[_resolve(df, p, prefer_cell=True)]) for p in columns]
        return [(rows[i], *(c[i] for c in cols)) for i in range(len(ids))]

    extra: list[str] = []
    for p in candidates:
        keys = groups([*extra, *spec.columns])
        cells: dict[tuple[Any, ...], set[str]] = {}
        for key, cid in zip(keys, ids, strict=True):
            cells.setdefault(key, set()).add(cid)
        if all(len(c) == 1 for c in cells.values()):
            break
        # Only a parameter that differs inside a pooled group tells its cells apart.
        inside: dict[tuple[Any, ...], set[Any]] = {}
        for key, v in zip(keys, df[f"cell.{p}"].tolist(), strict=True):
            if len(cells[key]) > 1:
                inside.setdefault(key, set()).add(normalize(v))
        if any(len(v) > 1 for v in inside.values()):
            extra.append(p)
    if not extra:
        return spec
    return replace(spec, columns=(*extra, *spec.columns))


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
    spec = _with_facets(df, spec, row_col)
    col_cols = [_resolve(df, p, prefer_cell=True) for p in spec.columns]

    row_vals = normalized(df[row_col])
    if col_cols:
        combos = list(zip(*[normalized(df[c]) for c in col_cols], strict=True))
    else:
        combos = [()] * len(df)
    metric_vals = normalized(df[metric_col])
    present = [v for v in metric_vals if v is not None]
    # Decide bool-ness per table, not per cell, so every cell uses the same interval method.
    bool_metric = bool(present) and all(is_bool(v) for v in present)

    groups: dict[tuple[Any, tuple[Any, ...]], list[Any]] = {}
    members: dict[tuple[Any, tuple[Any, ...]], list[int]] = {}
    for i, (r, c, v) in enumerate(zip(row_vals, combos, metric_vals, strict=True)):
        bucket = groups.setdefault((r, c), [])
        members.setdefault((r, c), []).append(i)
        if v is not None:
            bucket.append(v)

    unique_rows = list(dict.fromkeys(row_vals))
    by_label = {format_value(r): r for r in unique_rows}
    first = [by_label[lbl] for lbl in dict.fromkeys(spec.row_order) if lbl in by_label]
    rest = sorted((r for r in unique_rows if r not in first), key=value_sort_key)
    row_keys = first + rest
    col_keys = sorted(dict.fromkeys(combos), key=lambda c: tuple(value_sort_key(v) for v in c))

    def col_label(combo: tuple[Any, ...]) -> str:
        if not spec.columns:
            return spec.metric
        from harness.experiment.cells import format_cell  # the one spelling of a cell (as cell_id)

        pairs = list(zip(spec.columns, combo, strict=True))
        rank = {p: i for i, p in enumerate(spec.label_order)}
        pairs.sort(key=lambda pv: rank.get(pv[0], len(rank)))
        return format_cell(pairs)

    row_labels = [format_value(r) for r in row_keys]
    col_labels = [col_label(c) for c in col_keys]
    # Every cell's exercised counts in one pass over the frame.
    grid = {(r, c): members.get((r, c), []) for r in row_keys for c in col_keys}
    counts_by = exercised_counts_by(df, grid, spec.requires)
    long_rows: list[dict[str, Any]] = []
    matrix: list[list[str]] = []
    for r, r_label in zip(row_keys, row_labels, strict=True):
        texts: list[str] = []
        for c, c_label in zip(col_keys, col_labels, strict=True):
            cell = _cell(spec, groups.get((r, c), []), bool_metric)
            index = grid[(r, c)]
            counts = counts_by[(r, c)]
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
    return Table(
        spec=spec,
        data=data,
        display=display,
        budget=budget_caption(df, spec.row_order),
        unjudged=unjudged_caption(df, spec.metric),
        bounds=metric_bounds(spec.metric, bool_metric),
    )


def unjudged_caption(df: pd.DataFrame, metric: str) -> str:
    """For a table of `clean` or `reward`: which parts of the task's reward were not judged
    and so not counted, in how many of the trials, e.g. ``Not judged, so not counted in
    clean: nl_assertions (needs an LLM judge) in 384 of 960 trials.`` "" otherwise."""
    if metric not in ("clean", "reward") or UNJUDGED_COLUMN not in df.columns:
        return ""
    counts: dict[str, int] = {}
    # Each distinct value once, with how many trials hold it: a run repeats a few values.
    for value, times in Counter(map(str, df[UNJUDGED_COLUMN].dropna().tolist())).items():
        for name in filter(None, value.split(",")):
            counts[name] = counts.get(name, 0) + times
    if not counts:
        return ""
    parts = ", ".join(f"{name} in {n:,} of {len(df):,} trials" for name, n in sorted(counts.items()))
    return (f"Not judged, so not counted in {metric}: {parts} (the reward component needs an "
            "LLM judge, which the harness does not run).")


def budget_caption(df: pd.DataFrame, mode_order: tuple[str, ...] | list[str] = ()) -> str:
    """One line saying what the records' modes and agent were allowed to retry:
    ``Delivery attempts per effect below the agent: tx-full apply×8; tcc confirm×8; saga, no-tx
    call×1. Agent: llm-like (retries drawn; max_steps 30, 4 attempts).`` Modes with the same
    budget are named together, in ``mode_order`` then sorted; a mode whose cells differ lists
    each budget. "" when no record says its budget."""
    if "b.mode" not in df.columns:
        return ""
    said = df["b.mode"].notna()
    if not said.any():
        return ""
    known = df.loc[said, ["mode", "b.mode", "b.agent", "b.retries"]]
    # Each (mode, budget) pair once, in first-seen order: the phrase is the same, for a
    # fraction of the work on a run of many trials.
    pairs = zip(map(str, known["mode"].tolist()), map(str, known["b.mode"].tolist()), strict=True)
    modes = modes_text(dict.fromkeys(pairs), mode_order)
    agents = ", ".join(dict.fromkeys(map(str, known["b.agent"].tolist())))
    limits = list(dict.fromkeys(map(str, known["b.retries"].tolist())))
    head = "Delivery attempts per effect below the agent"
    if any(limits):
        head += f" (retries: {' or '.join(r or 'native' for r in limits)})"
    missing = len(df) - len(known)
    unsaid = f" (not recorded for {missing} trials)" if missing else ""
    return f"{head}: {modes}. Agent: {agents}.{unsaid}"


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
    cut = _range_text(table) if spec.kind == "mean" else ""
    if plot:
        return f"{what} with {conf} {label} intervals{cut}."
    return f"cells are {what}; {conf} {label} intervals{cut} in the CSV."


def _range_text(table: Table) -> str:
    """Says where a mean's t intervals are cut (the metric's declared range), or ""."""
    lower, upper = table.bounds
    metric = table.spec.metric
    if upper is None:
        if lower is None:
            return ""
        if lower == 0:
            return f" cut at 0 ({metric} cannot be negative)"
        return f" cut at {lower:g} ({metric} cannot be below it)"
    if lower is None:
        return f" cut at {upper:g} ({metric} cannot exceed it)"
    return f" cut to [{lower:g}, {upper:g}] ({metric} cannot leave it)"

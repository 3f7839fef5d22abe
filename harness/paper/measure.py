"""Our side of a paper cell: a statistic of one run's trial records, with its interval.

``Measurer`` builds report tables (``harness.analysis.table``) of one run's records, once
per statistic; ``measure`` reads one paper cell's statistic off them on the paper's scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.analysis.records import records_frame
from harness.analysis.stats import format_pct
from harness.analysis.table import Table, TableSpec, build_table
from harness.experiment.sections import PaperColumnModel

__all__ = [
    "Measure",
    "Measurer",
    "format_number",
    "measure",
]


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
        """Our cell as REPRODUCTION.md shows it: the value and its interval, or why none."""
        if self.n == 0:
            return "no trials"
        if not self.exercised:
            return "n/a (not exercised)"
        if self.stat == "trials":
            return str(self.n)
        if self.stat == "count":
            rate = 100 * (self.successes or 0) / self.n
            bounds = f"[{format_pct(100 * self.lo)}, {format_pct(100 * self.hi)}]"
            return f"{self.successes}/{self.n} = {format_pct(rate)}% {bounds}"
        if self.stat == "proportion":
            return f"{format_pct(self.value)} [{format_pct(self.lo)}, {format_pct(self.hi)}]"
        return f"{format_number(self.value)} [{format_number(self.lo)}, {format_number(self.hi)}]"


def format_number(v: float) -> str:
    """A mean or timing: two decimals below 10, else one; "0" when it rounds to 0; "n/a" for NaN."""
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
        self.df = records_frame(records)
        self._tables: dict[tuple[Any, ...], Table] = {}

    def table(
        self, column: PaperColumnModel, params: tuple[str, ...], requires: str | None
    ) -> Table:
        """The table of `column`'s statistic by mode x the cell parameters `params`."""
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
        return Measure(
            stat, math.nan, math.nan, math.nan, n, exercised=False, why_not=_why_not(requires)
        )
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
    """What did not occur in a cell that was not exercised (see `harness.analysis.exercised.is_exercised`)."""
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

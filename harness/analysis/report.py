"""One run's report: every table (Markdown, CSV, LaTeX), the exercised table and the plots,
written from trial records only; this module never runs a trial.

The pieces below it: ``records`` (records -> DataFrame, what each cell exercised), ``table``
(the table model), ``render`` (a table's files), ``latex`` and ``plots``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.analysis.records import records_frame
from harness.analysis.render import EXERCISED_NAME, write_exercised, write_table
from harness.analysis.table import NAME_RE, Table, TableSpec, build_table

__all__ = [
    "PLOT_KINDS",
    "PlotSpec",
    "draw_plot",
    "write_report",
]

PLOT_KINDS: tuple[str, ...] = ("bar", "line")


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
        if self.name and not NAME_RE.match(self.name):
            raise ValueError(f"plot name {self.name!r} must match {NAME_RE.pattern}")

    @property
    def stem(self) -> str:
        """The output file stem (without ``.png``/``.pdf``)."""
        return self.name or f"{self.table}-{self.kind}"


def draw_plot(table: Table, plot: PlotSpec, plots_dir: Path) -> list[Path]:
    """Draw ``plot`` of ``table`` as ``plots_dir/<stem>.png|.pdf``."""
    # matplotlib is loaded only when a plot is drawn: listing or checking runs stays light.
    from harness.analysis import plots

    stem = Path(plots_dir) / plot.stem
    if plot.kind == "bar":
        return plots.bar_plot(table, stem)
    assert plot.x is not None  # checked in PlotSpec
    return plots.line_plot(table, plot.x, stem)


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
        paths += draw_plot(tables[p.table], p, out_dir / "plots")
    return paths

"""Figures of report tables that cannot mislead, byte-reproducible, sized for a paper.

Guarantees of every figure:

* each mode (table row) has its own colour AND marker, never reused within a figure
  (``mode_styles``); a row keeps its style across the panels of one figure;
* one panel per combination of the secondary parameters (facets), each ~3.3 in wide;
* intervals are error bars, with points dodged sideways so that they do not overlap;
* the legend sits outside the axes, below the title, and the saved figure is cropped to
  what was drawn (``bbox_inches="tight"``), so nothing is cut off or covered;
* PDFs embed TrueType (Type 42) fonts, never Type 3; files carry no timestamps.

Cells with no trials, or not exercised, are not drawn (and are marked "n/a" in bar plots).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.style
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.analysis.records import format_value, is_bool, normalize, value_sort_key
from harness.analysis.table import Table, TableSpec

__all__ = [
    "PANEL_SIZE",
    "MARKERS",
    "PALETTE",
    "Style",
    "bar_plot",
    "line_plot",
    "mode_styles",
]

#: One panel's size in inches: a paper column is about 3.3 in wide.
PANEL_SIZE: tuple[float, float] = (3.3, 2.4)
MAX_PANELS_PER_ROW = 3
DPI = 200
# tab10, then black and the dark tones of tab20b/tab20c's other hues: 20 colours that stay
# apart from each other (tab20's light twins of tab10 would read as the same hue).
PALETTE: tuple[str, ...] = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#000000", "#393b79", "#637939", "#8c6d31", "#843c39",
    "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
)  # fmt: skip
MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*", "d")
LINESTYLES: tuple[str, ...] = ("-", "--", "-.", ":")
# None removes the key: no timestamps or version strings, so output depends on data only.
PDF_METADATA: dict[str, None] = {
    "CreationDate": None,
    "ModDate": None,
    "Producer": None,
    "Creator": None,
}
PNG_METADATA: dict[str, None] = {"Software": None}
_PLOT_RC: dict[str, Any] = {
    "svg.hashsalt": "atomix-report",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    # TrueType fonts: publishers' checkers reject the default Type 3.
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
}


@dataclass(frozen=True)
class Style:
    """How one mode is drawn: colour, marker and line style."""

    color: str
    marker: str
    linestyle: str


def mode_styles(rows: Sequence[str]) -> dict[str, Style]:
    """A style per row such that no two rows share a colour, nor a marker, as long as there
    are at most 20 rows (13 for markers); beyond that, no two share (colour, marker)."""
    out: dict[str, Style] = {}
    nc, nm = len(PALETTE), len(MARKERS)
    for i, r in enumerate(rows):
        # i -> (colour, marker) is injective for every i: marker index i % nm plus a shift
        # by the colour cycle keeps pairs distinct past len(PALETTE) rows.
        color = PALETTE[i % nc]
        marker = MARKERS[(i + i // nc) % nm]
        out[r] = Style(color, marker, LINESTYLES[(i // 10) % len(LINESTYLES)])
    return out


@contextmanager
def _plot_context() -> Iterator[None]:
    # Start from matplotlib's defaults (ignoring any user matplotlibrc or style) so bytes
    # depend on the data only; both contexts restore the caller's rcParams on exit.
    with matplotlib.style.context("default"), mpl.rc_context(_PLOT_RC):
        yield


def _scale(spec: TableSpec) -> float:
    return 100.0 if spec.kind == "proportion" else 1.0


def _y_label(spec: TableSpec) -> str:
    return {
        "proportion": f"{spec.metric} (%)",
        "mean": f"mean {spec.metric}",
        "per_1000": f"{spec.metric} per 1,000 trials",
        "sum": f"total {spec.metric}",
    }[spec.kind]


def _panels(table: Table, inner: str | None) -> list[tuple[str, dict[str, Any]]]:
    """(panel title, {param: value}) for each combination of the column parameters other
    than ``inner``, in table order; one untitled panel when there are none."""
    others = [p for p in table.spec.columns if p != inner]
    if not others:
        return [("", {})]
    combos = sorted(
        dict.fromkeys(
            tuple(normalize(v) for v in t)
            for t in table.data[[f"cell.{p}" for p in others]].itertuples(index=False)
        ),
        key=lambda t: tuple(value_sort_key(v) for v in t),
    )
    return [
        (", ".join(f"{p} = {format_value(v)}" for p, v in zip(others, c, strict=True)),
         dict(zip(others, c, strict=True)))
        for c in combos
    ]  # fmt: skip


def _select(data: Any, fixed: dict[str, Any]) -> Any:
    mask = np.ones(len(data), dtype=bool)
    for p, v in fixed.items():
        mask &= np.array([normalize(u) == v for u in data[f"cell.{p}"]], dtype=bool)
    return data[mask]


def _figure(n_panels: int, panel_width: float = PANEL_SIZE[0]) -> tuple[Figure, list[Any]]:
    ncols = min(n_panels, MAX_PANELS_PER_ROW)
    nrows = math.ceil(n_panels / ncols)
    w, h = panel_width, PANEL_SIZE[1]
    # A bare Figure with an Agg canvas: no pyplot, so no global figure manager or backend.
    fig = Figure(figsize=(w * ncols, h * nrows + 0.9), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)  # an incomplete last row leaves empty slots
    return fig, flat[:n_panels]


def _errors(vals: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    if not np.isfinite(lo).any():
        return None
    below = np.where(np.isfinite(lo) & np.isfinite(vals), vals - lo, 0.0)
    above = np.where(np.isfinite(hi) & np.isfinite(vals), hi - vals, 0.0)
    return np.clip(np.vstack([below, above]), 0.0, None)


def _finish(fig: Figure, axes: list[Any], table: Table, out_stem: Path) -> list[Path]:
    spec = table.spec
    rows = [str(r) for r in table.display.index]
    n_rows = len(rows)
    if spec.kind == "proportion":
        for ax in axes:
            ax.set_ylim(-3, 103)  # room for markers at 0 and 100
    else:
        lo, hi = axes[0].get_ylim()
        if lo >= 0:  # bars stick to 0; leave room so a marker at 0 is not cut in half
            axes[0].set_ylim(-0.03 * (hi - lo), hi)
    # Every mode once, in row order, even if the first panel lacks one of them.
    found: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(lab, h)
    labels = [r for r in rows if r in found]
    handles = [found[r] for r in labels]
    width_in = fig.get_figwidth()
    # As many legend columns as fit the figure's width (about 1.1 in per entry).
    ncol = max(1, min(n_rows, int(width_in / 1.15)))
    # Lay out the panels, then freeze them and stack title, legend and note around them
    # by their measured extents: nothing overlaps, whatever the labels' lengths
    # (constrained layout does not stack a figure legend with a suptitle or supxlabel).
    fig.canvas.draw()
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()
    inv = fig.transFigure.inverted()
    boxes = [ax.get_tightbbox(renderer).transformed(inv) for ax in axes]
    bottom, top = min(b.y0 for b in boxes), max(b.y1 for b in boxes)
    gap = 0.08 / fig.get_figheight()  # 0.08 in
    fig.text(0.5, top + gap, table.title, ha="center", va="bottom", fontsize=9, parse_math=False)
    legend = fig.legend(
        handles, labels, loc="upper center", bbox_to_anchor=(0.5, bottom - gap),
        ncols=ncol, frameon=False,
    )  # fmt: skip
    lbox = legend.get_window_extent(renderer).transformed(inv)
    note = "\n".join(textwrap.wrap(table.plot_note, int(width_in * 19)))
    fig.text(0.5, lbox.y0 - gap, note, ha="center", va="top", fontsize=6, parse_math=False)
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    # Append suffixes rather than with_suffix(): stems may contain dots ("fp=0.1").
    png = out_stem.parent / f"{out_stem.name}.png"
    pdf = out_stem.parent / f"{out_stem.name}.pdf"
    # bbox_inches="tight": the file holds everything drawn, legend and note included.
    fig.savefig(png, format="png", dpi=DPI, metadata=PNG_METADATA, bbox_inches="tight")
    fig.savefig(pdf, format="pdf", dpi=DPI, metadata=PDF_METADATA, bbox_inches="tight")
    return [png, pdf]


def bar_plot(table: Table, out_stem: Path) -> list[Path]:
    """Dot-and-whisker bars: per group (the innermost column parameter) one light bar, one
    marker and one interval per mode; one panel per value of the other parameters.

    Writes ``<out_stem>.png`` and ``<out_stem>.pdf``; bytes depend only on the table.
    """
    spec = table.spec
    rows = [str(r) for r in table.display.index]
    styles = mode_styles(rows)
    scale = _scale(spec)
    inner = spec.columns[-1] if spec.columns else None
    panels = _panels(table, inner)
    n_groups = max(1, table.data["column"].nunique() // len(panels))
    # Many bars (11 modes x 5 sources) get a wider panel, up to a two-column figure.
    panel_width = max(PANEL_SIZE[0], min(7.0, 0.8 + 0.075 * n_groups * len(rows)))
    with _plot_context():
        fig, axes = _figure(len(panels), panel_width)
        for ax, (title, fixed) in zip(axes, panels, strict=True):
            sub_all = _select(table.data, fixed)
            groups = list(dict.fromkeys(sub_all["column"].tolist()))
            if inner is not None:
                names = [
                    format_value(normalize(v)) for v in dict.fromkeys(sub_all[f"cell.{inner}"])
                ]
            else:
                names = [""]
            x = np.arange(len(groups), dtype=float)
            width = 0.8 / max(1, len(rows))
            for i, r in enumerate(rows):
                st = styles[r]
                sub = sub_all[sub_all["row"] == r].set_index("column").reindex(groups)
                vals = sub["value"].to_numpy(dtype=float) * scale
                lo = sub["lo"].to_numpy(dtype=float) * scale
                hi = sub["hi"].to_numpy(dtype=float) * scale
                xs = x + (i - (len(rows) - 1) / 2) * width
                # A cell with no trials or not exercised has NaN and draws nothing (unlike
                # 0%); one not exercised is marked so the gap is not read as missing data.
                skipped = (sub["n"].to_numpy() > 0) & ~sub["exercised"].to_numpy(dtype=bool)
                for xi in xs[skipped]:
                    ax.text(xi, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=5,
                            color=st.color)  # fmt: skip
                ax.bar(xs, vals, width * 0.9, color=st.color, alpha=0.25, linewidth=0)
                ax.errorbar(
                    xs, vals, yerr=_errors(vals, lo, hi), fmt=st.marker, color=st.color,
                    markersize=3.5, elinewidth=0.8, capsize=1.5, label=r,
                )  # fmt: skip
            ax.set_xlim(-0.5, len(groups) - 0.5)
            tilt = len(groups) > 4 or max((len(n) for n in names), default=0) > 8
            ax.set_xticks(x, names, rotation=30 if tilt else 0, ha="right" if tilt else "center")
            ax.grid(False, axis="x")
            if inner is not None:
                ax.set_xlabel(inner)
            if title:
                ax.set_title(title, parse_math=False)  # config text, never mathtext
        for ax in axes[:: min(len(axes), MAX_PANELS_PER_ROW)]:
            ax.set_ylabel(_y_label(spec))
        return _finish(fig, axes, table, out_stem)


def line_plot(table: Table, x_param: str, out_stem: Path) -> list[Path]:
    """One line per mode over a numeric swept cell parameter with interval error bars,
    one panel per combination of the other column parameters (e.g. per fault class).

    Points are dodged sideways by a small, fixed fraction of the x range so that modes
    with equal values stay visible. Writes PNG and PDF, byte-reproducible.
    """
    spec = table.spec
    if x_param not in spec.columns:
        raise ValueError(
            f"x_param {x_param!r} is not a column of table {spec.name!r}: {spec.columns}"
        )
    xcol = f"cell.{x_param}"
    xs_all = [normalize(v) for v in table.data[xcol].tolist()]
    if any(v is None or is_bool(v) or not isinstance(v, int | float) for v in xs_all):
        raise ValueError(f"cell parameter {x_param!r} must be numeric for a line plot")
    scale = _scale(spec)
    data = table.data[(table.data["n"] > 0) & table.data["exercised"].astype(bool)]
    rows = [str(r) for r in table.display.index]
    styles = mode_styles(rows)
    panels = _panels(table, x_param)
    x_values = sorted({float(v) for v in xs_all})
    # A doubling sweep (agents 2..64) reads on a log axis; fault rates on a linear one.
    log_x = x_values[0] > 0 and x_values[-1] / x_values[0] >= 8
    pos = np.log(x_values) if log_x else np.array(x_values)
    gaps = np.diff(pos) if len(pos) > 1 else np.array([1.0])
    # Dodge: spread the modes over at most 40% of the smallest gap between x values.
    step = 0.4 * float(gaps.min() or 1.0) / max(1, len(rows))
    with _plot_context():
        fig, axes = _figure(len(panels))
        for ax, (title, fixed) in zip(axes, panels, strict=True):
            sub_p = _select(data, fixed)
            for i, r in enumerate(rows):
                st = styles[r]
                sub = sub_p[sub_p["row"] == r].sort_values(xcol, kind="mergesort")
                shift = (i - (len(rows) - 1) / 2) * step
                xv = sub[xcol].to_numpy(dtype=float)
                xv = xv * math.exp(shift) if log_x else xv + shift
                yv = sub["value"].to_numpy(dtype=float) * scale
                lo = sub["lo"].to_numpy(dtype=float) * scale
                hi = sub["hi"].to_numpy(dtype=float) * scale
                ax.errorbar(
                    xv, yv, yerr=_errors(yv, lo, hi), color=st.color, marker=st.marker,
                    linestyle=st.linestyle, markersize=3.5, linewidth=1.0, elinewidth=0.7,
                    capsize=1.5, label=r,
                )  # fmt: skip
            if log_x:
                ax.set_xscale("log")
                ax.minorticks_off()
            ax.set_xticks(x_values, [format_value(v) for v in x_values])
            ax.set_xlabel(x_param)
            if title:
                ax.set_title(title, parse_math=False)  # config text, never mathtext
        for ax in axes[:: min(len(axes), MAX_PANELS_PER_ROW)]:
            ax.set_ylabel(_y_label(spec))
        return _finish(fig, axes, table, out_stem)

"""Renderers of a :class:`~harness.analysis.table.Table`: Markdown, CSV, LaTeX, rich; and
the files of one table (``<name>.md|.csv|.tex``) and of the exercised table.

Every renderer is a pure function of the table, so the same records give the same bytes.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.table import Table as RichTable
from rich.text import Text

from harness.analysis.exercised import exercised_frame
from harness.analysis.latex import table_latex
from harness.analysis.records import EXERCISED_COUNTS, FAULT_CLASSES, normalize
from harness.analysis.table import Table

__all__ = [
    "EXERCISED_NAME",
    "EXERCISED_TITLE",
    "exercised_csv",
    "exercised_markdown",
    "to_csv",
    "to_latex",
    "to_markdown",
    "to_rich",
    "write_exercised",
    "write_table",
]

#: The stem of the per-run table of what every mode x cell exercised (a reserved table name).
EXERCISED_NAME = "exercised"
EXERCISED_TITLE = "What each cell exercised (counts summed over its trials)"


# --------------------------------------------------------------------------- one table


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
    v = normalize(v)
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


def to_latex(table: Table) -> str:
    """A booktabs table with headers grouped by cell parameter, sized to fit a column or
    the page (see :func:`harness.analysis.latex.table_latex`), captioned with N and the method."""
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
        text = ["?" if normalize(v) is None else str(normalize(v)) for v in cells]
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

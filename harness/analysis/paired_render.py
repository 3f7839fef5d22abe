"""Renderers of a paired comparison (`harness.analysis.paired`): Markdown, CSV, LaTeX, a rich
table for the terminal, and the files `atomix compare` writes."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.analysis.latex import COLUMN_WIDTH_PT, estimate_width, latex_escape
from harness.analysis.paired import FORMATS, PairedComparison
from harness.analysis.table import NOT_EXERCISED_TEXT

__all__ = [
    "markdown_block",
    "paired_csv",
    "paired_latex",
    "paired_markdown",
    "paired_rich",
    "paired_stem",
    "write_paired",
]

def markdown_block(
    title: str, header: Sequence[str], rows: Sequence[Sequence[str]], note: str,
    aligns: Sequence[str],
) -> str:
    """A pipe table under a bold title, with `note` below it; `aligns` per column
    (":---" left, "---:" right). Pipes in any text are escaped."""

    def esc(s: str) -> str:
        return s.replace("|", r"\|")

    lines = [f"**{esc(title)}**", ""]
    lines.append("| " + " | ".join(esc(h) for h in header) + " |")
    lines.append("| " + " | ".join(aligns) + " |")
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    lines += ["", esc(note), ""]
    return "\n".join(lines)


def paired_markdown(cmp: PairedComparison) -> str:
    """A pipe table with a bold title and a footer naming the test, interval and pairing."""
    header = cmp.header()
    aligns = [":---", ":---", *["---:"] * (len(header) - 2)]
    return markdown_block(cmp.title, header, cmp.display_rows(), cmp.footer, aligns)


def _csv_num(v: float) -> str:
    return "" if isinstance(v, float) and math.isnan(v) else repr(v)


def paired_csv(cmp: PairedComparison) -> str:
    """One line per (cell, mode) with raw numbers (fractions, not percent; empty = none)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "metric", "cell_id", "baseline", "mode", "pairs", "unmatched", "exercised",
            "baseline_value", "mode_value", "baseline_total", "mode_total", "gained", "lost",
            "diff", "lo", "hi", "confidence", "interval", "test", "p_value", "p_holm",
        ]
    )  # fmt: skip
    for r in cmp.rows:
        w.writerow(
            [
                cmp.metric, r.cell, cmp.baseline, r.mode, r.pairs, r.unmatched,
                "true" if r.exercised else "false",
                _csv_num(r.base), _csv_num(r.value), _csv_num(float(r.base_total)),
                _csv_num(float(r.total)), r.gained, r.lost,
                _csv_num(r.diff), _csv_num(r.lo), _csv_num(r.hi), repr(cmp.confidence),
                cmp.interval_method, cmp.test, _csv_num(r.p), _csv_num(r.p_holm),
            ]
        )  # fmt: skip
    return buf.getvalue()


def paired_latex(cmp: PairedComparison) -> str:
    """A booktabs table (``\\small``, fits one column for a few modes) grouped by cell.

    The cell is printed once per group (a ``\\midrule`` between groups); the caption states
    the pairing, test, interval and correction.
    """
    header = cmp.header()
    # Shorter headers: a one-column table has about 250 pt.
    short = ["mode", "pairs", header[3].replace("%", r"\%"), "mode", "$+/-$", "diff", "CI",
             "$p$", "$p_\\mathrm{Holm}$"]  # fmt: skip
    short[2] = latex_escape(cmp.baseline) + (r" \%" if cmp.kind == "binary" else "")
    short[3] = "mode" + (r" \%" if cmp.kind == "binary" else "")
    cols = "l" + "r" * (len(short) - 1)
    # A table when it fits a column (a few short modes), else a table* across the page.
    body = [[r[1] for r in cmp.display_rows()], *([[r[i] for r in cmp.display_rows()]
            for i in range(3, len(header))])]  # fmt: skip
    star = estimate_width([*body, short[1:2]]) > COLUMN_WIDTH_PT
    env = "table*" if star else "table"
    caption = latex_escape(f"{cmp.title}. {cmp.footer}")
    label = "tab:compare-" + "".join(ch if ch.isalnum() else "-" for ch in cmp.metric)
    lines = [
        f"\\begin{{{env}}}[htbp]",
        r"  \centering",
        r"  \small",
        r"  \setlength{\tabcolsep}{3pt}",
        f"  \\caption{{{caption}}}",
        f"  \\label{{{label}}}",
        f"  \\begin{{tabular}}{{{cols}}}",
        r"    \toprule",
        "    " + " & ".join(short) + r" \\",
    ]
    rows = cmp.display_rows()
    for cell in cmp.cells:
        lines.append(r"    \midrule")
        lines.append(
            f"    \\multicolumn{{{len(short)}}}{{l}}{{\\textit{{{latex_escape(cell)}}}}} \\\\"
        )
        for row in rows:
            if row[0] != cell:
                continue
            text = [latex_escape(c) for c in row[1:]]
            if text[-3] == latex_escape(NOT_EXERCISED_TEXT):
                text = [
                    *text[:2],
                    f"\\multicolumn{{{len(short) - 2}}}{{l}}{{{text[2]}}}",
                ]
            lines.append("    " + " & ".join(text) + r" \\")
    lines += [r"    \bottomrule", r"  \end{tabular}", f"\\end{{{env}}}", ""]
    return "\n".join(lines)


def paired_rich(cmp: PairedComparison) -> Any:
    """A rich Table for the terminal (cell text is literal)."""
    from rich.table import Table as RichTable
    from rich.text import Text

    rt = RichTable(title=Text(cmp.title), caption=Text(cmp.footer))
    for i, h in enumerate(cmp.header()):
        rt.add_column(Text(h), justify="left" if i < 2 else "right")
    last = None
    for row in cmp.display_rows():
        cell = row[0] if row[0] != last else ""
        last = row[0]
        rt.add_row(*(Text(c) for c in [cell, *row[1:]]))
    return rt


RENDERERS = {"md": paired_markdown, "csv": paired_csv, "tex": paired_latex}


def paired_stem(cmp: PairedComparison) -> str:
    """``compare-<metric>-vs-<baseline>``, plus the modes when they were chosen explicitly."""
    stem = f"compare-{cmp.metric}-vs-{cmp.baseline}"
    if cmp.explicit_modes:
        stem += "-" + "_".join(cmp.modes[1:])
    return stem


def write_paired(
    cmp: PairedComparison, tables_dir: Path, formats: Sequence[str] = FORMATS
) -> list[Path]:
    """Write ``<stem>.<fmt>`` for each format into ``tables_dir``; returns the paths."""
    tables_dir = Path(tables_dir)
    tables_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = tables_dir / f"{paired_stem(cmp)}.{fmt}"
        with path.open("w", encoding="utf-8", newline="\n") as fh:
            fh.write(RENDERERS[fmt](cmp))
        paths.append(path)
    return paths

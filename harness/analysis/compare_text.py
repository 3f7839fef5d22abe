"""Paired comparisons for a terminal of any width, with no label ever cut.

Rows are grouped (a single run: by cell, each mode a row; two runs: by mode, each cell a
row). When the columns fit the terminal they are aligned; when they do not, each row is two
lines: its label, then its figures. Headers are short and explained in a legend below, and a
verdict line closes the comparison. The figures are `harness.analysis.paired`'s: this module
only lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.text import Text

from harness.analysis.paired import PairedComparison, PairRow, format_p

GAP = "  "
INDENT = "  "
VERDICT_STYLE = {"better": "green", "worse": "red"}


@dataclass(frozen=True)
class Item:
    """One row to show: its group heading, its label within the group, the row, its verdict."""

    group: str
    label: str
    row: PairRow
    verdict: str


def figures(row: PairRow, shown: Sequence[str]) -> list[str]:
    """The row's figures from its `display_rows()` text: base -> value, +gained/-lost,
    diff [CI], Holm p (none for a cell that was not exercised)."""
    if not row.exercised:
        return []  # the verdict says it: n/a (not exercised)
    base, value, pm, diff, ci = shown[3:8]
    return [f"{base} → {value}", pm, f"{diff} {ci}", format_p(row.p_holm)]


def render(
    cmp: PairedComparison,
    items: Sequence[Item],
    width: int,
    *,
    title: str,
    label_header: str,
    levels_header: str,
    legend: Sequence[str],
    verdict_lines: Sequence[str],
) -> RenderableType:
    """The comparison as rich renderables, fitting `width` columns (see the module docstring)."""
    header = [levels_header, "+/-", "diff [CI]", "p Holm", "verdict"]
    shown = {id(r): d for r, d in zip(cmp.rows, cmp.display_rows(), strict=True)}
    rows = [[*figures(it.row, shown[id(it.row)]), it.verdict] for it in items]
    full = [r for r in rows if len(r) == len(header)]
    widths = [max([len(header[i]), *(len(r[i]) for r in full)]) for i in range(len(header))]
    label_w = max([len(label_header), *(len(it.label) for it in items)])
    aligned_w = len(INDENT) + label_w + sum(len(GAP) + w for w in widths)
    out: list[RenderableType] = [Text(title, style="bold")]
    aligned = aligned_w <= width

    def line(cells: Sequence[str], label: str, verdict: str | None = None) -> Text:
        text = Text(INDENT + label.ljust(label_w))
        if len(cells) == 1:  # not exercised: one text across the figures
            text.append(GAP + cells[0])
            return text
        for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
            last = i == len(cells) - 1
            padded = cell.ljust(w) if last else cell.rjust(w) if i else cell.center(w)
            text.append(GAP)
            text.append(
                padded.rstrip() if last else padded,
                style=VERDICT_STYLE.get(cell, "") if last else "",
            )
        return text

    if aligned:
        out.append(Text(""))
        out.append(line(header, label_header))
    group = None
    for it, cells in zip(items, rows, strict=True):
        if it.group != group:
            group = it.group
            out.append(Text(""))
            out.append(Text(group, style="bold"))
        if aligned:
            out.append(line(cells, it.label))
            continue
        # Too narrow for columns: the label on its line, the figures named on the next.
        out.append(Text(INDENT + it.label))
        if len(cells) == 1:
            out.append(Text(INDENT * 2 + cells[0]))
            continue
        parts = Text(INDENT * 2)
        named = [
            f"{cells[0]} %" if cmp.kind == "binary" else cells[0],
            f"+/- {cells[1]}",
            f"diff {cells[2]}",
            f"p {cells[3]}",
        ]
        parts.append(", ".join(named) + ", ")
        parts.append(cells[4], style=VERDICT_STYLE.get(cells[4], ""))
        out.append(parts)
    out.append(Text(""))
    for text in legend:
        out.append(Text(text, style="dim"))
    for text in verdict_lines:
        out.append(Text(text, style="bold"))
    return Group(*out)


def legend(cmp: PairedComparison, base: str, value: str, pairs_on: str) -> list[str]:
    """What the short headers mean, the test and the pairing."""
    conf = f"{100 * cmp.confidence:g}%"
    if cmp.kind == "binary":
        levels = f"percent {cmp.metric}, {base} → {value}"
        diff = f"diff [CI]: {value} - {base} in percentage points, {conf} Newcombe interval"
    else:
        levels = f"mean {cmp.metric}, {base} → {value}"
        diff = f"diff [CI]: mean paired difference {value} - {base}, {conf} t interval"
    n_tests = sum(1 for r in cmp.rows if not math.isnan(r.p))
    text = [
        f"Pairs matched on {pairs_on}; {levels}; +/-: pairs {value} won/lost; {diff}; "
        f"p Holm: two-sided {cmp.test}, Holm-adjusted over the {n_tests} tests shown.",
    ]
    unmatched = sum(r.unmatched for r in cmp.rows)
    if unmatched:
        text.append(f"{unmatched} trial(s) without a partner were left out.")
    return text

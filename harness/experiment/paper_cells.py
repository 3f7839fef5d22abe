"""The paper's result-table cells as data (``harness/experiment/paper_cells.csv``).

One CSV row per numeric cell of the paper's result tables 1-3 and 5-21 (Table 4 is the
adapter/idempotency-key specification and holds no results; Tables 22-23 are capability
matrices of ticks and crosses). Columns: ``table``, ``row``, ``column``, ``value``, ``n``,
``caption``.

What the loader guarantees (and ``tests/test_paper_cells.py`` checks):

* ``value`` is the number exactly as printed in the paper (``"557"``, ``"0.48"``, ``"75%"``,
  ``"1,163.2"``, ``"~50"``); footnote markers (†, ‡, ∗) after a number are dropped. It parses
  as a number once ``%``, ``×``, ``±``, ``~`` and thousands commas are stripped:
  ``PaperCell.number``.
* Composite cells are split: ``"98 / 295"`` under "Total / p99" gives the columns
  ``Total (μs)`` and ``p99 (μs)``; ``"60 [26, 88]"`` gives ``<col>``, ``<col> / 95% CI lower``
  and ``<col> / 95% CI upper``; ``"73.0 ± 5.5"`` gives ``<col>`` and
  ``<col> / 95% CI half-width``; ``"20/30 = 67%"`` gives ``<col>`` (the percentage) and
  ``<col> / count`` with ``n`` = 30; ``"0/200"`` gives ``0`` with ``n`` = 200.
* ``row`` is the row label as printed (including a trailing ``∗`` marker where the paper has
  one); ``column`` is the header as printed, LaTeX rendered to plain text (``fp=0.10``,
  ``τ``, ``μs``), with the levels of a multi-level header joined by ``" / "``.
* ``(table, row, column)`` is unique except in Table 16, where the paper itself repeats the
  row label ``Tx-Full`` for three values of ``cf_p``; those rows keep the paper's order.
* ``n`` is the number of trials/runs the table or its caption states for the cell, or
  ``None`` when it states none. For Table 12 it is the caption's "N=200 trials per K"
  (cells average four values of K).
* ``caption`` is a one-line quote of the caption without its ``Table N:`` prefix, identical
  for every cell of a table.
* Every number printed on a row of a result table is a cell, a part of one (an interval
  bound, a count's N) or a number of the row label. Where the text extraction prints a
  value with a stray leading digit, the LaTeX alignment padding of a short value (``"1 0.0"``
  for 0.0 under 112.3, ``"0 92"`` for 92 under 115), the cell is the value without it;
  ``tests/test_paper_cells.py`` lists each such field and checks the accounting.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CELLS_PATH",
    "PARTS",
    "PaperCell",
    "cells_by_table",
    "half_unit",
    "load_cells",
    "parse_number",
    "split_part",
    "tables",
]

#: The data file, next to this module.
CELLS_PATH = Path(__file__).with_name("paper_cells.csv")

_STRIP = str.maketrans("", "", "%×±~, ")

#: Column suffixes that the split of a composite cell gives (see above): such a column is a
#: part of the column before the suffix (its interval bound, half-width or count), not a
#: result of its own.
PARTS: dict[str, str] = {
    " / 95% CI lower": "lower",
    " / 95% CI upper": "upper",
    " / 95% CI half-width": "half-width",
    " / count": "count",
}


def parse_number(value: str) -> float:
    """``value`` as a float after stripping ``%``, ``×``, ``±``, ``~`` and commas."""
    return float(value.replace("−", "-").translate(_STRIP))


@dataclass(frozen=True, slots=True)
class PaperCell:
    """One numeric cell of one of the paper's result tables."""

    table: int
    row: str
    column: str
    value: str
    n: int | None
    caption: str

    @property
    def number(self) -> float:
        """The printed value as a float (a percentage stays on its 0-100 scale)."""
        return parse_number(self.value)


def load_cells(path: Path | None = None) -> list[PaperCell]:
    """Every cell in file order (tables ascending; rows and columns as the paper prints them)."""
    with (path or CELLS_PATH).open(newline="", encoding="utf-8") as fh:
        return [
            PaperCell(
                table=int(rec["table"]),
                row=rec["row"],
                column=rec["column"],
                value=rec["value"],
                n=int(rec["n"]) if rec["n"] else None,
                caption=rec["caption"],
            )
            for rec in csv.DictReader(fh)
        ]


def tables(path: Path | None = None) -> dict[int, str]:
    """Table number -> caption, for every table with at least one cell, ascending."""
    out: dict[int, str] = {}
    for cell in load_cells(path):
        out.setdefault(cell.table, cell.caption)
    return dict(sorted(out.items()))


@functools.lru_cache(maxsize=1)
def cells_by_table() -> dict[int, tuple[PaperCell, ...]]:
    """The cells of ``CELLS_PATH`` grouped by table (file order kept); read once."""
    out: dict[int, list[PaperCell]] = {}
    for cell in load_cells():
        out.setdefault(cell.table, []).append(cell)
    return {t: tuple(cells) for t, cells in sorted(out.items())}


def split_part(column: str) -> tuple[str, str | None]:
    """``("τ-bench (fp=0, N=10)", "lower")`` for ``"τ-bench (fp=0, N=10) / 95% CI lower"``;
    ``(column, None)`` for a column that is not a part of another (see ``PARTS``)."""
    for suffix, part in PARTS.items():
        if column.endswith(suffix):
            return column[: -len(suffix)], part
    return column, None


def half_unit(value: str) -> float:
    """Half a unit of the last digit ``value`` prints: the rounding a printed number hides
    (``"73"`` -> 0.5, ``"0.74"`` -> 0.005, ``"1,163.2"`` -> 0.05)."""
    digits = value.strip().rstrip("%").split(".")
    return 0.5 * 10.0 ** -(len(digits[1]) if len(digits) == 2 else 0)

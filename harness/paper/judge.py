"""The verdict on each paper cell: reproduced, differs or not comparable, and the notes
that explain a difference.

The verdict rule (``judge``; also written at the top of every REPRODUCTION.md as ``RULE``):
a paper value p, printed with a rounding of h (half a unit of its last printed digit), is
*reproduced* when it lies in our two-sided 95% interval widened by h: lo - h <= p <= hi + h.
The interval is Clopper-Pearson for proportions (and for counts, compared as the rate
count / the paper's N), Student t for means, cut at the metric's declared range as the
run's tables show it (a count or a wait cannot be negative; a paper value is never below
0 there, so the cut changes no verdict; a cell whose every trial gave the same value
has the one-point interval [v, v], so a deterministic 0 must be 0), exact (Clopper-Pearson
or Poisson) for rates per 1,000. A trial count (`trials`) is reproduced when equal. A value
outside is *differs*. *Not comparable*: no config maps the table yet, the cell is not mapped
(the config says why), our cell was not exercised (its condition never occurred), it has no
trials, the paper's value is approximate (``~50``), or a trial count differs (another N).

The notes file (``harness/paper/paper_notes.yaml``) explains, by mechanism, why a cell
differs. A note never changes a number; a differing cell with no note is flagged
``UNEXPLAINED``. ``compare_table`` judges every cell of one paper table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import ConfigError
from harness.experiment.cells import format_cell
from harness.experiment.paper_cells import PaperCell, cells_by_table, half_unit, split_part
from harness.experiment.paper_section import table_ranges
from harness.experiment.yamlload import MAX_BYTES, YamlInputError, load_yaml
from harness.paper.mapping import (
    Source,
    config_files,
    judged_cells,
    mapping_for,
    paper_text,
    selection,
)
from harness.paper.measure import Measure, Measurer, measure
from harness.registry import did_you_mean

__all__ = [
    "DIFFERS",
    "NOTES_PATH",
    "NOT_COMPARABLE",
    "NO_CONFIG",
    "REPRODUCED",
    "RULE",
    "UNEXPLAINED",
    "Line",
    "Note",
    "Section",
    "Verdict",
    "compare_table",
    "find_note",
    "judge",
    "load_notes",
    "note_config_problems",
]

#: The notes file: why a cell differs, by mechanism.
NOTES_PATH = Path(__file__).with_name("paper_notes.yaml")

REPRODUCED = "reproduced"
DIFFERS = "differs"
NOT_COMPARABLE = "not comparable"
UNEXPLAINED = "UNEXPLAINED"
NO_CONFIG = "no config yet"

#: The verdict rule as REPRODUCTION.md states it.
RULE = (
    "A paper value p, printed with a rounding of h (half a unit of its last printed digit), "
    "is **reproduced** when it lies in our two-sided 95% interval widened by h: "
    "lo - h <= p <= hi + h. Intervals: Clopper-Pearson for proportions (a count is compared "
    "as the rate count / the paper's N), Student t for means, cut at the metric's declared "
    "range as the run's tables show it (a count or a wait cannot be negative; a cell whose "
    "every trial gave the same value has the one-point interval [v, v], so a deterministic 0 must be exactly "
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
        """Does the note apply to this differing cell compared through `config`?"""
        return (
            table == self.table
            and (not self.rows or row in self.rows)
            and (not self.columns or column in self.columns)
            and (self.config is None or self.config == config)
        )

    @property
    def specificity(self) -> int:
        """How many of rows, columns and config the note names."""
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
            problems.append(
                f"{at}.{key}: unknown key{did_you_mean(str(key), _NOTE_KEYS)}; "
                f"allowed: {', '.join(_NOTE_KEYS)}"
            )
        table, why = entry.get("table"), entry.get("why")
        if isinstance(table, bool) or not isinstance(table, int) or table not in by_table:
            problems.append(
                f"{at}.table: {table!r} is not a result table; allowed: {table_ranges(by_table)}"
            )
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
            Note(
                table,
                " ".join(why.split()),
                picked.get("rows", ()),
                picked.get("columns", ()),
                config,
            )
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


def find_note(
    notes: Sequence[Note], table: int, row: str, column: str, config: str | None
) -> Note | None:
    """The most specific note for a differing cell (the first of equals), or None."""
    found = [n for n in notes if n.matches(table, row, column, config)]
    return max(found, key=lambda n: n.specificity) if found else None  # max keeps the first


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
        """Judged cells per verdict; UNEXPLAINED counts the differing cells without a note."""
        out = {REPRODUCED: 0, DIFFERS: 0, UNEXPLAINED: 0, NOT_COMPARABLE: 0}
        for line in self.lines:
            out[line.verdict.kind] += 1
            if line.verdict.kind == DIFFERS and line.note is None:
                out[UNEXPLAINED] += 1
        return out


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
    pool = (
        [variant]
        if variant is not None
        else [s for s in srcs if any(not e.variant for _, e in s.entries(table))]
    )
    extra: dict[str, tuple[str, str]] = {}
    for src in pool:
        for _, entry in src.entries(table):
            for label, col in entry.columns.items():
                if col.of is not None and col.part is not None:
                    extra[label] = (col.of, col.part)
    lines: list[Line] = []
    for base, occurrence, parts in judged_cells(cells, extra):
        line = Line(
            row=base.row,
            occurrence=occurrence,
            column=base.column,
            paper=paper_text(base, parts),
            paper_n=str(base.n) if base.n else "—",
        )
        lines.append(line)
        if not pool:
            line.verdict = Verdict(NOT_COMPARABLE, NO_CONFIG)
            continue
        found = mapping_for(pool, table, base.row, occurrence, base.column, variant is not None)
        if isinstance(found, str):
            line.verdict = Verdict(NOT_COMPARABLE, found)
            continue
        src, entry, target, column = found
        mode = target.mode or src.config.modes[0]
        cell = selection(src.config, target.cell, column.cell)
        line.where = f"{src.name}: {mode}" + (
            f", {format_cell(sorted(cell.items()))}" if cell else ""
        )
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

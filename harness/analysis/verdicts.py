"""Paired verdicts under a run's main table: each mode against the baseline, per cell.

When a run's main table compares modes (its rows are modes) and the run has a baseline
(`report.baseline`, else tx-full when the config runs it) and at least one other mode,
`atomix run` and `atomix report` print, under the table, every mode's paired difference from
the baseline on the table's metric, per cell: the difference with its interval, the
two-sided p-value Holm-adjusted over every test of the block, and a plain verdict ("better",
"worse", "no evidence" at level `ALPHA`, or `n/a (not exercised)`). The numbers are
`harness.analysis.paired.paired_compare` on the same records, modes, baseline and cell
order that `atomix compare RUN --baseline BASELINE --metric METRIC` uses, so the two agree
(except that a proportion table reads 0/1 values as yes/no, and its `requires` marks the
cells that did not exercise it, which compare does not know); the verdict is `harness.analysis.paired.verdict`, whose direction is the table's `better`
("higher" unless the table says "lower").

The block is also written as ``tables/verdicts-<table>-vs-<baseline>.md|.csv``. Everything
here is a pure function of the records and the config: rebuilding it gives the same text.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.analysis.paired import PairedComparison, paired_compare, verdict
from harness.analysis.paired_render import markdown_block
from harness.analysis.runs import Run, main_table, table_specs
from harness.analysis.table import NOT_EXERCISED_TEXT
from harness.experiment.cells import cell_id, expand_cells
from harness.experiment.config import ExperimentConfig

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALPHA",
    "DEFAULT_BASELINE",
    "VerdictBlock",
    "baseline_of",
    "run_verdicts",
    "verdict_block",
    "verdicts_csv",
    "verdicts_markdown",
    "verdicts_rich",
    "write_verdicts",
]

#: The mode every other is tested against when the config does not name one.
DEFAULT_BASELINE = "tx-full"
#: The family-wise level of the verdicts (on Holm-adjusted p-values).
ALPHA = 0.05


@dataclass(frozen=True)
class VerdictBlock:
    """Every mode of a run's main table against `comparison.baseline`, per cell.

    Guarantees: `verdicts[i]` is the verdict of `comparison.rows[i]` at `alpha` in the
    direction `better`; a row whose cell did not exercise the table's condition reads
    `n/a (not exercised)` and carries no test.
    """

    table: str  # the main table's name
    title: str  # the main table's title
    comparison: PairedComparison
    better: str  # "higher" | "lower"
    alpha: float
    verdicts: tuple[str, ...]

    @property
    def stem(self) -> str:
        """``verdicts-<table>-vs-<baseline>``: the report files' name."""
        return f"verdicts-{self.table}-vs-{self.comparison.baseline}"

    @property
    def heading(self) -> str:
        cmp = self.comparison
        unit = ", percentage points" if cmp.kind == "binary" else ""
        return (
            f"{cmp.metric}{unit}: each mode minus {cmp.baseline} on paired trials "
            f"({self.better} is better)"
        )

    @property
    def note(self) -> str:
        """What the columns mean: interval, test, correction, level and N."""
        cmp = self.comparison
        conf = f"{100 * cmp.confidence:g}%"
        if cmp.kind == "binary":
            diff = f"{conf} Newcombe paired interval; +/-: pairs the mode won/lost"
        else:
            diff = (
                f"diff: mean paired difference, {conf} t interval; +/-: pairs where the mode "
                "was higher/lower"
            )
        tests = sum(1 for r in cmp.rows if not math.isnan(r.p))
        text = (
            f"{diff}; p: two-sided {cmp.test}, Holm-adjusted over the {tests} tests shown; "
            f"verdict at alpha = {self.alpha:g}. {self.n_text}."
        )
        if not all(r.exercised for r in cmp.rows):
            text += f" {NOT_EXERCISED_TEXT}: the cell's condition did not occur; not tested."
        unmatched = sum(r.unmatched for r in cmp.rows)
        if unmatched:
            text += f" {unmatched} trial(s) without a partner were left out."
        return text

    @property
    def n_text(self) -> str:
        """``N = 342 pairs per row``, naming the rows that differ from the most common N."""
        rows = self.comparison.rows
        counts: dict[int, int] = {}
        for r in rows:
            counts[r.pairs] = counts.get(r.pairs, 0) + 1
        common = max(sorted(counts), key=lambda n: counts[n])
        odd = [f"{r.pairs} ({r.mode}, {r.cell})" for r in rows if r.pairs != common]
        text = f"N = {common} pairs per row"
        if odd:
            shown = ", ".join(odd[:3]) + (f" and {len(odd) - 3} more" if len(odd) > 3 else "")
            text += f" except {shown}"
        return text

    def header(self) -> list[str]:
        conf = f"{100 * self.comparison.confidence:g}% CI"
        return ["cell", "mode", "diff", conf, "+/-", "p Holm", "verdict"]

    def display_rows(self) -> list[list[str]]:
        """Text cells in `header()` order, taken from the comparison's own display rows (the
        text `atomix compare` prints)."""
        out = []
        for row, text, word in zip(
            self.comparison.rows, self.comparison.display_rows(), self.verdicts, strict=True
        ):
            if not row.exercised:
                out.append([row.cell, row.mode, "", "", "", "", word])
                continue
            # compare's columns: cell, mode, pairs, base, mode, +/-, diff, CI, p, p Holm.
            out.append([row.cell, row.mode, text[6], text[7], text[5], text[9], word])
        return out


def baseline_of(config: ExperimentConfig) -> str | None:
    """`report.baseline`, else tx-full when the config runs it, else None (no verdicts)."""
    if config.report.baseline is not None:
        return config.report.baseline
    return DEFAULT_BASELINE if DEFAULT_BASELINE in config.modes else None


def _as_binary(records: Sequence[Mapping[str, Any]], metric: str) -> list[Mapping[str, Any]]:
    """A proportion table counts 0/1 values as no/yes: the paired test must read them alike
    (as yes/no, so McNemar), not as counts."""
    out: list[Mapping[str, Any]] = []
    for rec in records:
        v = rec.get("metrics", {}).get(metric)
        if isinstance(v, int | float) and not isinstance(v, bool) and v in (0, 1):
            rec = {**rec, "metrics": {**rec["metrics"], metric: bool(v)}}
        out.append(rec)
    return out


def verdict_block(
    records: Sequence[Mapping[str, Any]],
    config: ExperimentConfig,
    alpha: float = ALPHA,
    frame: pd.DataFrame | None = None,
) -> VerdictBlock | None:
    """The verdicts under `config`'s main table, or None when that table does not compare
    modes against a baseline (its rows are not modes, the baseline did not run, or no other
    mode did). Raises ValueError (from `paired_compare`) when the metric cannot be tested.
    `frame`: `records_frame(records)` where the caller has built it (for the tables), so
    that it is not built again in part."""
    specs = {s.name: s for s in table_specs(config)}
    spec = specs.get(main_table(config))
    baseline = baseline_of(config)
    if spec is None or spec.rows != "mode" or baseline is None:
        return None
    present = {str(r["mode"]) for r in records}
    if baseline not in present:
        return None
    # The modes and their order as `atomix compare` takes them by default.
    modes = [m for m in config.modes if m in present]
    modes += sorted(present - set(modes))
    if len(modes) < 2:
        return None
    model = next((t for t in config.report.tables if t.name == spec.name), None)
    better = model.direction if model is not None else "higher"
    if spec.kind == "proportion":
        records = _as_binary(records, spec.metric)
    cmp = paired_compare(
        records,
        spec.metric,
        modes,
        baseline=baseline,
        cell_order=[cell_id(config, c) for c in expand_cells(config)],
        requires=spec.requires,
        frame=frame,
    )
    words = tuple(verdict(r, better=better, alpha=alpha) for r in cmp.rows)
    return VerdictBlock(spec.name, spec.title, cmp, better, alpha, words)


def run_verdicts(run: Run, alpha: float = ALPHA) -> VerdictBlock | None:
    """`verdict_block` of a stored run (its records and its config)."""
    if not run.records:
        return None
    return verdict_block(run.records, run.config, alpha)


# --------------------------------------------------------------------------- renderers


def verdicts_rich(block: VerdictBlock) -> Any:
    """A compact rich Table for the terminal: each cell's name on a line of its own (cell
    names can be long), its modes indented under it; with one cell, just the modes. Cell
    text is literal."""
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    rt = RichTable(
        title=Text(block.heading),
        caption=Text(block.note),
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),  # with the separator: two spaces between columns
        title_justify="left",
        caption_justify="left",
    )
    header = block.header()[1:]
    grouped = len(block.comparison.cells) > 1
    for i, h in enumerate(header):
        name = "cell / mode" if i == 0 and grouped else h
        # Only the verdict may wrap: an 80-column terminal folds `n/a (not exercised)`.
        rt.add_column(Text(name), justify="right" if 1 <= i <= 4 else "left", no_wrap=i < 5)
    last = None
    for row in block.display_rows():
        if grouped and row[0] != last:
            rt.add_row(Text(row[0]), *(Text("") for _ in header[1:]))
            last = row[0]
        mode = f"  {row[1]}" if grouped else row[1]
        rt.add_row(*(Text(c) for c in [mode, *row[2:]]))
    return rt


def verdicts_markdown(block: VerdictBlock) -> str:
    """A pipe table under a bold heading, with the note below it."""
    aligns = [":---", ":---", *["---:"] * 4, ":---"]
    return markdown_block(block.heading, block.header(), block.display_rows(), block.note, aligns)


def _num(v: float) -> str:
    return "" if isinstance(v, float) and math.isnan(v) else repr(v)


def verdicts_csv(block: VerdictBlock) -> str:
    """One line per (cell, mode) with raw numbers (fractions for yes/no metrics, empty when
    not tested) and the verdict."""
    cmp = block.comparison
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "table", "metric", "better", "baseline", "cell_id", "mode", "pairs", "unmatched",
            "exercised", "baseline_value", "mode_value", "gained", "lost", "diff", "lo", "hi",
            "confidence", "test", "p_value", "p_holm", "alpha", "verdict",
        ]
    )  # fmt: skip
    for r, word in zip(cmp.rows, block.verdicts, strict=True):
        w.writerow(
            [
                block.table, cmp.metric, block.better, cmp.baseline, r.cell, r.mode, r.pairs,
                r.unmatched, "true" if r.exercised else "false", _num(r.base), _num(r.value),
                r.gained, r.lost, _num(r.diff), _num(r.lo), _num(r.hi), repr(cmp.confidence),
                cmp.test, _num(r.p), _num(r.p_holm), repr(block.alpha), word,
            ]
        )  # fmt: skip
    return buf.getvalue()


def write_verdicts(block: VerdictBlock, tables_dir: Path) -> list[Path]:
    """Write ``<stem>.md`` and ``<stem>.csv`` into `tables_dir`; returns the paths."""
    tables_dir = Path(tables_dir)
    tables_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, render in (("md", verdicts_markdown), ("csv", verdicts_csv)):
        path = tables_dir / f"{block.stem}.{ext}"
        with path.open("w", encoding="utf-8", newline="\n") as fh:
            fh.write(render(block))
        paths.append(path)
    return paths

"""Two runs compared trial by trial: `atomix compare RUN_A RUN_B`.

Two runs of one workload (two models, two seeds, the code before and after a change) are
paired on the trial's place in the plan: the same mode, the same cell and the same trial
index. For the tau2 workloads the trial index fixes the task, so a pair is one task under one
mode in both runs. With the same seed the pair also shares the scenario and the fault draws
(common random numbers); with two seeds it shares only what the trial index fixes, and the
footer says so. Each (mode, cell) is tested with `harness.analysis.paired`: exact McNemar on
a yes/no metric (Wilcoxon signed-rank on a numeric one), Newcombe's interval, Holm's
adjustment over every (mode, cell) shown; `harness.analysis.paired.verdict` reads each row
as RUN_B better, worse, or no evidence, at `ALPHA`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.analysis.paired import PairedComparison, PairRow, paired_compare, verdict
from harness.analysis.runs import Run, _cell_order
from harness.experiment.config import config_difference
from harness.registry import did_you_mean

ALPHA = 0.05
SEP = " | "  # between mode and cell in the underlying comparison's cell names


@dataclass(frozen=True)
class RunComparison:
    """RUN_B against RUN_A per (mode, cell). Guarantees: `rows[i]` is mode `modes_of[i]`,
    cell `cells_of[i]`, and `verdicts[i]` its verdict (`better` means RUN_B is better in the
    metric's good direction `better`)."""

    a: Run
    b: Run
    comparison: PairedComparison  # baseline "A", mode "B", cells "mode | cell"
    better: str
    alpha: float
    verdicts: tuple[str, ...]
    notes: tuple[str, ...]  # what differs between the runs, what was left out

    @property
    def rows(self) -> list[PairRow]:
        return self.comparison.rows

    def split(self, row: PairRow) -> tuple[str, str]:
        """(mode, cell) of a row."""
        mode, _, cell = row.cell.partition(SEP)
        return mode, cell

    def counts(self) -> dict[str, int]:
        """How many rows read better, worse, no evidence, and not exercised."""
        out = {"better": 0, "worse": 0, "no evidence": 0, "not exercised": 0}
        for v in self.verdicts:
            out[v if v in out else "not exercised"] += 1
        return out

    def verdict_line(self, name_a: str = "RUN_A", name_b: str = "RUN_B") -> str:
        """`RUN_B vs RUN_A: better on 1 of 6 cells, worse on 0, no evidence on the rest
        (clean, Holm, alpha 0.05).`"""
        c = self.counts()
        n = len(self.verdicts)
        text = (
            f"{name_b} vs {name_a}: better on {c['better']} of {n} mode x cell pairs, "
            f"worse on {c['worse']}, no evidence on the rest"
        )
        if c["not exercised"]:
            text += f" ({c['not exercised']} not exercised)"
        return text + f" ({self.comparison.metric}, Holm, alpha {self.alpha:g})."


def _better(run: Run, metric: str) -> str:
    """The metric's good direction as the run's config declares it (a table's `better`),
    else "higher"."""
    for table in run.config.report.tables:
        if table.metric == metric and getattr(table, "better", None):
            return str(table.better)
    return "higher"


def _relabel(
    records: Sequence[Mapping[str, Any]], side: str, modes: set[str]
) -> list[dict[str, Any]]:
    out = []
    for r in records:
        if r["mode"] not in modes:
            continue
        out.append(
            {
                **r,
                "key": f"{side}/{r['key']}",
                "mode": side,
                "cell_id": f"{r['mode']}{SEP}{r['cell_id']}",
                "seed": 0,  # paired on the trial index; the seeds are compared in the notes
            }
        )
    return out


def compare_runs(
    a: Run,
    b: Run,
    metric: str = "clean",
    modes: Sequence[str] | None = None,
    better: str | None = None,
    alpha: float = ALPHA,
) -> RunComparison:
    """RUN_B against RUN_A (see the module docstring). ValueError naming the problem: runs of
    two workloads, no mode in common, a `modes` entry neither run has, an unknown metric."""
    if a.config.workload != b.config.workload:
        raise ValueError(
            f"the runs are of two workloads ({a.config.workload!r} and {b.config.workload!r}): "
            "their trials do not pair"
        )
    present_a = list(dict.fromkeys(str(r["mode"]) for r in a.records))
    present_b = {str(r["mode"]) for r in b.records}
    order = [m for m in a.config.modes if m in present_a] + sorted(
        set(present_a) - set(a.config.modes)
    )
    common = [m for m in order if m in present_b]
    if modes is not None:
        bad = [m for m in modes if m not in common]
        if bad:
            raise ValueError(
                f"--modes: {', '.join(bad)} has no trials in both runs"
                f"{did_you_mean(bad[0], common)}; modes in both: {', '.join(common) or 'none'}"
            )
        common = [m for m in common if m in modes]
    if not common:
        raise ValueError(
            f"the runs have no mode in common (RUN_A: {', '.join(sorted(present_a))}; "
            f"RUN_B: {', '.join(sorted(present_b))})"
        )
    keep = set(common)
    records = _relabel(a.records, "A", keep) + _relabel(b.records, "B", keep)
    # Only a (mode, cell) both runs have, and only if some trial index pairs.
    slots = {
        side: {(r["cell_id"], r["trial"]) for r in records if r["mode"] == side} for side in "AB"
    }
    both = slots["A"] & slots["B"]
    if not both:
        raise ValueError(
            "no trial of RUN_B pairs with one of RUN_A (same mode, cell and trial index): "
            f"RUN_A has {len(a.records)} trial(s), RUN_B {len(b.records)}; a run made with "
            "--tasks or --limit may hold other trials than the other run"
        )
    shared_cells = {cell for cell, _ in both}
    dropped = len(records)
    records = [r for r in records if r["cell_id"] in shared_cells]
    dropped -= len(records)
    cells = _cell_order(a.config, {str(r["cell_id"]) for r in a.records})
    cell_order = [f"{m}{SEP}{c}" for m in common for c in cells]
    cmp = paired_compare(records, metric, ["A", "B"], baseline="A", cell_order=cell_order)
    good = better or _better(a, metric)
    verdicts = tuple(verdict(r, better=good, alpha=alpha) for r in cmp.rows)
    notes = []
    if a.config.seed != b.config.seed:
        notes.append(
            f"the seeds differ (A {a.config.seed}, B {b.config.seed}): a pair shares its "
            "trial index (for tau2 workloads the task), not its fault draws"
        )
    diff = config_difference(
        a.config.model_dump(mode="json", exclude={"report", "paper", "seed"}),
        b.config.model_dump(mode="json", exclude={"report", "paper", "seed"}),
    )
    if diff:
        notes.append(
            "configs differ, first at "
            + diff.replace(" in the run, ", " in A, ").replace(" now", " in B")
        )
    if dropped:
        notes.append(f"{dropped} trial(s) of a mode and cell that only one run has were left out")
    only = sorted((set(present_a) ^ present_b) - keep)
    if only and modes is None:
        notes.append(f"modes in one run only, left out: {', '.join(only)}")
    return RunComparison(a, b, cmp, good, alpha, verdicts, tuple(notes))

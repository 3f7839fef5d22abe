"""The verdict rule of `atomix reproduce`, on constructed records: how a proportion, a mean, a
count or a timing is judged against the paper's cell, when a cell is not comparable, and how
notes explain a differing cell in REPRODUCTION.md."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from harness.experiment.config import ConfigError
from harness.experiment.paper_cells import PaperCell, cells_by_table, half_unit
from harness.experiment.sections import PaperColumnModel
from harness.paper.judge import (
    DIFFERS,
    NOT_COMPARABLE,
    REPRODUCED,
    UNEXPLAINED,
    Line,
    Note,
    Section,
    Verdict,
    judge,
    load_notes,
)
from harness.paper.measure import Measure, Measurer, measure
from harness.paper.render import render

# --------------------------------------------------------------------------- the verdict


def record(i: int, metrics: dict[str, Any], *, injected: int = 1, mode: str = "tx-full") -> dict[str, Any]:
    return {
        "key": f"tiny/{mode}/fp=0.1/{i}",
        "mode": mode,
        "cell": {"fp": 0.1},
        "cell_id": "fp=0.1",
        "trial": i,
        "seed": 0,
        "metrics": metrics,
        "exercised": {
            "faults": {"F1": injected},
            "faults_total": injected,
            "aborts": 0,
            "compensations": 0,
            "irreversible_calls": 0,
            "sends": 0,
            "fault_classes": ["F1"],
            "faults_armed": True,
        },
    }


def paper_cell(value: str, n: int | None = 30) -> PaperCell:
    return PaperCell(table=6, row="Tx-Full", column="c", value=value, n=n, caption="")


def column(stat: str, metric: str = "clean", **more: Any) -> PaperColumnModel:
    return PaperColumnModel(metric=metric, stat=stat, **more)


def test_a_proportion_is_judged_by_its_clopper_pearson_interval() -> None:
    recs = [record(i, {"clean": i < 21}) for i in range(30)]  # 21/30 = 70% [51, 85]
    ours = measure(Measurer(recs), "tx-full", {"fp": 0.1}, column("proportion"))
    assert (ours.n, ours.successes) == (30, 21)
    assert math.isclose(ours.value, 70.0)
    assert 50 < ours.lo < 51 and 85 < ours.hi < 86
    assert judge(paper_cell("73"), ours).kind == REPRODUCED
    assert judge(paper_cell("40"), ours) == Verdict(DIFFERS, "40 below our interval")
    assert judge(paper_cell("90%"), ours).kind == DIFFERS


def test_the_papers_rounding_widens_the_interval_by_half_a_unit() -> None:
    ours = Measure("proportion", 50.0, 40.0, 59.6, 30, 15)
    assert judge(paper_cell("60"), ours).kind == REPRODUCED  # could be 59.5
    assert judge(paper_cell("60.0"), ours).kind == DIFFERS  # at least 59.95
    assert judge(paper_cell("59.6"), ours).kind == REPRODUCED
    assert judge(paper_cell("61"), ours).kind == DIFFERS
    assert judge(paper_cell("39.6"), ours) == Verdict(DIFFERS, "39.6 below our interval")
    assert half_unit("1,163.2") == pytest.approx(0.05) and half_unit("75%") == 0.5


def test_a_deterministic_zero_must_be_exactly_zero() -> None:
    recs = [record(i, {"clean": True, "wait_ms": 0.0}) for i in range(20)]
    ours = measure(Measurer(recs), "tx-full", {}, column("mean", "wait_ms"))
    assert (ours.value, ours.lo, ours.hi) == (0.0, 0.0, 0.0)
    assert judge(paper_cell("0.0"), ours).kind == REPRODUCED
    assert judge(paper_cell("0.00"), ours).kind == REPRODUCED
    assert judge(paper_cell("0.01"), ours).kind == DIFFERS
    assert judge(paper_cell("14.8"), ours).kind == DIFFERS


def test_a_mean_is_scaled_and_judged_by_its_t_interval() -> None:
    recs = [record(i, {"clean": True, "blocked": 0.5 + (0.25 if i % 2 else -0.25)}) for i in range(40)]
    ours = measure(
        Measurer(recs), "tx-full", {}, column("mean", "blocked", scale=100)
    )
    assert math.isclose(ours.value, 50.0) and ours.lo < 50 < ours.hi < 60
    assert judge(paper_cell("52%"), ours).kind == REPRODUCED
    assert judge(paper_cell("75%"), ours).kind == DIFFERS


def test_a_count_is_compared_as_a_rate_over_the_papers_n() -> None:
    recs = [record(i, {"clean": True, "leaked": i < 16}) for i in range(20)]  # 80% [56, 94]
    ours = measure(Measurer(recs), "tx-full", {}, column("count", "leaked"))
    assert (ours.successes, ours.n) == (16, 20)
    assert judge(paper_cell("400", n=500), ours).kind == REPRODUCED  # 80% of 500
    assert judge(paper_cell("100", n=500), ours).kind == DIFFERS  # 20% of 500
    assert judge(paper_cell("400", n=None), ours).kind == NOT_COMPARABLE


def test_zero_counts_the_trials_whose_metric_is_zero() -> None:
    recs = [record(i, {"clean": True, "reported_residue": i % 4}) for i in range(20)]
    ours = measure(
        Measurer(recs), "tx-full", {},
        column("count", "reported_residue", zero=True),
    )
    assert ours.successes == 5


def test_trial_counts_must_be_equal_else_another_n() -> None:
    ours = Measure("trials", 120.0, 120.0, 120.0, 120)
    assert judge(paper_cell("120", n=120), ours).kind == REPRODUCED
    verdict = judge(paper_cell("600", n=600), ours)
    assert verdict == Verdict(NOT_COMPARABLE, "different N: the paper's 600, ours 120")


def test_a_cell_that_was_not_exercised_is_not_comparable() -> None:
    recs = [record(i, {"clean": True}, injected=0) for i in range(20)]
    ours = measure(Measurer(recs), "tx-full", {}, column("proportion"))
    assert not ours.exercised and ours.text == "n/a (not exercised)"
    verdict = judge(paper_cell("100"), ours)
    assert verdict.kind == NOT_COMPARABLE and verdict.reason.startswith("not exercised")


def test_no_trials_and_approximate_values_are_not_comparable() -> None:
    recs = [record(i, {"clean": True}) for i in range(5)]
    measurer = Measurer(recs)
    assert measure(measurer, "saga", {}, column("proportion")).n == 0
    assert judge(paper_cell("1"), measure(measurer, "saga", {}, column("proportion"))).kind == NOT_COMPARABLE
    approx = judge(paper_cell("~50"), Measure("mean", 50.0, 0.0, 100.0, 5))
    assert approx.kind == NOT_COMPARABLE and "approximate" in approx.reason


# --------------------------------------------------------------------------- notes


def test_the_notes_file_loads_and_names_real_cells() -> None:
    notes = load_notes()
    assert notes, "harness/paper/paper_notes.yaml holds no notes"
    assert all(n.why for n in notes)


def test_a_bad_note_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "notes.yaml"
    path.write_text(
        "- {table: 4, why: x}\n- {table: 6, rows: [Tx-Ful], why: x}\n"
        "- {table: 6, columns: [nope], why: x}\n- {table: 6, why: x, extra: 1}\n- {table: 6}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_notes(path)
    text = str(info.value)
    assert f"{path}: 0.table: 4 is not a result table" in text
    assert "1.rows: 'Tx-Ful' is not one of Table 6's rows; did you mean Tx-Full?" in text
    assert "2.columns: 'nope' is not one of Table 6's columns" in text
    assert "3.extra: unknown key" in text
    assert "4.why: required" in text


def test_the_most_specific_note_wins() -> None:
    from harness.paper.judge import find_note

    broad = Note(6, "broad")
    narrow = Note(6, "narrow", rows=("TCC-Confirm",))
    assert find_note([broad, narrow], 6, "TCC-Confirm", "c", "tau_retail") is narrow
    assert find_note([broad, narrow], 6, "Tx-Full", "c", "tau_retail") is broad
    assert find_note([narrow], 6, "Tx-Full", "c", None) is None


def test_a_differing_cell_without_a_note_is_flagged_unexplained() -> None:
    lines = [
        Line("Tx-Full", 0, "c1", "73", "30", "90 [73, 98]", "x: tx-full", "30",
             Verdict(DIFFERS, "73 below our interval")),
        Line("TCC-Confirm", 0, "c1", "40", "30", "87 [69, 96]", "x: tcc", "30",
             Verdict(DIFFERS, "40 below our interval"), Note(6, "TCC keys its confirms.")),
        Line("Saga-Compensation", 0, "c1", "37", "30", "37 [20, 56]", "x: saga", "30",
             Verdict(REPRODUCED, "37 within ours")),
    ]
    section = Section(6, lines, configs=["x"])
    assert section.counts() == {REPRODUCED: 1, DIFFERS: 2, UNEXPLAINED: 1, NOT_COMPARABLE: 0}
    text = render([section], {}, command="atomix reproduce", quick=True, out=Path("o"),
                  wall_s=1.0, cpu_s=2.0, when="today", rev="abc")
    assert f"differs — **{UNEXPLAINED}** (73 below our interval)" in text
    assert "differs [1] (40 below our interval)" in text
    assert "[1] TCC keys its confirms." in text


# --------------------------------------------------------------------------- timings (Table 17)


def test_a_timing_is_judged_within_a_factor_of_the_papers() -> None:
    from harness.paper.timing import TIMING_FACTOR, judge_timing

    cell = paper_cell("85")
    assert judge_timing(cell, 85 * (TIMING_FACTOR - 0.1)).kind == REPRODUCED
    assert judge_timing(cell, 85 / (TIMING_FACTOR - 0.1)).kind == REPRODUCED
    above = judge_timing(cell, 85 * (TIMING_FACTOR + 0.1))
    assert above.kind == DIFFERS and "above" in above.reason
    assert judge_timing(cell, 85 / (TIMING_FACTOR + 0.1)).kind == DIFFERS
    assert judge_timing(paper_cell("~50"), 50).kind == NOT_COMPARABLE


def test_a_benchmark_table_is_measured_once_then_reused(tmp_path: Path) -> None:
    from harness.paper.timing import Benchmark, benchmark_section, run_benchmark

    calls: list[tuple[int, int]] = []

    def measure(runs: int, repeats: int) -> dict[str, dict[str, list[float]]]:
        calls.append((runs, repeats))
        paper = {c.row: {} for c in cells_by_table()[17]}
        for c in cells_by_table()[17]:
            paper[c.row][c.column] = [float(c.number)] * repeats
        paper["16"]["Commit (μs)"] = [10.0] * repeats  # 939 in the paper: differs
        return paper

    bench = Benchmark(17, "constructed", 200, measure)
    path, data = run_benchmark(bench, tmp_path, quick=True)
    again_path, again = run_benchmark(bench, tmp_path, quick=True)
    assert calls == [(200, data["repeats"])] and again_path == path and again == data
    notes = [Note(17, "why commits differ", columns=("Commit (μs)",))]
    section = benchmark_section(bench, data, notes)
    verdicts = {(ln.row, ln.column): ln for ln in section.lines}
    assert len(verdicts) == len(cells_by_table()[17])
    assert verdicts[("2", "Setup (μs)")].verdict.kind == REPRODUCED
    differing = verdicts[("16", "Commit (μs)")]
    assert differing.verdict.kind == DIFFERS and differing.note is not None
    assert section.counts()[DIFFERS] == 1 and section.counts()[UNEXPLAINED] == 0


def test_the_speculation_benchmark_gives_every_cell_of_table_17() -> None:
    from harness.paper.timing import speculation_latency

    figures = speculation_latency(runs=5, repeats=1)  # a real run, in a fresh process
    for cell in cells_by_table()[17]:
        (value,) = figures[cell.row][cell.column]
        assert value > 0

"""`atomix reproduce` and the `paper:` mapping: validation against the paper's cells, the
verdict rule on constructed records, REPRODUCTION.md of a tiny real run, the command's
errors, and that every paper table has a config."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from harness.experiment.config import (
    ConfigError,
    PaperColumnModel,
    config_hash,
    load_config,
)
from harness.paper.cells import PaperCell, cells_by_table, half_unit, split_part, tables
from harness.paper.reproduce import (
    BENCHMARKS,
    DIFFERS,
    NOT_COMPARABLE,
    REPRODUCED,
    UNEXPLAINED,
    Line,
    Measure,
    Measurer,
    Note,
    Section,
    Verdict,
    check_all,
    judge,
    load_notes,
    measure,
    parse_tables,
    quick_trials,
    render,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
runner = CliRunner()

#: Paper tables no config maps (issue 12, point 1): none since Table 18 landed.
MISSING: set[int] = set()

TINY: dict[str, Any] = {
    "name": "tiny_residue",
    "description": "paper Table 16 in miniature",
    "workload": "synthetic",
    "seed": 16,
    "trials": 4,
    "modes": ["tx-full", "tx-no-residue-classification"],
    "params": {"veto_rate": 1.0},
    "faults": {"classes": ["F3"]},
    "labels": {"faults.rate": "cf_p"},
    "grid": {"faults.rate": [0.0, 0.1, 0.3]},
    "paper": [
        {
            "table": 16,
            "rows": {
                "Tx-Full": [
                    {"mode": "tx-full", "cell": {"cf_p": 0.0}},
                    {"mode": "tx-full", "cell": {"cf_p": 0.1}},
                    {"mode": "tx-full", "cell": {"cf_p": 0.3}},
                ],
                "Tx-Full-NoResidueClassification": {
                    "mode": "tx-no-residue-classification",
                    "cell": {"cf_p": 0.3},
                },
            },
            "columns": {
                "Trials": {"metric": "residue_free", "stat": "trials"},
                "GT clean": {"metric": "residue_free", "stat": "count"},
                "Classified clean": {"metric": "reported_residue", "stat": "count", "zero": True},
                "Mismatch": {"metric": "residue_mismatch", "stat": "count"},
            },
            "unmapped": {"cf_p": "the row's setting"},
        }
    ],
}


def write(directory: Path, data: dict[str, Any], name: str = "tiny.yaml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def with_paper(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(TINY)
    data["paper"][0].update(changes)
    return data


def problems_of(tmp_path: Path, data: dict[str, Any]) -> str:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    return str(info.value)


# --------------------------------------------------------------------------- the mapping


def test_the_tiny_mapping_is_valid(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, TINY))
    assert config.paper[0].table == 16


def test_a_table_without_results_is_refused_with_a_hint(tmp_path: Path) -> None:
    text = problems_of(tmp_path, with_paper(table=4))
    assert "paper.0.table: 4 is not a result table of the paper" in text
    assert "allowed: 1-3, 5-21" in text


def test_an_unknown_row_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    data = with_paper()
    data["paper"][0]["rows"]["Tx-Ful"] = data["paper"][0]["rows"].pop("Tx-Full")
    text = problems_of(tmp_path, data)
    assert "paper.0.rows.Tx-Ful: not a row of Table 16; did you mean Tx-Full?" in text


def test_an_unknown_column_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    data = with_paper()
    data["paper"][0]["columns"]["GT clear"] = data["paper"][0]["columns"].pop("GT clean")
    text = problems_of(tmp_path, data)
    assert "paper.0.columns.GT clear: not a column of Table 16; did you mean GT clean?" in text


def test_a_part_of_a_column_is_not_mapped_on_its_own(tmp_path: Path) -> None:
    data = copy.deepcopy(TINY)
    data["paper"] = [
        {
            "table": 6,
            "rows": {"Tx-Full": "tx-full"},
            "columns": {
                "τ-bench (fp=0, N=10) / 95% CI lower": {"metric": "clean", "stat": "proportion"}
            },
        }
    ]
    text = problems_of(tmp_path, data)
    assert "the lower of column 'τ-bench (fp=0, N=10)'" in text


def test_modes_and_cells_must_be_the_configs(tmp_path: Path) -> None:
    data = with_paper(rows={"Tx-Full": "saga"})
    data["paper"][0]["columns"]["GT clean"]["cell"] = {"cf_p": 0.5, "fpp": 1}
    text = problems_of(tmp_path, data)
    assert "paper.0.rows.Tx-Full: mode 'saga' is not run by this config" in text
    assert "paper.0.columns.GT clean.cell.cf_p: 0.5 is not a value of cf_p" in text
    assert "paper.0.columns.GT clean.cell.fpp: not a cell parameter of this config" in text


def test_a_column_needs_a_statistic_or_to_be_a_part(tmp_path: Path) -> None:
    data = with_paper()
    data["paper"][0]["columns"]["Mismatch"] = {"of": "GT clean"}
    assert "`of` and `part` go together" in problems_of(tmp_path, data)
    data["paper"][0]["columns"]["Mismatch"] = {"metric": "residue_mismatch"}
    assert "a column needs `metric` and `stat`" in problems_of(tmp_path, data)


def test_unmapped_labels_must_exist_and_not_be_mapped(tmp_path: Path) -> None:
    data = with_paper(unmapped={"cf_q": "x", "Mismatch": "y"})
    text = problems_of(tmp_path, data)
    assert "paper.0.unmapped.cf_q: not a row or column of Table 16; did you mean cf_p?" in text
    assert "paper.0.unmapped.Mismatch: is mapped too" in text


def test_a_count_needs_the_papers_n(tmp_path: Path) -> None:
    data = copy.deepcopy(TINY)
    data["labels"] = {"faults.rate": "fp"}
    data["paper"] = [
        {"table": 9, "rows": {"Tx-Full": "tx-full"},
         "columns": {"fp=0.10 / F1": {"metric": "clean", "stat": "count"}}}
    ]
    assert "count needs the paper's N" in problems_of(tmp_path, data)


def test_a_narrowing_override_does_not_break_the_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, TINY)
    config = load_config(path, overrides={"modes": ["tx-full"]}, grid={"faults.rate": [0.3]})
    assert config.modes == ["tx-full"]


def test_the_paper_section_is_not_part_of_the_config_hash(tmp_path: Path) -> None:
    with_section = load_config(write(tmp_path, TINY, "a.yaml"))
    without = load_config(write(tmp_path, {**TINY, "paper": []}, "b.yaml"))
    assert config_hash(with_section) == config_hash(without)


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
    from harness.paper.reproduce import find_note

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


# --------------------------------------------------------------------------- a tiny real run


def test_reproduction_md_of_a_tiny_run(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    write(configs, TINY, "tiny_residue.yaml")
    out = tmp_path / "out"
    args = ["reproduce", "--quick", "--tables", "16,5", "--configs", str(configs),
            "--out", str(out), "--jobs", "1"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    text = (out / "REPRODUCTION.md").read_text(encoding="utf-8")
    assert re.search(r"^- Revision: \S+", text, re.M)
    assert re.search(r"^- Date: \d{4}-\d\d-\d\d \d\d:\d\d UTC$", text, re.M)
    assert "- Command: `atomix reproduce --quick --tables 5,16 --out" in text
    assert "- Mode: quick" in text and "## Verdict rule" in text
    assert text.index("## Table 5") < text.index("## Table 16")
    assert f"> {tables()[16]}" in text
    table16 = text[text.index("## Table 16") :]
    rows = [ln for ln in table16.splitlines() if ln.startswith("| Tx-Full")]
    assert len(rows) == 4 * 5  # three Tx-Full rows and the ablation's, five columns each
    assert "| Tx-Full (2 of 3) | GT clean | 589 |" in text
    assert "tiny_residue: tx-full, cf_p=0.1" in text
    table5 = text[text.index("## Table 5") : text.index("## Table 16")]
    judged5 = [ln for ln in table5.splitlines() if ln.startswith("| ") and "paper row" not in ln and ":---" not in ln]
    assert judged5 and all("not comparable: no config yet" in ln for ln in judged5)
    assert len(judged5) == sum(1 for c in cells_by_table()[5] if split_part(c.column)[1] is None)
    mismatch = [ln for ln in rows if "| Mismatch |" in ln and "cf_p=0.0" in ln]
    assert mismatch and "reproduced" in mismatch[0]  # no compensation fails at cf_p 0
    trials = [ln for ln in rows if "| Trials |" in ln and "cf_p=0.0" in ln]
    assert trials and "not comparable: different N: the paper's 600, ours 4" in trials[0]
    assert "| Saga-Compensation | GT clean | 559 |" in table16  # unmapped rows are listed too
    runs = sorted(p.parent for p in out.glob("*/*/manifest.json"))
    assert len(runs) == 1
    again = runner.invoke(app, args, catch_exceptions=False)
    assert again.exit_code == 0 and "reused" in again.output
    assert sorted(p.parent for p in out.glob("*/*/manifest.json")) == runs


def test_an_unfinished_run_in_out_is_resumed_not_restarted(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    path = write(configs, TINY, "tiny_residue.yaml")
    out = tmp_path / "out"
    first = runner.invoke(app, ["run", str(path), "--out", str(out), "--limit", "1", "--quiet"])
    assert first.exit_code == 0, first.output
    (run_dir,) = [p.parent for p in out.glob("*/*/manifest.json")]
    args = ["reproduce", "--quick", "--tables", "16", "--configs", str(configs), "--out", str(out)]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"resuming {run_dir}" in result.output
    assert [p.parent for p in out.glob("*/*/manifest.json")] == [run_dir]
    lines = (run_dir / "trials.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 * 2 * TINY["trials"]  # cells x modes x trials, each once


def test_two_configs_may_not_both_reproduce_one_cell(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    write(configs, TINY, "a.yaml")
    write(configs, {**TINY, "name": "tiny_b"}, "b.yaml")
    notes = tmp_path / "notes.yaml"
    notes.write_text("[]\n", encoding="utf-8")
    problems = check_all(configs, notes)
    assert any("is also mapped by" in p and "b.yaml" in p for p in problems)
    variant = copy.deepcopy(TINY)
    variant["name"] = "tiny_b"
    variant["paper"][0]["variant"] = "the same, as a labelled variant"
    write(configs, variant, "b.yaml")
    assert check_all(configs, notes) == []


def test_a_note_naming_an_unknown_config_is_a_problem(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    write(configs, TINY, "tiny_residue.yaml")
    notes = tmp_path / "notes.yaml"
    notes.write_text("- {table: 16, config: tiny_residu, why: x}\n", encoding="utf-8")
    (problem,) = check_all(configs, notes)
    assert "names config 'tiny_residu'" in problem and "did you mean tiny_residue?" in problem


# --------------------------------------------------------------------------- the command


@pytest.mark.parametrize(
    ("tables_", "expected"),
    [
        ("4", "4 is not a result table of the paper (Table 4 is the adapter specification"),
        ("22", "did you mean 21?"),
        ("6,x", "'x' is not a table number"),
        ("", "no table given"),
    ],
)
def test_bad_table_numbers_exit_2_with_a_hint(tables_: str, expected: str) -> None:
    result = runner.invoke(app, ["reproduce", "--tables", tables_])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


def test_a_bad_mapping_exits_2_naming_the_file(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    path = write(configs, with_paper(rows={"Tx-Ful": "tx-full"}), "broken.yaml")
    result = runner.invoke(
        app, ["reproduce", "--tables", "16", "--configs", str(configs), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2
    assert str(path) in result.output and "did you mean Tx-Full?" in result.output
    assert not (tmp_path / "o").exists()


def test_a_missing_configs_directory_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["reproduce", "--configs", str(tmp_path / "none")])
    assert result.exit_code == 2 and "not a directory" in result.output


def test_parse_tables_sorts_and_dedupes() -> None:
    assert parse_tables("16, 6,6,Table 1") == [1, 6, 16]


def test_quick_n_is_a_fifth_with_a_floor() -> None:
    assert [quick_trials(n) for n in (600, 300, 100, 30, 10)] == [120, 60, 20, 20, 10]


# --------------------------------------------------------------------------- coverage


def paper_tables_of_configs() -> dict[str, set[int]]:
    """Config name -> the tables its `paper:` section reproduces (not as a variant)."""
    out = {}
    for path in sorted(CONFIGS.glob("*.yaml")):
        config = load_config(path)
        out[path.stem] = {e.table for e in config.paper if not e.variant}
        out[path.stem] |= {-e.table for e in config.paper if e.variant}  # variants: negative
    return out


def test_the_shipped_mappings_are_valid_and_do_not_overlap() -> None:
    assert check_all(CONFIGS) == []


def test_every_config_names_its_tables() -> None:
    unnamed = [name for name, named in paper_tables_of_configs().items() if not named]
    assert not unnamed, f"configs without a `paper:` section: {unnamed}"


def test_exactly_the_listed_tables_lack_a_config() -> None:
    named = set().union(*paper_tables_of_configs().values()) | set(BENCHMARKS)
    assert set(tables()) - named == MISSING


def test_every_paper_table_has_a_config() -> None:
    configs = paper_tables_of_configs()
    assert all(configs.values()), "a config names no paper table"
    named = set().union(*configs.values()) | set(BENCHMARKS)
    missing = sorted(set(tables()) - named)
    assert not missing, f"paper tables with no config: {missing}"


# --------------------------------------------------------------------------- timings (Table 17)


def test_a_timing_is_judged_within_a_factor_of_the_papers() -> None:
    from harness.paper.reproduce import TIMING_FACTOR, judge_timing

    cell = paper_cell("85")
    assert judge_timing(cell, 85 * (TIMING_FACTOR - 0.1)).kind == REPRODUCED
    assert judge_timing(cell, 85 / (TIMING_FACTOR - 0.1)).kind == REPRODUCED
    above = judge_timing(cell, 85 * (TIMING_FACTOR + 0.1))
    assert above.kind == DIFFERS and "above" in above.reason
    assert judge_timing(cell, 85 / (TIMING_FACTOR + 0.1)).kind == DIFFERS
    assert judge_timing(paper_cell("~50"), 50).kind == NOT_COMPARABLE


def test_a_benchmark_table_is_measured_once_then_reused(tmp_path: Path) -> None:
    from harness.paper.reproduce import Benchmark, benchmark_section, run_benchmark

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
    from harness.paper.reproduce import speculation_latency

    figures = speculation_latency(runs=5, repeats=1)  # a real run, in a fresh process
    for cell in cells_by_table()[17]:
        (value,) = figures[cell.row][cell.column]
        assert value > 0


# --------------------------------------------------------------------------- partial tables' workloads


def test_the_table_9_f3_cell_gives_every_compensating_mode_something_to_compensate() -> None:
    import random

    from harness.experiment.runner import plan
    from harness.experiment.trial import TrialSpec, run_trial
    from harness.workloads.synthetic import SyntheticWorkload, make_task
    from harness.world.faults import FaultConfig

    config = load_config(CONFIGS / "synthetic_fault_class.yaml")
    (f3,) = {s.cell_id: s for s in plan(config) if s.cell.get("class") == "F3" and s.trial == 0
             and s.mode == "tx-full" and s.cell.get("fp") == 0.02}.values()
    assert f3.params == {"veto_rate": 1.0, "min_bookings": 1, "sends": False}
    # The defaults draw exactly the plans they drew before the two parameters existed.
    assert make_task(random.Random(3), "a0", "t") == make_task(random.Random(3), "a0", "t", min_bookings=0, sends=True)
    for trial in range(20):
        (task,) = SyntheticWorkload().scenario(random.Random(trial), trial, f3.params).tasks
        tools = [s.tool for s in task.steps]
        assert task.veto and "book" in tools and "send" not in tools
    # So tx-full compensates in every trial, and F3 can fail those compensations.
    for trial in range(5):
        record = run_trial(TrialSpec("probe", "synthetic", "tx-full", "F3", {}, trial, 7,
                                     faults=FaultConfig(rate=0.3, classes="F3"), params=f3.params))
        ex = record["exercised"]
        assert ex["compensations"] + ex["faults"]["F3"] >= 1 and ex["sends"] == 0


def test_table_11_extra_writes_count_writes_that_landed_again() -> None:
    from harness.experiment.trial import TrialSpec, run_trial

    params = {"contended": 2, "plan_delay_ms": [20, 120], "disjoint": False, "agents": 4}
    totals: dict[str, int] = {}
    for mode in ("no-tx", "tx-no-abort-on-stale", "occ"):
        totals[mode] = 0
        for trial in range(6):
            m = run_trial(TrialSpec("probe", "tau_contention", mode, "c", {}, trial, 2026, params=params))["metrics"]
            assert 0 <= m["extra_writes"] <= m["aborts"]  # only a retried attempt writes again
            totals[mode] += m["extra_writes"]
    # Without aborts every agent writes its order once; OCC's retries write again.
    assert totals["no-tx"] == totals["tx-no-abort-on-stale"] == 0 < totals["occ"]

"""`atomix reproduce` and the `paper:` mapping: validation against the paper's cells,
REPRODUCTION.md of a tiny real run, the command's errors, that every paper table has a
config, and the workloads behind tables a config reproduces in part. (The verdict rule:
test_reproduce_verdicts.py.)"""

from __future__ import annotations

import copy
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from harness.experiment.config import ConfigError, config_hash, load_config
from harness.experiment.paper_cells import cells_by_table, split_part, tables
from harness.paper.mapping import parse_tables, quick_trials
from harness.paper.reproduce import check_all
from harness.paper.timing import BENCHMARKS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
runner = CliRunner()

#: Paper tables no config maps: none since Table 18 landed.
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


def test_a_config_whose_agent_needs_a_missing_package_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main install (`pip install .`) has no openai: reproduce skips the LLM config with
    one line saying why and what to install, and runs the rest."""
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` now fails
    configs = tmp_path / "configs"
    write(configs, TINY, "tiny_residue.yaml")
    llm = configs / "tau_retail_llm.yaml"
    shutil.copy(CONFIGS / "tau_retail_llm.yaml", llm)
    with pytest.raises(ConfigError, match="needs the openai package"):
        load_config(llm)  # what made reproduce exit 2 before it skipped such a config
    out = tmp_path / "out"
    args = ["reproduce", "--quick", "--tables", "6,16", "--configs", str(configs),
            "--out", str(out), "--jobs", "1"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    why = "its agent (agent.kind llm) needs the openai package, which is not installed: pip install '.[llm]'"
    lines = result.output.splitlines()
    assert [ln for ln in lines if "skipped" in ln] == [f"tau_retail_llm ({llm}): skipped, {why}"]
    assert any(ln.startswith("tiny_residue: ") and "trials in" in ln for ln in lines)
    assert [p.parent.parent.name for p in out.glob("*/*/manifest.json")] == ["tiny_residue"]
    text = (out / "REPRODUCTION.md").read_text(encoding="utf-8")
    assert f"| `tau_retail_llm` | not run: skipped: {why} | — |" in text
    assert "| Tx-Full (2 of 3) | GT clean | 589 |" in text  # Table 16 is judged as ever


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


def claims_configs() -> set[str]:
    """Configs the claims table runs: the ones that may exist for a claim, not a paper table."""
    from harness.paper.claims import ROWS

    return {row.config for row in ROWS}


def test_every_config_names_its_tables() -> None:
    # A config exists to reproduce a paper table, to test a claim, or to report a result
    # beyond the paper in REPRODUCTION.md; anything else is dead.
    from harness.paper.beyond import BEYOND_PAPER

    unnamed = [
        name for name, named in paper_tables_of_configs().items()
        if not named and name not in claims_configs() and name not in BEYOND_PAPER
    ]
    assert not unnamed, (
        f"configs without a `paper:` section, a claims row or a beyond-the-paper entry: {unnamed}"
    )


def test_exactly_the_listed_tables_lack_a_config() -> None:
    named = set().union(*paper_tables_of_configs().values()) | set(BENCHMARKS)
    assert set(tables()) - named == MISSING


def test_every_paper_table_has_a_config() -> None:
    configs = paper_tables_of_configs()
    named = set().union(*configs.values()) | set(BENCHMARKS)
    missing = sorted(set(tables()) - named)
    assert not missing, f"paper tables with no config: {missing}"


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

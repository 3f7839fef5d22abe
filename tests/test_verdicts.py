"""Paired verdicts under the main table (harness.analysis.verdicts): printed by `atomix run`
and `atomix report`, written to tables/, agreeing with `atomix compare`, in the direction the
table declares, absent when there is nothing to compare, `n/a (not exercised)` when a cell's
condition did not occur."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from harness.analysis.paired import verdict
from harness.analysis.runs import main_table, table_specs
from harness.analysis.verdicts import baseline_of, verdict_block, verdicts_markdown
from harness.experiment.config import ConfigError, config_hash, load_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
TAU = ROOT / "configs" / "tau_retail.yaml"
HEADING = "each mode minus"
STEM = "verdicts-clean-vs-tx-full"


def _run(tmp_path: Path, *args: str) -> tuple[Any, Path | None]:
    out = tmp_path / "r"
    # No COLUMNS: output to a pipe is as wide as it needs, so the block's own width shows.
    result = CliRunner().invoke(
        app, ["run", *args, "--out", str(out), "--jobs", "1", "-q"], env={"COLUMNS": None}
    )
    assert result.exit_code == 0, result.output
    runs = [p.parent for p in out.glob("*/*/manifest.json")]
    return result, (runs[0] if runs else None)


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture(scope="module")
def tau_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    tmp = tmp_path_factory.mktemp("tau")
    result, run_dir = _run(tmp, str(TAU), "--trials", "6")
    assert run_dir is not None
    return result.stdout, run_dir


def test_tau_retail_prints_the_block_under_the_main_table(tau_run: tuple[str, Path]) -> None:
    stdout, run_dir = tau_run
    main = stdout.index("Clean task success on tau2 retail")
    block = stdout.index(f"clean, percentage points: {HEADING} tx-full")
    assert main < block < stdout.index("run dir:")
    text = stdout[block:]
    assert "(higher is better)" in text and "exact McNemar" in text and "Holm" in text
    assert "N = 6 pairs per row" in text
    modes = ["checkpoint-replay", "tcc", "saga", "mutex-wal", "no-frontier", "occ", "no-tx"]
    for mode in modes:
        assert text.count(f" {mode} ") == 3, mode  # once per cell
    lines = [ln for ln in text[: text.index("run dir:")].splitlines() if ln.strip()]
    assert max(len(ln.rstrip()) for ln in lines) <= 80  # compact: fits an 80-column terminal
    rows = _csv((run_dir / "tables" / f"{STEM}.csv").read_text())
    assert len(rows) == 3 * 7 and {r["cell_id"] for r in rows} == {"fp=0.0", "fp=0.1", "fp=0.3"}
    assert {r["verdict"] for r in rows} <= {"better", "worse", "no evidence"}
    assert (run_dir / "tables" / f"{STEM}.md").read_text().startswith("**clean, percentage")


def test_block_agrees_with_compare_on_the_same_run(tau_run: tuple[str, Path]) -> None:
    _, run_dir = tau_run
    ours = {
        (r["cell_id"], r["mode"]): r for r in _csv((run_dir / "tables" / f"{STEM}.csv").read_text())
    }
    out = CliRunner().invoke(
        app,
        ["compare", str(run_dir), "--baseline", "tx-full", "--metric", "clean", "--format", "csv"],
    )
    assert out.exit_code == 0, out.output
    theirs = _csv(out.stdout)
    assert len(theirs) == len(ours)
    for row in theirs:
        mine = ours[(row["cell_id"], row["mode"])]
        for key in ("pairs", "gained", "lost", "diff", "lo", "hi", "p_value", "p_holm"):
            assert mine[key] == row[key], (row["cell_id"], row["mode"], key)
        # the verdict is the plain reading of those numbers
        p, diff = float(row["p_holm"]), float(row["diff"])
        expected = "no evidence" if p >= 0.05 or diff == 0 else ("better" if diff > 0 else "worse")
        assert mine["verdict"] == expected
    # The text as printed, too: compare's md rows hold the block's diff, CI, +/- and p Holm.
    md = CliRunner().invoke(
        app, ["compare", str(run_dir), "--baseline", "tx-full", "--format", "md"]
    )
    ours_md = (run_dir / "tables" / f"{STEM}.md").read_text()
    for line in md.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 10 and cells[0].startswith("fp="):
            cell, mode, _, _, _, pm, diff, ci, _, p_holm = cells
            assert f"| {cell} | {mode} | {diff} | {ci} | {pm} | {p_holm} |" in ours_md


def test_report_rebuilds_the_same_block(tau_run: tuple[str, Path]) -> None:
    _, run_dir = tau_run
    before = (run_dir / "tables" / f"{STEM}.csv").read_bytes()
    out = CliRunner().invoke(app, ["report", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert f"{HEADING} tx-full" in out.stdout
    assert (run_dir / "tables" / f"{STEM}.csv").read_bytes() == before  # deterministic


def _records(values: dict[str, list[Any]], metric: str) -> list[dict[str, Any]]:
    return [
        {"key": f"d/{mode}/all/{t}", "mode": mode, "cell": {}, "cell_id": "all", "trial": t,
         "seed": 1, "metrics": {metric: v}}
        for mode, vs in values.items()
        for t, v in enumerate(vs)
    ]  # fmt: skip


def _config(table: dict[str, Any], modes: list[str], **report: Any) -> Any:
    return validate_config(
        {"name": "d", "workload": "synthetic", "trials": 40, "modes": modes,
         "report": {"tables": [table], **report}}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "metric", "base", "other"),
    [
        ("mean", "leaks", [0] * 40, [1] * 30 + [0] * 10),
        ("proportion", "leaked", [False] * 40, [True] * 30 + [False] * 10),
    ],
)
def test_direction_comes_from_the_table(
    kind: str, metric: str, base: list[Any], other: list[Any]
) -> None:
    records = _records({"tx-full": base, "no-tx": other}, metric)
    table = {"name": "t", "metric": metric, "kind": kind}
    default = verdict_block(records, _config(table, ["tx-full", "no-tx"]))
    lower = verdict_block(records, _config({**table, "better": "lower"}, ["tx-full", "no-tx"]))
    assert default is not None and lower is not None
    (row,) = lower.comparison.rows
    assert row.diff == pytest.approx(0.75) and row.p_holm < 0.001
    assert default.better == "higher" and default.verdicts == ("better",)
    assert lower.better == "lower" and lower.verdicts == ("worse",)
    assert "(lower is better)" in verdicts_markdown(lower)
    assert lower.comparison.test == (
        "exact McNemar" if kind == "proportion" else "Wilcoxon signed-rank"
    )


def test_a_proportion_table_reads_0_and_1_as_yes_and_no() -> None:
    records = _records({"tx-full": [0] * 40, "no-tx": [1] * 30 + [0] * 10}, "lost")
    block = verdict_block(
        records,
        _config({"name": "t", "metric": "lost", "kind": "proportion"}, ["tx-full", "no-tx"]),
    )
    assert block is not None and block.comparison.kind == "binary"
    assert "percentage points" in block.heading


def test_no_block_without_something_to_compare() -> None:
    table = {"name": "t", "metric": "clean", "kind": "proportion"}
    records = _records({"tx-full": [True] * 5}, "clean")
    assert verdict_block(records, _config(table, ["tx-full"])) is None  # one mode
    two = _records({"saga": [True] * 6, "occ": [False] * 6}, "clean")  # McNemar p = 2/64
    assert baseline_of(_config(table, ["saga", "occ"])) is None
    assert verdict_block(two, _config(table, ["saga", "occ"])) is None  # no baseline
    by_trial = {**table, "rows": "trial"}
    both = _records({"tx-full": [True] * 5, "saga": [False] * 5}, "clean")
    assert verdict_block(both, _config(by_trial, ["tx-full", "saga"])) is None  # rows not modes
    # a declared baseline that did not run (e.g. dropped by --modes)
    assert verdict_block(both, _config(table, ["tx-full", "saga"], baseline="occ")) is None
    declared = verdict_block(two, _config(table, ["saga", "occ"], baseline="occ"))
    assert declared is not None and declared.comparison.baseline == "occ"
    assert [r.mode for r in declared.comparison.rows] == ["saga"]
    assert declared.verdicts == (verdict(declared.comparison.rows[0]),) == ("better",)


def test_a_one_mode_run_prints_no_block(tmp_path: Path) -> None:
    result, run_dir = _run(tmp_path, str(TAU), "--trials", "2", "--modes", "tx-full")
    assert run_dir is not None and HEADING not in result.stdout
    assert not list((run_dir / "tables").glob("verdicts-*"))


def test_a_cell_that_did_not_exercise_its_condition(tmp_path: Path) -> None:
    # Faults armed at a rate too low to inject any in two trials: the cell is not a result.
    result, run_dir = _run(
        tmp_path, str(TAU), "--trials", "2", "--modes", "tx-full,no-tx", "--set", "fp=0.0001"
    )
    assert run_dir is not None
    assert f"{HEADING} tx-full" in result.stdout and "n/a (not exercised)" in result.stdout
    (row,) = _csv((run_dir / "tables" / f"{STEM}.csv").read_text())
    assert row["exercised"] == "false" and row["verdict"] == "n/a (not exercised)"
    assert row["p_holm"] == "" and row["pairs"] == "2"


def test_report_keys_are_checked_and_leave_old_hashes_alone(tmp_path: Path) -> None:
    config = load_config(TAU)
    dumped = config.model_dump(mode="json")["report"]
    assert "baseline" not in dumped and all(
        "better" not in t or t["better"] is not None for t in dumped["tables"]
    )
    data = yaml.safe_load(TAU.read_text())
    main = next(t for t in data["report"]["tables"] if t["name"] == data["report"]["main"])
    assert "better" not in main  # clean: higher is better by default
    before = config_hash(validate_config(data))
    data["report"]["baseline"] = "tx-full"
    assert config_hash(validate_config(data)) != before  # a declared key is part of the config
    data["report"]["baseline"] = "tx-ful"
    with pytest.raises(ConfigError, match="report.baseline.*did you mean tx-full"):
        validate_config(data, "x.yaml")
    data["report"]["baseline"] = "tx-full"
    main["better"] = "up"
    with pytest.raises(ConfigError, match="better"):
        validate_config(data, "x.yaml")


# Metrics whose more is worse, by name (harm), and metrics whose more is better.
HARM = re.compile(
    r"violation|wait|leak|missed|out_of_order|mismatch|contamination|residue|_loc|lost|unsafe|duplicate|stale"
)
HIGHER = {"clean", "goal", "throughput", "serialisable"}


def test_shipped_configs_declare_the_direction_of_their_main_metric() -> None:
    """A comparison config's main metric reads the right way: harm lower, success higher,
    and any other metric says which way explicitly."""
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config = load_config(path)
        spec = next(s for s in table_specs(config) if s.name == main_table(config))
        if baseline_of(config) is None or len(config.modes) < 2 or spec.rows != "mode":
            continue  # no verdicts under its main table
        model = next((t for t in config.report.tables if t.name == spec.name), None)
        declared = model.better if model is not None else None
        direction = model.direction if model is not None else "higher"
        if HARM.search(spec.metric):
            assert direction == "lower", f"{path.name}: more {spec.metric} is worse"
        elif spec.metric in HIGHER:
            assert direction == "higher", f"{path.name}: more {spec.metric} is better"
        else:
            assert declared is not None, f"{path.name}: say which way {spec.metric} is better"


def test_a_frame_given_reads_what_the_cells_exercised_as_the_records_do() -> None:
    # The view passes the frame it built for the tables; the verdicts must not change.
    from harness.analysis.paired import paired_compare
    from harness.analysis.records import records_frame

    def rec(mode: str, cell: str, t: int, faults: int, clean: bool) -> dict[str, Any]:
        return {"key": f"d/{mode}/{cell}/{t}", "mode": mode, "cell": {"c": cell},
                "cell_id": f"c={cell}", "trial": t, "seed": 1, "metrics": {"clean": clean},
                "exercised": {"faults": {"F1": faults}, "faults_total": faults, "aborts": 0,
                              "compensations": 0, "irreversible_calls": 0, "sends": 0,
                              "fault_classes": ["F1"], "faults_armed": True}}  # fmt: skip

    records = [
        rec(mode, cell, t, faults=int(cell == "a" and mode != "saga"), clean=(t + i) % 3 > 0)
        for i, mode in enumerate(["tx-full", "no-tx", "saga"])
        for cell in ("a", "b")
        for t in range(12)
    ]
    frame = records_frame(records)
    table = {"name": "t", "metric": "clean", "kind": "proportion", "requires": "faults"}
    config = _config(table, ["tx-full", "no-tx", "saga"])
    plain, framed = verdict_block(records, config), verdict_block(records, config, frame=frame)
    assert plain is not None and framed is not None
    assert framed.display_rows() == plain.display_rows() and framed.verdicts == plain.verdicts
    # cell b injected nothing; in cell a saga did not, so its pairs there are no result either
    assert [r.exercised for r in plain.comparison.rows] == [True, False, False, False]
    two = ["tx-full", "no-tx"]  # a subset of the modes present: the frame's other rows are left
    assert [r.exercised for r in paired_compare(records, "clean", two, requires="faults",
                                                frame=frame).rows] == [True, False]

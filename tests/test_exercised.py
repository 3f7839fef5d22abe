"""A condition that never occurred is not a result.

Trial records say what they exercised; a table cell whose trials never exercised what the
table measures reads `n/a (not exercised)` everywhere (Markdown, LaTeX, terminal, CSV
flag), plots leave it out and `compare` does not test it; the synthetic F3 column now
injects F3 under modes that compensate.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.analysis import runs as reporting
from harness.analysis.exercised import exercised_frame, is_exercised
from harness.analysis.paired import paired_compare
from harness.analysis.paired_render import paired_csv
from harness.analysis.plots import bar_plot, line_plot
from harness.analysis.records import EXERCISED_COUNTS, REQUIRES, records_frame
from harness.analysis.render import to_csv, to_latex, to_markdown, to_rich
from harness.analysis.report import write_report
from harness.analysis.table import NOT_EXERCISED_TEXT, TableSpec, build_table
from harness.experiment.config import ConfigError, load_config, validate_config
from harness.experiment.runner import plan, run
from harness.experiment.trial import TrialSpec, exercised, run_trial
from harness.world.faults import FaultConfig, FaultInjector, Point

ROOT = Path(__file__).resolve().parents[1]
FAULT_CLASS_CONFIG = ROOT / "configs" / "synthetic_fault_class.yaml"


# --------------------------------------------------------------------------- records


def _ex(f3: int = 0, f1: int = 0, *, armed: bool = True, classes: tuple[str, ...] = ("F3",),
        aborts: int = 0, compensations: int = 0) -> dict[str, Any]:
    per = {"F1": f1, "F2": 0, "F3": f3, "F4": 0, "F5": 0}
    return {
        "faults": per,
        "faults_total": sum(per.values()),
        "aborts": aborts,
        "compensations": compensations,
        "irreversible_calls": 0,
        "sends": 0,
        "fault_classes": list(classes),
        "faults_armed": armed,
    }


def make_records(n: int = 10) -> list[dict[str, Any]]:
    """Three cells: fp=0 (calibration, no faults), fp=0.1 (F3 armed: tx-full got some F3,
    no-tx none), fp=0.3 (both got F3)."""
    recs = []
    for mode in ("tx-full", "no-tx"):
        for fp in (0.0, 0.1, 0.3):
            for i in range(n):
                f3 = 1 if (fp == 0.3 or (fp == 0.1 and mode == "tx-full")) and i % 3 == 0 else 0
                recs.append(
                    {
                        "key": f"c/{mode}/fp={fp}/{i}",
                        "mode": mode,
                        "cell": {"fp": fp},
                        "cell_id": f"fp={fp}",
                        "trial": i,
                        "seed": 1,
                        "metrics": {"clean": i % 2 == 0, "aborts": 1},
                        "faults": [{"fault": "F3"}] * f3,
                        "exercised": _ex(f3, armed=fp > 0, aborts=1, compensations=2 * f3),
                    }
                )
    return recs


SPEC = TableSpec("clean", "clean", "proportion", columns=("fp",), row_order=("tx-full", "no-tx"))


def test_a_cell_with_no_fault_of_its_class_reads_not_exercised_everywhere() -> None:
    table = build_table(records_frame(make_records()), SPEC)
    assert table.display.loc["no-tx", "fp=0.1"] == NOT_EXERCISED_TEXT
    assert table.display.loc["tx-full", "fp=0.1"] == "50 [19, 81]"
    assert table.not_exercised == [("no-tx", "fp=0.1")]
    md = to_markdown(table)
    assert f"| no-tx | 50 [19, 81] | {NOT_EXERCISED_TEXT} | 50 [19, 81] |" in md
    assert "n/a (not exercised): the cell injects faults but none was injected" in md
    assert f"no-tx & 50 & {NOT_EXERCISED_TEXT} & 50 \\\\" in to_latex(table)
    console = Console(width=200, record=True)
    console.print(to_rich(table))
    assert NOT_EXERCISED_TEXT in console.export_text()
    # The CSV says so explicitly: an empty value and exercised=false, never a 0.
    rows = {(r["row"], r["column"]): r for r in csv.DictReader(io.StringIO(to_csv(table)))}
    na = rows["no-tx", "fp=0.1"]
    assert na["exercised"] == "false" and na["value"] == na["lo"] == na["hi"] == ""
    assert na["text"] == NOT_EXERCISED_TEXT and na["n"] == "10" and na["faults_F3"] == "0"
    ok = rows["tx-full", "fp=0.1"]
    assert ok["exercised"] == "true" and float(ok["value"]) == 0.5 and ok["faults_F3"] == "4"
    assert ok["requires"] == "default" and ok["compensations"] == "8" and ok["aborts"] == "10"


def test_a_fault_free_rate_zero_cell_still_prints_a_rate() -> None:
    table = build_table(records_frame(make_records()), SPEC)
    for mode in ("tx-full", "no-tx"):
        assert table.display.loc[mode, "fp=0.0"] == "50 [19, 81]"
    assert bool(table.data.set_index(["row", "column"]).loc[("no-tx", "fp=0.0"), "exercised"])
    # Unless the table says faults must have occurred at all.
    strict = build_table(records_frame(make_records()), TableSpec(
        "c", "clean", "proportion", columns=("fp",), requires="faults"))
    assert strict.display.loc["no-tx", "fp=0.0"] == NOT_EXERCISED_TEXT


def test_requires_names_what_must_have_occurred() -> None:
    df = records_frame(make_records())
    by = {r: build_table(df, TableSpec("c", "clean", "proportion", columns=("fp",), requires=r))
          for r in ("F1", "F3", "aborts", "compensations", "sends", "none")}
    assert set(by["F1"].display.loc["tx-full"]) == {NOT_EXERCISED_TEXT}
    assert by["F3"].display.loc["tx-full", "fp=0.0"] == NOT_EXERCISED_TEXT
    assert by["F3"].display.loc["tx-full", "fp=0.3"] == "50 [19, 81]"
    assert NOT_EXERCISED_TEXT not in set(by["aborts"].display.to_numpy().ravel())
    assert by["compensations"].display.loc["no-tx", "fp=0.1"] == NOT_EXERCISED_TEXT
    assert set(by["sends"].display.to_numpy().ravel()) == {NOT_EXERCISED_TEXT}
    assert NOT_EXERCISED_TEXT not in set(by["none"].display.to_numpy().ravel())
    assert "no F1 fault was injected" in by["F1"].footer


def test_is_exercised_rule() -> None:
    counts = {name: 0 for name in EXERCISED_COUNTS} | {"faults_armed": True}
    assert not is_exercised(counts)
    assert is_exercised(counts | {"faults_armed": False})  # calibration
    assert not is_exercised(counts | {"faults_armed": False}, "faults")
    assert is_exercised(counts | {"faults_F3": 1, "faults_total": 1}, "F3")
    assert not is_exercised(counts | {"faults_F1": 1, "faults_total": 1}, "F3")
    assert is_exercised(counts | {"compensations": None}, "compensations")  # unknown: no claim
    assert is_exercised(counts, "none")
    with pytest.raises(ValueError, match="allowed: faults, F1"):
        is_exercised(counts, "bogus")


def test_requires_validation_names_the_key_and_the_allowed_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"requires: unknown requirement 'abort'; allowed: "):
        TableSpec("c", "clean", "proportion", requires="abort")
    data = {
        "workload": "synthetic",
        "trials": 1,
        "modes": ["tx-full"],
        "report": {"tables": [{"name": "c", "metric": "clean", "requires": "abort"}]},
    }
    with pytest.raises(ConfigError) as info:
        validate_config(data, "bad.yaml")
    message = str(info.value)
    assert "bad.yaml: report.tables.0.requires:" in message and "'abort'" in message
    for allowed in REQUIRES:
        assert f"'{allowed}'" in message
    data["report"]["tables"][0]["requires"] = "compensations"
    assert validate_config(data).report.tables[0].requires == "compensations"
    data["report"]["tables"][0]["name"] = "exercised"
    with pytest.raises(ConfigError, match="'exercised' is reserved"):
        reporting.check_report(validate_config(data), "bad.yaml")


def test_plots_skip_cells_not_exercised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = build_table(records_frame(make_records()), SPEC)
    drawn: list[list[float]] = []
    from matplotlib.axes import Axes

    original = Axes.errorbar

    def spy(self: Axes, *args: Any, **kwargs: Any) -> Any:
        # Points are dodged sideways by a small fraction of the spacing: round it away.
        drawn.append([round(float(x), 1) for x in args[0]])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "errorbar", spy)
    line_plot(table, "fp", tmp_path / "line")
    assert sorted(drawn) == [[0.0, 0.1, 0.3], [0.0, 0.3]]  # no-tx has no point at 0.1
    assert "are not drawn" in table.plot_note
    assert len(bar_plot(table, tmp_path / "bar")) == 2


def test_write_report_writes_the_exercised_table(tmp_path: Path) -> None:
    paths = write_report(make_records(), [SPEC], tmp_path)
    names = [p.name for p in paths]
    assert names == ["clean.md", "clean.csv", "clean.tex", "exercised.md", "exercised.csv"]
    rows = list(csv.DictReader(io.StringIO((tmp_path / "tables" / "exercised.csv").read_text())))
    assert [(r["mode"], r["cell_id"]) for r in rows][:3] == [
        ("tx-full", "fp=0.0"), ("tx-full", "fp=0.1"), ("tx-full", "fp=0.3")]
    got = {(r["mode"], r["cell_id"]): r for r in rows}
    assert got["no-tx", "fp=0.1"]["faults_F3"] == "0"
    assert got["tx-full", "fp=0.1"]["faults_F3"] == "4"
    assert got["tx-full", "fp=0.1"]["faults_armed"] == "true"
    assert got["tx-full", "fp=0.0"]["faults_armed"] == "false"
    assert got["tx-full", "fp=0.1"]["trials"] == "10"
    assert "| no-tx | fp=0.1 | 10 | 0 | 0 | 0 | 0 | 0 | 0 | 10 | 0 | 0 | 0 |" in (
        tmp_path / "tables" / "exercised.md"
    ).read_text()


def test_records_without_exercised_are_judged_from_what_they_hold() -> None:
    recs = make_records()
    for r in recs:
        del r["exercised"]
    df = records_frame(recs)
    frame = exercised_frame(df)
    row = frame[(frame["mode"] == "tx-full") & (frame["cell_id"] == "fp=0.1")].iloc[0]
    assert row["faults_F3"] == 4 and row["aborts"] == 10 and row["compensations"] is None
    # Whether faults were armed is unknown, so no cell is claimed not exercised.
    assert NOT_EXERCISED_TEXT not in set(build_table(df, SPEC).display.to_numpy().ravel())


# --------------------------------------------------------------------------- trials


def test_exercised_counts_match_the_injector_records() -> None:
    injector = FaultInjector(FaultConfig(rate=0.5, classes="mixed"), seed=3, cell="c", trial=0)
    for i in range(200):
        injector.decide(Point.CALL if i % 3 else Point.COMPENSATE, f"site{i % 7}")
    records = injector.records()
    got = exercised(injector.config, records, [], [], [])
    assert got["faults"] == {c: Counter(r["fault"] for r in records)[c] for c in got["faults"]}
    assert got["faults_total"] == len(records) > 0
    assert got["faults_armed"] and got["fault_classes"] == ["F1", "F2", "F3", "F4", "F5"]


@pytest.mark.parametrize("mode", ["tx-full", "saga", "no-tx"])
def test_a_trial_record_counts_what_it_exercised(mode: str) -> None:
    spec = TrialSpec("probe", "synthetic", mode, "fp=0.3", {"fp": 0.3}, 2, 5,
                     faults=FaultConfig(rate=0.3, classes="mixed"))
    record = run_trial(spec)
    ex = record["exercised"]
    counted = Counter(f["fault"] for f in record["faults"])
    assert ex["faults"] == {c: counted.get(c, 0) for c in ("F1", "F2", "F3", "F4", "F5")}
    assert ex["faults_total"] == len(record["faults"]) > 0
    assert ex["aborts"] == record["metrics"]["aborts"] == sum(len(a["aborts"]) for a in record["agents"])
    assert ex["sends"] >= 0 and ex["compensations"] >= 0 and ex["irreversible_calls"] >= 0
    assert ex["faults_armed"] is True
    assert run_trial(spec)["exercised"] == ex  # deterministic


def _f3_config(trials: int = 10) -> Any:
    return load_config(
        FAULT_CLASS_CONFIG,
        overrides={
            "trials": trials,
            "modes": ["tx-full", "saga", "no-tx"],
            "grid": {"faults.rate": [0.3]},
            "cells": [
                {"label": "F1", "faults.classes": "F1"},
                {"label": "F3", "faults.classes": "F3", "params.veto_rate": 1.0},
            ],
        },
    )


def test_the_shipped_f3_cell_vetoes_and_stays_f3_only() -> None:
    config = load_config(FAULT_CLASS_CONFIG)
    f3 = [s for s in plan(config) if s.cell.get("class") == "F3" and s.trial == 0]
    assert f3 and all(s.params.get("veto_rate") == 1.0 for s in f3)
    assert all(set(s.faults.classes) == {"F3"} for s in f3)
    others = [s for s in plan(config) if s.cell.get("class") == "F1" and s.trial == 0]
    assert others and all("veto_rate" not in s.params for s in others)


def test_the_synthetic_f3_column_injects_f3_where_modes_compensate(tmp_path: Path) -> None:
    result = run(_f3_config(), out=tmp_path)
    loaded = reporting.load_run(result.run_dir)
    f3: dict[str, Counter[str]] = {}
    for rec in loaded.records:
        if rec["cell"]["class"] == "F3":
            c = f3.setdefault(rec["mode"], Counter())
            c.update({k: v for k, v in rec["exercised"].items() if isinstance(v, int)})
            c["F3"] += rec["exercised"]["faults"]["F3"]
            assert rec["exercised"]["aborts"] >= 1  # every task is vetoed
    assert f3["tx-full"]["F3"] > 0 and f3["saga"]["F3"] > 0
    assert f3["no-tx"]["F3"] == 0 and f3["no-tx"]["compensations"] == 0

    report = reporting.write_run_report(loaded)
    table = report.main
    assert table is not None
    assert table.display.loc["no-tx", "class=F3,fp=0.3"] == NOT_EXERCISED_TEXT
    for mode in ("tx-full", "saga"):
        assert table.display.loc[mode, "class=F3,fp=0.3"] != NOT_EXERCISED_TEXT
        assert table.display.loc[mode, "class=F1,fp=0.3"] != NOT_EXERCISED_TEXT
    rows = list(csv.DictReader(io.StringIO((result.run_dir / "tables" / "exercised.csv").read_text())))
    got = {(r["mode"], r["cell_id"]): r for r in rows}
    assert int(got["saga", "class=F3,fp=0.3"]["faults_F3"]) == f3["saga"]["F3"]
    assert got["no-tx", "class=F3,fp=0.3"]["faults_F3"] == "0"

    cmp = paired_compare(loaded.records, "clean", ["tx-full", "saga", "no-tx"], requires="faults")
    cell = "class=F3,fp=0.3"
    by = {(r.cell, r.mode): r for r in cmp.rows}
    assert not by[cell, "no-tx"].exercised and math.isnan(by[cell, "no-tx"].p)
    assert by[cell, "saga"].exercised and not math.isnan(by[cell, "saga"].p)
    lines = list(csv.DictReader(io.StringIO(paired_csv(cmp))))
    na = next(r for r in lines if r["cell_id"] == cell and r["mode"] == "no-tx")
    assert na["exercised"] == "false" and na["p_value"] == ""

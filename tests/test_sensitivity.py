"""`atomix sensitivity`: the designs, the shape and determinism of the result on a tiny
config, its files and Markdown section, and clear errors for what it cannot analyse."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from harness.agents.policies import REACTION_KEYS, WEIGHT_KEYS, AgentConfig
from harness.analysis.sensitivity import (
    SensitivityError,
    SensitivityResult,
    design_points,
    designs_csv,
    run_sensitivity,
    sensitivity_csv,
    sensitivity_markdown,
)

runner = CliRunner()

TINY: dict[str, Any] = {
    "name": "tiny_sensitivity",
    "description": "tau2 retail in miniature for the sensitivity tests",
    "workload": "tau_retail",
    "params": {"split": "test", "sample": 4, "task_seed": 0},
    "seed": 7,
    "trials": 6,
    "modes": ["tx-full", "no-tx", "saga"],
    "faults": {"classes": "mixed"},
    "agent": {"kind": "llm-like", "max_steps": 30, "intrinsic_error": 0.5},
    "labels": {"faults.rate": "fp"},
    "grid": {"faults.rate": [0.0, 0.3]},
    "report": {"main": "clean", "tables": [
        {"name": "clean", "metric": "clean", "kind": "proportion", "columns": ["fp"]},
    ]},
}


def write(tmp_path: Path, data: dict[str, Any] | None = None, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data or TINY, sort_keys=False), encoding="utf-8")
    return path


def comparable(result: SensitivityResult) -> list[Any]:
    """Everything but the wall times."""
    return [
        [(d.design, d.verdicts, d.matches, dict(d.scores), d.ranking, str(d.tau), d.trials)
         for d in result.designs],
        result.rows, result.fixed, result.metric, result.baseline, result.trials,
    ]


def test_designs_vary_each_weight_one_at_a_time_and_draw_random_points() -> None:
    agent = AgentConfig(kind="llm-like", max_steps=30, intrinsic_error=0.2)
    points, fixed = design_points(agent, 6, seed=3)
    assert fixed == ["forget_on_replan"]  # a default of 0 stays 0
    varied = [k for k in WEIGHT_KEYS if k not in fixed]
    assert [p.kind for p in points] == ["default"] + ["one-at-a-time"] * 2 * len(varied) + ["random"] * 6
    default = points[0].weights
    total = sum(default[k] for k in REACTION_KEYS)
    for p in points:
        assert math.isclose(sum(p.weights[k] for k in REACTION_KEYS), total, rel_tol=1e-5)
        assert p.weights["forget_on_replan"] == 0.0
        assert 0.0 <= p.weights["intrinsic_error"] <= 1.0
    # One at a time: the named weight's share moves, its ratio to every other varied reaction
    # weight is 0.5 or 1.5 of the default ratio.
    one = {p.name: p.weights for p in points if p.kind == "one-at-a-time"}
    assert one["intrinsic_error x0.5"]["intrinsic_error"] == pytest.approx(0.1)
    assert one["intrinsic_error x1.5"]["retry"] == pytest.approx(default["retry"])
    ratio = one["retry x1.5"]["retry"] / one["retry x1.5"]["alter"]
    assert ratio == pytest.approx(1.5 * default["retry"] / default["alter"], rel=1e-4)
    for p in points[1 + 2 * len(varied):]:
        shares = {k: p.weights[k] / default[k] for k in varied if k != "intrinsic_error"}
        # Uniform in [0.5w, 1.5w] before rescaling: no share moved by more than a factor of 3.
        assert max(shares.values()) / min(shares.values()) <= 3.0 + 1e-6
        assert 0.1 <= p.weights["intrinsic_error"] <= 0.3 + 1e-9
    again, _ = design_points(agent, 6, seed=3)
    assert again == points
    other, _ = design_points(agent, 6, seed=4)
    assert other[-1] != points[-1]


def test_a_tiny_config_gives_one_row_per_verdict_and_the_same_result_twice(tmp_path: Path) -> None:
    path = write(tmp_path)
    result = run_sensitivity(path, designs=2)
    varied = len(WEIGHT_KEYS) - 1  # forget_on_replan is 0
    assert len(result.designs) == 1 + 2 * varied + 2
    assert result.designs[0].design.name == "default"
    # One verdict per (cell, mode other than the baseline): 2 cells x 2 modes.
    assert [(r.cell, r.mode) for r in result.rows] == [
        ("fp=0.0", "no-tx"), ("fp=0.0", "saga"), ("fp=0.3", "no-tx"), ("fp=0.3", "saga")]
    assert result.baseline == "tx-full" and result.metric == "clean" and result.trials == 6
    for r in result.rows:
        assert r.designs == len(result.designs) - 1
        assert r.held + len(r.changed_in) == r.designs
        assert math.isnan(r.stability) or 0.0 <= r.stability <= 1.0
    assert result.default.matches == len(result.rows)
    for d in result.designs:
        assert sorted(d.ranking) == sorted(TINY["modes"]) and len(d.verdicts) == len(result.rows)
        assert d.trials == 6 and d.wall_s >= 0
    again = run_sensitivity(path, designs=2)
    assert comparable(again) == comparable(result)
    # The designs really change the agent: some design ranks or scores the modes otherwise.
    assert any(dict(d.scores) != dict(result.default.scores) for d in result.others)

    rows = list(csv.DictReader(io.StringIO(sensitivity_csv(result))))
    assert [(r["cell_id"], r["mode"]) for r in rows] == [(r.cell, r.mode) for r in result.rows]
    assert {r["default_verdict"] for r in rows} <= {"better", "worse", "no evidence", "n/a (not exercised)"}
    designs = list(csv.DictReader(io.StringIO(designs_csv(result))))
    assert len(designs) == len(result.designs) and set(WEIGHT_KEYS) <= set(designs[0])
    text = sensitivity_markdown(result)
    assert text.startswith("## Sensitivity of the tiny_sensitivity verdicts")
    assert text.count("\n| fp=") == len(result.rows)
    assert "### Designs" in text and "| default |" in text


def test_quick_runs_a_third_of_the_trials_and_fewer_designs(tmp_path: Path) -> None:
    result = run_sensitivity(write(tmp_path), quick=True)
    assert result.quick and result.trials == 2
    assert sum(d.design.kind == "random" for d in result.designs) == 4


def test_what_it_cannot_analyse_is_a_clear_error(tmp_path: Path) -> None:
    gold = write(tmp_path, {**TINY, "agent": {"kind": "gold"}}, "gold.yaml")
    with pytest.raises(SensitivityError, match="agent.kind is 'gold'.*llm-like"):
        run_sensitivity(gold)
    for bad in (-1, 201, 2.5, True):
        with pytest.raises(SensitivityError, match="designs: must be an integer from 0 to 200"):
            run_sensitivity(write(tmp_path), designs=bad)  # type: ignore[arg-type]
    no_baseline = write(tmp_path, {**TINY, "modes": ["no-tx", "saga"]}, "nobase.yaml")
    with pytest.raises(SensitivityError, match="compares no modes against a baseline"):
        run_sensitivity(no_baseline)


def test_the_command_prints_the_table_writes_the_files_and_refuses_bad_input(tmp_path: Path) -> None:
    path = write(tmp_path)
    out = tmp_path / "out"
    result = runner.invoke(app, ["sensitivity", str(path), "--designs", "1", "--out", str(out), "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "stability" in result.stdout and "designs in" in result.stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == ["tiny_sensitivity-designs.csv", "tiny_sensitivity-sensitivity.csv",
                     "tiny_sensitivity-sensitivity.md"]
    for args, expected in (
        ([str(tmp_path / "missing.yaml")], "no such file"),
        ([str(write(tmp_path, {**TINY, "agent": {"kind": "gold"}}, "g.yaml"))], "llm-like"),
        ([str(path), "--designs", "-3"], "--designs"),
        ([str(path), "--designs", "many"], "--designs"),
    ):
        bad = runner.invoke(app, ["sensitivity", *args, "--out", str(tmp_path / "bad")])
        assert bad.exit_code == 2, bad.output
        assert expected in bad.output
        assert not (tmp_path / "bad").exists()

"""Intervals of means stay in the metric's range, and titles and captions say what the run
was made with (its N, budgets and overrides), never the config file's prose."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.records import metric_bounds, records_frame
from harness.analysis.runs import check_report, load_run, table_specs, write_run_report
from harness.analysis.stats import mean_ci
from harness.analysis.table import TableSpec, build_table
from harness.errors import ConfigError
from harness.experiment.config import load_config
from harness.experiment.runner import run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

counts = st.lists(st.integers(min_value=0, max_value=10_000), min_size=0, max_size=40)
waits = st.lists(
    st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False), max_size=40
)
shares = st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.one_of(counts, waits))
def test_mean_ci_of_non_negative_values_never_goes_below_zero(xs: list[float]) -> None:
    m, lo, hi = mean_ci(xs, 0.95, 0.0, None)
    if not xs:
        assert math.isnan(m) and math.isnan(lo) and math.isnan(hi)
        return
    assert 0.0 <= lo <= m <= hi


@settings(max_examples=300, deadline=None)
@given(shares, st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_mean_ci_of_shares_stays_in_unit_interval(xs: list[float], conf: float) -> None:
    m, lo, hi = mean_ci(xs, conf, 0.0, 1.0)
    if xs:
        assert 0.0 <= lo <= m <= hi <= 1.0


def test_cutting_changes_only_the_impossible_part() -> None:
    xs = [0, 0, 0, 0, 0, 0, 0, 0, 0, 7]
    m, lo, hi = mean_ci(xs)
    assert lo < 0  # the plain t interval claims a negative mean is possible
    m2, lo2, hi2 = mean_ci(xs, lower=0.0)
    assert (m2, lo2, hi2) == (m, 0.0, hi)
    # Where the t interval fits the range, the cut leaves it alone.
    assert mean_ci([4, 5, 6, 5], lower=0.0) == mean_ci([4, 5, 6, 5])


def test_a_value_outside_the_declared_range_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the declared range"):
        mean_ci([1.0, -2.0], lower=0.0)


def test_ranges_are_declared_not_inferred() -> None:
    assert metric_bounds("wait_ms") == (0.0, None)
    assert metric_bounds("invariant_violations") == (0.0, None)
    assert metric_bounds("blocked") == (0.0, 1.0)
    assert metric_bounds("some_new_metric", boolean=True) == (0.0, 1.0)
    assert metric_bounds("some_new_metric") == (None, None)


def _records(metric: str, values: list[float]) -> list[dict[str, object]]:
    return [
        {"key": f"k{i}", "mode": "m", "cell": {}, "trial": i, "metrics": {metric: v}}
        for i, v in enumerate(values)
    ]


def test_table_of_a_skewed_count_has_no_negative_bound_and_says_so() -> None:
    df = records_frame(_records("invariant_violations", [0] * 9 + [7]))
    table = build_table(df, TableSpec(name="inv", metric="invariant_violations", kind="mean"))
    assert float(table.data["lo"].min()) == 0.0
    assert "cut at 0 (invariant_violations cannot be negative)" in table.footer
    assert "cut at 0" in table.plot_note
    # An undeclared metric keeps the plain t interval and no claim about its range.
    df = records_frame(_records("signed_thing", [0] * 9 + [7]))
    table = build_table(df, TableSpec(name="s", metric="signed_thing", kind="mean"))
    assert float(table.data["lo"].min()) < 0
    assert "cut" not in table.footer


def _lows(run_dir: Path, name: str) -> list[float]:
    with (run_dir / "tables" / f"{name}.csv").open(encoding="utf-8") as fh:
        return [float(r["lo"]) for r in csv.DictReader(fh) if r["lo"]]


@pytest.mark.parametrize(
    ("config", "trials", "tables"),
    [
        ("tau_contention.yaml", 4, ["invariants", "wait", "blocked", "aborts", "extra_writes"]),
        ("tau_disjoint.yaml", 3, ["wait", "invariants"]),
    ],
)
def test_small_contention_runs_have_no_negative_bounds(
    tmp_path: Path, config: str, trials: int, tables: list[str]
) -> None:
    cfg = load_config(CONFIGS / config, overrides={"trials": trials})
    result = run(cfg, out=tmp_path, overrides={"trials": trials})
    report = write_run_report(load_run(result.run_dir))
    assert not report.problems
    for name in tables:
        lows = _lows(result.run_dir, name)
        assert lows and min(lows) >= 0.0, name
    # The plots draw the tables' intervals: each error bar's lower end is a table's lo.
    assert any(p.suffix == ".png" for p in report.paths)
    md = (result.run_dir / "tables" / f"{tables[0]}.md").read_text(encoding="utf-8")
    assert "cut at 0" in md
    assert f"Run with overrides: trials={trials}." in md


def test_leakage_title_states_no_n_an_override_falsifies() -> None:
    cfg = load_config(CONFIGS / "leakage.yaml", overrides={"trials": 20})
    for spec in table_specs(cfg):
        assert "500" not in spec.title and "100" not in spec.title, spec.title


def test_budget_title_is_filled_from_the_run_config() -> None:
    cfg = load_config(CONFIGS / "tau_retail.yaml", overrides={"agent.max_steps": 10})
    titles = {s.name: s.title for s in table_specs(cfg)}
    assert titles["budget"] == "Agents that ran out of their 10-call budget, per trial"
    cfg = load_config(CONFIGS / "tau_retail.yaml")
    assert "30-call" in {s.name: s.title for s in table_specs(cfg)}["budget"]


def test_unknown_title_placeholder_names_the_table(tmp_path: Path) -> None:
    text = (CONFIGS / "tau_disjoint.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        text.replace('title: "Invariant violations per run"', 'title: "per {agent.max_stepz}"'),
        encoding="utf-8",
    )
    cfg = load_config(bad)
    with pytest.raises(ConfigError, match=r"report\.tables\.1.*agent\.max_stepz"):
        check_report(cfg, bad)


def test_caption_lists_no_overrides_when_there_are_none(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS / "tau_disjoint.yaml", overrides={"trials": 2})
    result = run(cfg, out=tmp_path)  # programmatic run: nothing recorded as overridden
    write_run_report(load_run(result.run_dir))
    md = (result.run_dir / "tables" / "wait.md").read_text(encoding="utf-8")
    assert "overrides" not in md

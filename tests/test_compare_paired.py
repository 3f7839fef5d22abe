"""Paired statistics in `compare`: exact McNemar, Newcombe's paired interval, Holm, formats."""

from __future__ import annotations

import csv
import io
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from harness.analysis.paired import (
    holm,
    mcnemar_exact,
    newcombe_paired,
    paired_compare,
    wilcoxon_paired,
)
from harness.analysis.paired_render import paired_csv, paired_latex, paired_markdown


def _rec(mode: str, cell: str, trial: int, clean: bool, steps: int = 5, **extra: Any) -> dict:
    return {
        "key": f"x/{mode}/{cell}/{trial}",
        "mode": mode,
        "cell": {"fp": float(cell.split("=")[1])},
        "cell_id": cell,
        "trial": trial,
        "seed": 1,
        "metrics": {"clean": clean, "steps": steps, **extra},
    }


def issue_example() -> list[dict]:
    """A tau_retail case: checkpoint-replay 25/30 vs tx-full 19/30, 6 discordant pairs, all
    in checkpoint-replay's favour, where the unpaired test sees no difference."""
    recs = []
    for t in range(30):
        tx = t < 19
        cr = t < 25
        recs.append(_rec("tx-full", "fp=0.1", t, tx))
        recs.append(_rec("checkpoint-replay", "fp=0.1", t, cr))
    return recs


def test_issue_example_mcnemar_not_fisher() -> None:
    cmp = paired_compare(issue_example(), "clean", ["tx-full", "checkpoint-replay"])
    (row,) = cmp.rows
    assert (row.pairs, row.total, row.base_total, row.gained, row.lost) == (30, 25, 19, 6, 0)
    assert row.p == pytest.approx(0.03125, abs=1e-12)  # 2 * 0.5**6
    fisher = stats.fisher_exact([[25, 5], [19, 11]]).pvalue
    assert fisher == pytest.approx(0.143, abs=5e-4)  # the unpaired test: no difference at 5%
    assert row.diff == pytest.approx(0.2)
    assert 0.0 < row.lo < 0.2 < row.hi < 1.0  # the paired interval excludes 0, like the test
    assert row.p_holm == row.p  # one test: nothing to adjust


def test_mcnemar_exact_values() -> None:
    assert mcnemar_exact(6, 0) == pytest.approx(0.03125)
    assert mcnemar_exact(0, 6) == pytest.approx(0.03125)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(1, 9) == pytest.approx(2 * sum(math.comb(10, k) for k in (0, 1)) / 1024)


def test_newcombe_paired_properties_and_known_value() -> None:
    d, lo, hi = newcombe_paired(19, 6, 0, 5)
    assert (d, round(lo, 4), round(hi, 4)) == (pytest.approx(0.2), 0.0397, 0.3549)
    # Symmetric: swapping the roles of the modes mirrors the interval.
    d2, lo2, hi2 = newcombe_paired(19, 0, 6, 5)
    assert (d2, lo2, hi2) == (pytest.approx(-d), pytest.approx(-hi), pytest.approx(-lo))
    assert all(math.isnan(v) for v in newcombe_paired(0, 0, 0, 0))
    rng = random.Random(3)
    for _ in range(200):
        cells = [rng.randint(0, 12) for _ in range(4)]
        if sum(cells) == 0:
            continue
        d, lo, hi = newcombe_paired(*cells)
        assert -1.0 <= lo <= d <= hi <= 1.0


def test_newcombe_paired_covers_at_nominal_rate() -> None:
    # A small simulation: 95% intervals should cover the true difference about 95% of the time.
    rng = random.Random(7)
    probs = (0.5, 0.2, 0.1, 0.2)  # both, gained, lost, neither -> true diff 0.1
    covered, reps = 0, 600
    for _ in range(reps):
        cells = [0, 0, 0, 0]
        for _ in range(40):
            cells[rng.choices(range(4), probs)[0]] += 1
        _, lo, hi = newcombe_paired(*cells)
        covered += lo <= 0.1 <= hi
    assert 0.92 <= covered / reps <= 0.99


def test_holm_matches_definition() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.5, math.nan, 0.01])
    assert out[0] == pytest.approx(0.5) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # 2 * 0.8 caps at 1; monotone


def test_holm_applied_across_every_comparison_printed() -> None:
    recs = issue_example()
    for t in range(30):
        recs.append(_rec("no-tx", "fp=0.1", t, t < 19))
    cmp = paired_compare(recs, "clean", ["tx-full", "checkpoint-replay", "no-tx"])
    by_mode = {r.mode: r for r in cmp.rows}
    assert by_mode["no-tx"].p == 1.0
    assert by_mode["checkpoint-replay"].p_holm == pytest.approx(2 * 0.03125)


def test_pairs_match_on_cell_seed_and_trial_and_unmatched_are_counted() -> None:
    recs = issue_example()
    # Drop tx-full's trial 29: checkpoint-replay's trial 29 has no partner.
    recs = [r for r in recs if not (r["mode"] == "tx-full" and r["trial"] == 29)]
    (row,) = paired_compare(recs, "clean", ["tx-full", "checkpoint-replay"]).rows
    assert row.pairs == 29 and row.unmatched == 1
    # Shuffled record order changes nothing.
    shuffled = recs[:]
    random.Random(1).shuffle(shuffled)
    assert paired_compare(shuffled, "clean", ["tx-full", "checkpoint-replay"]).rows == [row]


def test_baseline_default_is_first_and_can_be_chosen() -> None:
    recs = issue_example()
    cmp = paired_compare(recs, "clean", ["checkpoint-replay", "tx-full"], baseline="tx-full")
    assert cmp.baseline == "tx-full" and cmp.modes == ["tx-full", "checkpoint-replay"]
    assert cmp.rows[0].diff == pytest.approx(0.2)
    rev = paired_compare(recs, "clean", ["checkpoint-replay", "tx-full"])
    assert rev.baseline == "checkpoint-replay" and rev.rows[0].diff == pytest.approx(-0.2)


def test_count_metric_gets_wilcoxon_signed_rank() -> None:
    recs = []
    for t in range(12):
        recs.append(_rec("tx-full", "fp=0.1", t, True, steps=5))
        recs.append(_rec("no-tx", "fp=0.1", t, True, steps=5 + (t % 3 + 1)))
    cmp = paired_compare(recs, "steps", ["tx-full", "no-tx"])
    (row,) = cmp.rows
    assert cmp.kind == "numeric" and "Wilcoxon" in cmp.footer
    diffs = [t % 3 + 1 for t in range(12)]
    assert row.p == pytest.approx(stats.wilcoxon(diffs).pvalue)
    assert row.diff == pytest.approx(2.0) and row.lo < 2.0 < row.hi
    assert wilcoxon_paired([0, 0, 0]) == 1.0


def test_bad_requests_are_refused_by_name() -> None:
    recs = issue_example()
    with pytest.raises(ValueError, match=r"did you mean clean\?"):
        paired_compare(recs, "clen", ["tx-full", "checkpoint-replay"])
    with pytest.raises(ValueError, match=r"did you mean tx-full\?"):
        paired_compare(recs, "clean", ["tx-ful", "checkpoint-replay"])
    with pytest.raises(ValueError, match="besides the baseline"):
        paired_compare(recs, "clean", ["tx-full"])
    for r in recs:
        r["metrics"]["label"] = "a"
    with pytest.raises(ValueError, match="metric 'label'"):
        paired_compare(recs, "label", ["tx-full", "checkpoint-replay"])


def test_not_exercised_cells_are_shown_but_not_tested() -> None:
    recs = issue_example()
    for r in recs:
        r["exercised"] = {"faults": {}, "faults_total": 0, "faults_armed": True}
    cmp = paired_compare(recs, "clean", ["tx-full", "checkpoint-replay"])
    (row,) = cmp.rows
    assert not row.exercised and math.isnan(row.p) and math.isnan(row.p_holm)
    assert "not exercised" in paired_markdown(cmp)


def test_formats_md_csv_tex() -> None:
    cmp = paired_compare(issue_example(), "clean", ["tx-full", "checkpoint-replay"])
    md = paired_markdown(cmp)
    assert "| fp=0.1 | checkpoint-replay | 30 | 63 | 83 | +6/-0 | +20 |" in md
    assert "exact McNemar" in md and "Holm" in md and "Newcombe" in md
    rows = list(csv.DictReader(io.StringIO(paired_csv(cmp))))
    assert rows[0]["p_value"] == repr(0.03125) and rows[0]["gained"] == "6"
    tex = paired_latex(cmp)
    assert r"\toprule" in tex and r"\bottomrule" in tex and "McNemar" in tex


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no LaTeX installed")
def test_paired_latex_compiles_and_fits_a_column(tmp_path: Path) -> None:
    from harness.analysis.latex import compile_tex, overfull_pt

    cmp = paired_compare(issue_example(), "clean", ["tx-full", "checkpoint-replay"])
    log = compile_tex(paired_latex(cmp), tmp_path, twocolumn=True)
    assert overfull_pt(log) == 0.0


def test_cli_compare_defaults_to_every_mode_and_writes_formats(tmp_path: Path) -> None:
    import yaml
    from typer.testing import CliRunner

    from cli import app

    config = tmp_path / "tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "tiny", "workload": "synthetic", "seed": 11, "trials": 3,
                "modes": ["tx-full", "no-tx", "saga"], "faults": {"classes": ["F1", "F2"]},
                "labels": {"faults.rate": "fp"}, "grid": {"faults.rate": [0.0, 0.3]},
            }
        )
    )  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(config), "--out", str(tmp_path / "r"), "--jobs", "1"])
    assert result.exit_code == 0, result.output
    (run_dir,) = [p.parent for p in (tmp_path / "r").glob("*/*/manifest.json")]
    out = runner.invoke(app, ["compare", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert "McNemar" in out.stdout and "Holm" in out.stdout
    assert "no-tx" in out.stdout and "saga" in out.stdout  # every mode against the first
    for suffix in ("md", "csv", "tex"):
        assert (run_dir / "tables" / f"compare-clean-vs-tx-full.{suffix}").is_file()
    tex = runner.invoke(app, ["compare", str(run_dir), "--format", "tex", "--baseline", "no-tx"])
    assert tex.exit_code == 0 and tex.stdout.startswith(r"\begin{table")
    csv_out = runner.invoke(
        app, ["compare", str(run_dir), "--format", "csv", "--modes", "tx-full,saga"]
    )
    assert csv_out.exit_code == 0 and csv_out.stdout.startswith("metric,cell_id,baseline")
    counts = runner.invoke(app, ["compare", str(run_dir), "--metric", "duplicates"])
    assert counts.exit_code == 0 and "Wilcoxon" in counts.stdout
    bad = runner.invoke(app, ["compare", str(run_dir), "--baseline", "tx-ful"])
    assert bad.exit_code == 2 and "tx-ful" in bad.stderr

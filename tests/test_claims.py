"""`atomix claims`: the row table, the verdict and sign rules on hand-made paired records,
Holm across rows, and a tiny end-to-end run."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import invoke

from harness.analysis.paired import holm
from harness.analysis.table import NOT_EXERCISED_TEXT
from harness.errors import ConfigError
from harness.experiment.config import load_config
from harness.modes.registry import MODES
from harness.paper import claim_rows as cr
from harness.paper import claims as cl
from harness.paper.claims import (
    CONTRADICTED,
    FULL,
    NOT_SUPPORTED,
    ROWS,
    SUPPORTED,
    ClaimRow,
    evaluate,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# --------------------------------------------------------------------------- the row table


def test_rows_name_registered_modes_configs_cells_and_report_metrics() -> None:
    configs = {name: load_config(CONFIGS / f"{name}.yaml") for name in {r.config for r in ROWS}}
    assert cl.check_rows(ROWS, configs) == []
    for row in ROWS:
        assert row.ablation in MODES and row.ablation != FULL
        assert row.metric in cl.METRICS


def test_every_component_and_claim_has_a_row() -> None:
    wanted = {
        "irreversible gate": {"tx-no-gate"},
        "keyed re-delivery": {"tx-unkeyed"},
        "compensation at abort": {"tx-no-compensation"},
        "scope-on-read with abort-on-stale": {
            "tx-no-read-checks", "tx-no-scope-on-read", "tx-no-abort-on-stale",
        },
        "per-resource frontier": {"no-frontier", "tx-global-frontier"},
        "seal": {"tx-no-seal"},
    }  # fmt: skip
    assert set(cl.COMPONENTS) == set(wanted)
    for component, ablations in wanted.items():
        assert {r.ablation for r in ROWS if r.component == component} >= ablations, component
    assert {r.claim for r in ROWS} == set(cl.CLAIMS)
    # The epoch-order claim is tested against both frontier ablations.
    order = {r.ablation for r in ROWS if r.claim == cr.ORDER and r.component == cr.FRONTIER}
    assert order == {"no-frontier", "tx-global-frontier"}


def test_check_rows_names_each_problem() -> None:
    config = load_config(CONFIGS / "tau_contention.yaml")
    bad = [
        ClaimRow("no such claim", cr.SEAL, "tx-no-sael", "tau_contention", "clean"),
        ClaimRow(cr.CONTENDING, "no such part", FULL, "tau_contention", "wait_ms", ("agents=5",)),
        ClaimRow(cr.CONTENDING, cr.SEAL, "tx-global-frontier", "nowhere", "wait_ms"),
    ]
    text = "\n".join(cl.check_rows(bad, {"tau_contention": config}))
    for needle in (
        "unknown claim 'no such claim'",
        "ablation 'tx-no-sael' is not a registered mode",
        "metric 'clean' is in none of tau_contention's report tables",
        "unknown component 'no such part'",
        "ablation 'tx-full' is not a registered mode other than tx-full",
        "tau_contention has no cell 'agents=5'",
        "no config named 'nowhere'",
    ):
        assert needle in text


# --------------------------------------------------------------------------- verdicts


def _rec(mode: str, trial: int, value: Any, cell: str = "fp=0.1", **ex: Any) -> dict[str, Any]:
    exercised = {
        "faults": {"F1": ex.get("faults", 1), "F2": 0, "F3": 0, "F4": 0, "F5": 0},
        "faults_total": ex.get("faults", 1),
        "aborts": 0,
        "compensations": 0,
        "irreversible_calls": ex.get("irreversible_calls", 0),
        "sends": 0,
        "fault_classes": ["F1"],
        "faults_armed": ex.get("armed", True),
    }
    metric = ex.get("metric", "clean")
    return {
        "key": f"k/{mode}/{cell}/{trial}",
        "mode": mode,
        "cell_id": cell,
        "cell": {},
        "trial": trial,
        "seed": 7,
        "metrics": {metric: value},
        "exercised": exercised,
    }


def _paired(full: list[Any], ablated: list[Any], ablation: str = "abl", **ex: Any) -> list[dict]:
    return [_rec(FULL, t, v, **ex) for t, v in enumerate(full)] + [
        _rec(ablation, t, v, **ex) for t, v in enumerate(ablated)
    ]


def _row(metric: str = "clean", ablation: str = "abl", config: str = "x", **kw: Any) -> ClaimRow:
    return ClaimRow(cr.CLEAN, cr.KEYS, ablation, config, metric, **kw)


def test_supported_when_full_wins_on_a_yes_no_metric() -> None:
    (r,) = evaluate([_row()], {"x": _paired([True] * 20, [False] * 20)})
    assert r.verdict == SUPPORTED
    assert (r.pairs, r.full_better, r.full_worse) == (20, 20, 0)
    assert r.effect == pytest.approx(100.0)  # percentage points
    assert r.ci_low > 0 and r.ci_high <= 100.0
    assert r.p_holm < 0.05


def test_contradicted_when_the_ablation_wins() -> None:
    (r,) = evaluate([_row()], {"x": _paired([False] * 20, [True] * 20)})
    assert r.verdict == CONTRADICTED
    assert r.effect == pytest.approx(-100.0) and r.ci_high < 0


def test_not_supported_without_evidence() -> None:
    # 3 against 2 discordant pairs: no evidence either way.
    full = [True] * 3 + [False] * 2 + [True] * 10
    abl = [False] * 3 + [True] * 2 + [True] * 10
    (r,) = evaluate([_row()], {"x": _paired(full, abl)})
    assert r.verdict == NOT_SUPPORTED
    assert r.ci_low < 0 < r.ci_high
    identical = evaluate([_row()], {"x": _paired([True] * 10, [True] * 10)})[0]
    assert identical.verdict == NOT_SUPPORTED and identical.effect == 0
    assert (identical.full_better, identical.full_worse) == (0, 0)


def test_lower_is_better_flips_the_sign() -> None:
    # residue: tx-full leaves none, the ablation one per trial.
    recs = _paired([0] * 12, [1] * 12, metric="residue")
    (r,) = evaluate([_row("residue")], {"x": recs})
    assert r.kind == "numeric"
    assert r.full == 0 and r.ablated == 1
    assert r.effect == pytest.approx(1.0) and r.ci_low <= r.effect <= r.ci_high
    assert r.verdict == SUPPORTED and (r.full_better, r.full_worse) == (12, 0)
    # A yes/no metric where lower is better (leaked): the ablation leaking is tx-full better.
    leak = _paired([False] * 15, [True] * 15, metric="leaked")
    (r,) = evaluate([_row("leaked")], {"x": leak})
    assert r.effect == pytest.approx(100.0) and r.verdict == SUPPORTED


def test_not_exercised_rows() -> None:
    # Faults armed but none injected: the row's condition never occurred.
    quiet = _paired([True] * 20, [False] * 20, faults=0)
    (r,) = evaluate([_row()], {"x": quiet})
    assert r.verdict == NOT_EXERCISED_TEXT and math.isnan(r.p_holm)
    # A requirement that never occurred.
    (r,) = evaluate(
        [_row(requires="irreversible_calls")], {"x": _paired([True] * 20, [False] * 20)}
    )
    assert r.verdict == NOT_EXERCISED_TEXT
    # No pairs: the ablation never ran in the row's cells, or the config has no records.
    only_full = [_rec(FULL, t, True) for t in range(5)]
    (r,) = evaluate([_row()], {"x": only_full})
    assert r.verdict == NOT_EXERCISED_TEXT and r.pairs == 0
    (r,) = evaluate([_row(config="absent")], {"x": only_full})
    assert r.verdict == NOT_EXERCISED_TEXT
    (r,) = evaluate([_row(cells=("fp=0.3",))], {"x": _paired([True] * 9, [False] * 9)})
    assert r.verdict == NOT_EXERCISED_TEXT and r.pairs == 0


def test_cells_pool_but_pairs_stay_within_a_cell() -> None:
    recs = [_rec(FULL, t, True, "fp=0.1") for t in range(6)]
    recs += [_rec("abl", t, False, "fp=0.1") for t in range(6)]
    recs += [_rec(FULL, t, False, "fp=0.3") for t in range(6)]
    recs += [_rec("abl", t, True, "fp=0.3") for t in range(6)]
    (both,) = evaluate([_row(cells=("fp=0.1", "fp=0.3"))], {"x": recs})
    assert (both.pairs, both.full_better, both.full_worse) == (12, 6, 6)
    (one,) = evaluate([_row(cells=("fp=0.1",))], {"x": recs})
    assert (one.pairs, one.full_better, one.full_worse) == (6, 6, 0)


def test_holm_runs_across_all_rows_of_the_table() -> None:
    strong = _paired([True] * 30, [False] * 30)
    # 6 discordant pairs, all for tx-full: exact McNemar p = 2 * 0.5**6 = 0.03125.
    weak = _paired([True] * 6 + [True] * 4, [False] * 6 + [True] * 4)
    (alone,) = evaluate([_row()], {"x": weak})
    assert alone.p == pytest.approx(0.03125) and alone.verdict == SUPPORTED
    rows = [_row(config="a"), _row(config="b"), _row(config="c"), _row(config="quiet")]
    records = {
        "a": strong,
        "b": weak,
        "c": weak,
        "quiet": _paired([True] * 5, [False] * 5, faults=0),
    }
    results = evaluate(rows, records)
    raw = [r.p for r in results]
    assert math.isnan(raw[3])  # not exercised: not a test, not counted
    assert [r.p_holm for r in results][:3] == pytest.approx(holm(raw)[:3])
    assert results[1].p_holm == pytest.approx(2 * 0.03125)  # three tests, not one
    assert [r.verdict for r in results] == [
        SUPPORTED,
        NOT_SUPPORTED,
        NOT_SUPPORTED,
        NOT_EXERCISED_TEXT,
    ]


def test_unseparated_lists_components_without_a_separating_row() -> None:
    rows = [
        ClaimRow(cr.CLEAN, cr.KEYS, "abl", "a", "clean"),
        ClaimRow(cr.CLEAN, cr.SEAL, "abl", "b", "clean"),
    ]
    results = evaluate(
        rows, {"a": _paired([True] * 30, [False] * 30), "b": _paired([True] * 9, [True] * 9)}
    )
    none = cl.unseparated(results)
    assert cr.SEAL in none and cr.KEYS not in none
    assert set(none) == set(cl.COMPONENTS) - {cr.KEYS}  # components with no row at all too
    md = cl.claims_markdown(results)
    assert "What no workload separates" in md
    assert "**seal**" in md and "the same value as tx-full on all 9 pairs" in md
    assert "**per-resource frontier**: no row tests it." in md
    assert "positive effect means tx-full" in md


def test_csv_is_a_function_of_the_records() -> None:
    recs = {"x": _paired([True, False, True] * 5, [False, False, True] * 5)}
    one = cl.claims_csv(evaluate([_row()], recs))
    assert one == cl.claims_csv(evaluate([_row()], recs))
    (line,) = list(csv.DictReader(io.StringIO(one)))
    for column in ("claim", "component", "workload", "ablation", "metric", "effect",
                   "ci_low", "ci_high", "p_holm", "verdict", "pairs"):  # fmt: skip
        assert column in line
    assert line["metric"] == "clean" and line["unit"].endswith("percentage points")
    assert float(line["effect"]) == pytest.approx(100 * 5 / 15, rel=1e-9)


# --------------------------------------------------------------------------- end to end


def _tiny_configs(tmp_path: Path) -> Path:
    """tau_contention with N = 6, one cell: a second's worth of trials."""
    configs = tmp_path / "configs"
    configs.mkdir()
    data = yaml.safe_load((CONFIGS / "tau_contention.yaml").read_text(encoding="utf-8"))
    data.update(trials=6, grid={"params.agents": [4, 8]})
    data.pop("paper", None)
    (configs / "tau_contention.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    return configs


TINY_ROWS = [
    ClaimRow(cr.CONTENDING, cr.READS, "tx-no-abort-on-stale", "tau_contention",
             "invariant_violations", ("agents=4",)),
    ClaimRow(cr.CONTENDING, cr.SEAL, "tx-no-seal", "tau_contention", "invariant_violations",
             ("agents=4",)),
]  # fmt: skip


def test_end_to_end_tiny_run(tmp_path: Path) -> None:
    configs = _tiny_configs(tmp_path)
    out = tmp_path / "out"
    planned = cl.plan_configs(TINY_ROWS, configs, quick=True)
    config = planned["tau_contention"]
    assert config.modes == [FULL, "tx-no-abort-on-stale", "tx-no-seal"]
    assert config.grid == {"params.agents": [4]}  # the cell no row needs is not run
    assert config.trials == 6  # --quick never raises a config's N
    said: list[str] = []
    result = cl.run_claims(rows=TINY_ROWS, quick=True, out=out, jobs=1, configs_dir=configs,
                           say=said.append)  # fmt: skip
    assert [p.name for p in result.paths] == ["claims.csv", "claims.md"]
    lines = list(csv.DictReader(io.StringIO((out / "claims.csv").read_text())))
    assert [(r["ablation"], int(r["pairs"])) for r in lines] == [
        ("tx-no-abort-on-stale", 6), ("tx-no-seal", 6),
    ]  # fmt: skip
    assert all(r["verdict"] in cl.VERDICTS for r in lines)
    # Holm over both rows.
    assert [float(r["p_holm"]) for r in lines] == pytest.approx(
        holm([float(r["p"]) for r in lines]), rel=1e-5
    )
    first = (out / "claims.csv").read_bytes()
    # Again: the finished run is reused, and the table is the same bytes.
    again = cl.run_claims(rows=TINY_ROWS, quick=True, out=out, jobs=1, configs_dir=configs,
                          say=said.append)  # fmt: skip
    assert again.runs == result.runs
    assert any("reused" in line for line in said)
    assert (out / "claims.csv").read_bytes() == first
    assert "## Claims and ablations" in (out / "claims.md").read_text()


def test_bad_rows_and_bad_out_fail_before_running(tmp_path: Path) -> None:
    configs = _tiny_configs(tmp_path)
    with pytest.raises(ConfigError, match="no such config"):
        cl.plan_configs([_row(config="nowhere")], configs, quick=True)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(cl.OutError, match="cannot write there"):
        cl.run_claims(rows=TINY_ROWS, quick=True, out=blocker / "sub", configs_dir=configs)
    assert not list(tmp_path.glob("**/trials.jsonl"))


def test_cli_bad_input(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = invoke("claims", "--quick", "--out", blocker)
    assert res.exit_code == 2 and "--out" in res.output and "cannot write there" in res.output
    res = invoke("claims", "--quik")
    assert res.exit_code == 2 and "--quick" in res.output
    res = invoke("claims", "--configs", tmp_path / "none")
    assert res.exit_code == 2 and "not a directory" in res.output


def test_check_rows_refuses_a_direction_the_config_contradicts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = load_config(CONFIGS / "epoch_order.yaml")
    row = ClaimRow(cr.ORDER, cr.FRONTIER, "no-frontier", "epoch_order", "order_violations")
    assert cl.check_rows([row], {"epoch_order": config}) == []
    monkeypatch.setitem(cl.METRICS, "order_violations", cl.Metric("higher", "flipped"))
    (problem,) = cl.check_rows([row], {"epoch_order": config})
    assert "is better lower, METRICS says higher" in problem

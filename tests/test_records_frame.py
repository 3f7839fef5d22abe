"""The records frame is built column by column and exercised counts are summed for all groups
at once; both must give exactly what one dict per row and one sum per group give."""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd
import pytest

from harness.analysis import records as R
from harness.analysis.exercised import _sum_known, exercised_counts, exercised_counts_by
from harness.analysis.records import (
    B_COLUMNS,
    BASE_COLUMNS,
    UNJUDGED_COLUMN,
    X_COLUMNS,
    exercised_records_frame,
    normalize,
    normalized,
    records_frame,
)


def _row_dict_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The reference: one dict per record, then a DataFrame of them."""
    rows = []
    for rec in records:
        cell = rec.get("cell") or {}
        cell_id = rec.get("cell_id")
        if cell_id is None:
            cell_id = ", ".join(f"{k}={R.format_value(R._hashable(cell[k]))}" for k in sorted(cell))
        row = {"key": rec.get("key"), "mode": str(rec["mode"]), "cell_id": str(cell_id),
               "trial": rec.get("trial"), "seed": rec.get("seed")}
        row.update({f"cell.{k}": R._hashable(v) for k, v in cell.items()})
        row.update({f"m.{k}": v for k, v in rec["metrics"].items()})
        row.update(R._exercised_columns(rec))
        row.update(R._budget_columns(rec))
        row[UNJUDGED_COLUMN] = R._unjudged(rec)
        rows.append(row)
    cells = sorted({c for r in rows for c in r if c.startswith("cell.")})
    metrics = sorted({c for r in rows for c in r if c.startswith("m.")})
    df = pd.DataFrame(rows, columns=[*BASE_COLUMNS, *cells, *metrics, *X_COLUMNS, *B_COLUMNS,
                                     UNJUDGED_COLUMN])
    df = df.sort_values(["mode", "cell_id", "trial", "key"], kind="mergesort", na_position="last")
    return df.reset_index(drop=True)


def _records(seed: int, n: int = 200, old: bool = True) -> list[dict[str, Any]]:
    """Ragged records: metrics and cell parameters missing in some, mixed value types, records
    that say what they exercised and (with `old`) older ones that do not."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        metrics = {"clean": rng.choice([True, False]), "count": rng.choice([0, 1, 3, None]),
                   "wait": rng.choice([0.5, 2.0, float("nan")]), "tag": rng.choice(["a", 1])}
        rec: dict[str, Any] = {
            "key": f"k{i}", "mode": rng.choice(["tx-full", "saga", "no-tx"]), "trial": i % 5,
            "seed": rng.choice([1, 2]),
            "metrics": {k: v for k, v in metrics.items() if rng.random() < 0.85},
            "cell": {k: v for k, v in {"fp": rng.choice([0.0, 0.1]), "xs": rng.choice([[1], "t"]),
                                        "on": rng.choice([True, None])}.items()
                     if rng.random() < 0.85},
        }
        if not old or rng.random() < 0.6:
            rec["exercised"] = {
                "faults": {c: rng.randint(0, 2) for c in ("F1", "F2") if rng.random() < 0.7},
                "faults_total": rng.choice([0, 2, None]), "aborts": rng.choice([0, 1]),
                "compensations": 0, "irreversible_calls": rng.choice([0, None]), "sends": 1,
                "fault_classes": rng.choice([["F1", "F2"], None]),
                "faults_armed": rng.choice([True, False, None]),
            }
        else:
            rec["faults"] = [{"fault": rng.choice(["F1", "F3"])} for _ in range(rng.randint(0, 2))]
        if rng.random() < 0.5:
            rec["budget"] = {"mode": {"apply": rng.choice([0, 8]), "call": 1, "confirm": 0,
                                      "resend": 0},
                             "agent": {"kind": "llm-like", "max_attempts": 4, "max_steps": 30,
                                       "step_retries": None, "wrapper_retries": 0},
                             "retries": rng.choice([{}, {"apply": 1}])}
        if rng.random() < 0.4:
            rec["reward"] = {"components": {"db": True, "nl": rng.choice([None, "needs a judge"])}}
        out.append(rec)
    return out


def _assert_same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    assert a.dtypes.equals(b.dtypes)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    for col in a.columns:  # same Python types too (an int stays an int, None stays None)
        assert [type(v) for v in a[col].tolist()] == [type(v) for v in b[col].tolist()], col


@pytest.mark.parametrize("old", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_records_frame_is_the_row_dict_frame(seed: int, old: bool) -> None:
    recs = _records(seed, old=old)
    _assert_same(records_frame(recs), _row_dict_frame(recs))


def test_records_frame_of_no_records() -> None:
    _assert_same(records_frame([]), _row_dict_frame([]))


def test_records_frame_still_refuses_a_repeated_key() -> None:
    recs = _records(4, n=5)
    recs[3]["key"] = recs[1]["key"]
    with pytest.raises(ValueError, match="duplicate trial key 'k1' in records 1 and 3"):
        records_frame(recs)
    with pytest.raises(ValueError, match="duplicate trial key"):
        exercised_records_frame(recs)


def test_exercised_records_frame_has_the_columns_of_records_frame() -> None:
    recs = [{**r, "metrics": {**r["metrics"], "i": n}} for n, r in enumerate(_records(5))]
    full = records_frame(recs)
    part = exercised_records_frame(recs, ["count", "i", "absent"])
    assert list(part.columns) == ["mode", "cell_id", "m.count", "m.i", *X_COLUMNS]
    assert part["m.i"].tolist() == list(range(len(recs)))  # in the records' order
    part = part.set_index("m.i").loc[full["m.i"].tolist()].reset_index(drop=True)
    _assert_same(part, full[list(part.columns)])


@pytest.mark.parametrize("requires", [None, "faults", "F1", "sends", "metric:count",
                                      "metric:wait", "metric:clean", "metric:absent"])
def test_counts_for_all_groups_are_the_counts_of_each(requires: str | None) -> None:
    df = records_frame(_records(6))
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(df["mode"], df["cell_id"], strict=True)):
        groups.setdefault(key, []).append(i)
    groups[("none", "empty")] = []
    by = exercised_counts_by(df, groups, requires)
    assert list(by) == list(groups)
    for key, index in groups.items():
        sub = df.iloc[index]
        want: dict[str, Any] = {}
        for name in R.EXERCISED_COUNTS:
            want[name] = _sum_known(sub[f"x.{name}"].tolist())
        armed = sub["x.faults_armed"].tolist()
        want["faults_armed"] = bool(armed) and all(normalize(a) is True for a in armed)
        if requires and requires.startswith("metric:"):
            col = f"m.{requires.removeprefix('metric:')}"
            want[requires] = _sum_known(sub[col].tolist()) if col in sub.columns else None
        assert by[key] == want, key
        assert [type(v) for v in by[key].values()] == [type(v) for v in want.values()]
        assert exercised_counts(df, index, requires) == want


def test_counts_of_a_column_that_cannot_be_summed_fail_as_before() -> None:
    df = records_frame(_records(7))
    with pytest.raises(ValueError):
        exercised_counts_by(df, {"all": range(len(df))}, "metric:tag")  # int("a")


def test_normalized_is_normalize_per_value() -> None:
    nan = math.nan
    columns = [pd.Series(v) for v in ([1, 2], [True, False], [1.5, nan], ["a", "b"], ["a", None],
                                      [True, None], [1, "a"], [nan, nan], [None, None])]
    for col in columns:
        got, want = normalized(col), [normalize(v) for v in col.tolist()]
        assert repr(got) == repr(want) and [type(v) for v in got] == [type(v) for v in want]

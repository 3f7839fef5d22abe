"""Trial records as a DataFrame, and what each mode x cell exercised.

A trial record is one JSON object per line (see ``results/``) with ``mode``, ``cell``,
``cell_id``, ``trial``, ``metrics`` and ``exercised``. ``records_frame`` flattens records
into one row per trial; ``exercised_counts`` and ``is_exercised`` say whether a cell's
trials exercised what a table measures (a condition that never occurred is not a result),
and ``exercised_frame`` is the per-run table of what every mode x cell exercised.

The value helpers (``format_value``, ``normalize``, ``value_sort_key``, ``is_bool``) are the
one spelling, missing-value rule and ordering of cell values that every table, LaTeX
table and plot uses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "BASE_COLUMNS",
    "B_COLUMNS",
    "EXERCISED_COUNTS",
    "FAULT_CLASSES",
    "METRIC_BOUNDS",
    "REQUIRES",
    "REQUIRES_TEXT",
    "X_COLUMNS",
    "exercised_counts",
    "exercised_frame",
    "format_value",
    "is_bool",
    "is_exercised",
    "metric_bounds",
    "normalize",
    "records_frame",
    "value_sort_key",
]

BASE_COLUMNS: tuple[str, ...] = ("key", "mode", "cell_id", "trial", "seed")

FAULT_CLASSES: tuple[str, ...] = ("F1", "F2", "F3", "F4", "F5")
#: Counts a trial record's ``exercised`` holds, as ``records_frame`` names them (``x.<name>``)
#: and as table CSVs and the exercised table name them.
EXERCISED_COUNTS: tuple[str, ...] = (
    *(f"faults_{c}" for c in FAULT_CLASSES),
    "faults_total",
    "aborts",
    "compensations",
    "irreversible_calls",
    "sends",
)
#: What a table may require to have occurred in a cell for the cell to be a result.
#: "none" turns the check off; no `requires` applies the default rule (see is_exercised).
REQUIRES: tuple[str, ...] = (
    "faults",
    *FAULT_CLASSES,
    "aborts",
    "compensations",
    "irreversible_calls",
    "sends",
    "none",
)
_REQUIRES_COUNT = {"faults": "faults_total", **{c: f"faults_{c}" for c in FAULT_CLASSES}}
#: What did not occur in a cell that was not exercised, per requirement (None: the default).
REQUIRES_TEXT: dict[str | None, str] = {
    None: "the cell injects faults but none was injected in its trials",
    "faults": "no fault was injected in the cell's trials",
    **{c: f"no {c} fault was injected in the cell's trials" for c in FAULT_CLASSES},
    "aborts": "no transaction aborted in the cell's trials",
    "compensations": "nothing was compensated in the cell's trials",
    "irreversible_calls": "no irreversible call was made in the cell's trials",
    "sends": "no message reached the sink in the cell's trials",
    "none": "",
}


# --------------------------------------------------------------------------- metric ranges

#: The range every value of a trial metric lies in, (lower, upper) with None for no bound:
#: an interval of a mean is cut at it (see ``harness.analysis.stats.mean_ci``) so that no
#: table or plot claims an impossible mean (a negative count or wait, a share above 1).
#: The range is declared here, by what the metric is, never guessed from the values seen:
#: a sample of a signed metric can happen to be all positive. A metric not listed (and not
#: boolean) gets the plain t interval. A new non-negative metric is a new row.
METRIC_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    # Counts per trial (the oracle's verdict and the trial's own counts).
    **{
        name: (0.0, None)
        for name in (
            "invariant_violations", "stale_commits", "duplicates", "leaks", "leaked", "residue",
            "unclassified_residue", "reported_residue", "aborts", "attempts", "committed",
            "agents", "extra_writes", "budget_exhausted", "steps", "order_violations",
            "mail_mismatch", "missed_conflict", "false_conflict", "lost_committed",
            "applied_uncommitted", "contamination_buffer", "contamination_files",
            "contamination_db", "contamination_booking", "contamination_mailbox",
            "makespan_steps",
        )
    },
    # Times (simulated or wall ms), rates and sizes.
    **{
        name: (0.0, None)
        for name in (
            "wait_ms", "needless_wait_ms", "makespan_ms", "step_ms", "throughput",
            "wiring_loc", "wiring_loc_per_tool", "integration_loc", "library_loc",
        )
    },
    # Shares of a trial's tasks.
    "blocked": (0.0, 1.0),
}  # fmt: skip


def metric_bounds(metric: str, boolean: bool = False) -> tuple[float | None, float | None]:
    """The declared range of ``metric`` (``METRIC_BOUNDS``); a boolean metric is in [0, 1];
    otherwise (None, None): no bound is claimed."""
    if metric in METRIC_BOUNDS:
        return METRIC_BOUNDS[metric]
    return (0.0, 1.0) if boolean else (None, None)


# --------------------------------------------------------------------------- values


def format_value(v: Any) -> str:
    """Label text for a cell parameter or row value: 0.1 -> "0.1", 0.0 -> "0"."""
    if v is None:
        return "NA"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NA"
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


def _hashable(v: Any) -> Any:
    # Lists/dicts in a cell cannot be grouped on; a canonical JSON string can.
    if isinstance(v, list | dict | tuple):
        return json.dumps(v, sort_keys=True)
    return v


def normalize(v: Any) -> Any:
    """Missing values (None, NaN, pd.NA) become None; numpy scalars become Python ones."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def value_sort_key(v: Any) -> tuple[int, Any]:
    """Sort key of a normalized cell value: numbers, then strings, then missing."""
    # Never a mixed-type comparison, so a column of ints and strings still sorts.
    if v is None:
        return (3, "")
    if isinstance(v, bool):
        return (0, int(v))
    if isinstance(v, int | float):
        return (1, float(v))
    return (2, str(v))


def is_bool(v: Any) -> bool:
    """True for a Python or numpy bool (a bool is an int, so test before numbers)."""
    return isinstance(v, bool | np.bool_)


# --------------------------------------------------------------------------- records


def _exercised_columns(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A record's ``exercised`` as ``x.<count>``, ``x.fault_classes`` and ``x.faults_armed``.

    A record written before trials said what they exercised has its fault counts read from
    its ``faults`` list and its aborts from its metrics; what cannot be recovered (the
    other counts, whether faults were armed) is None, which never makes a cell n/a.
    """
    ex = rec.get("exercised")
    if isinstance(ex, Mapping):
        per_class = ex.get("faults") or {}
        out: dict[str, Any] = {f"x.faults_{c}": int(per_class.get(c, 0)) for c in FAULT_CLASSES}
        for name in EXERCISED_COUNTS[len(FAULT_CLASSES) :]:
            v = ex.get(name)
            out[f"x.{name}"] = None if v is None else int(v)
        classes = ex.get("fault_classes")
        out["x.fault_classes"] = None if classes is None else ",".join(map(str, classes))
        armed = ex.get("faults_armed")
        out["x.faults_armed"] = None if armed is None else bool(armed)
        return out
    out = {f"x.{name}": None for name in EXERCISED_COUNTS}
    injected = rec.get("faults")
    if isinstance(injected, list):
        for c in FAULT_CLASSES:
            out[f"x.faults_{c}"] = sum(1 for f in injected if str(f.get("fault")) == c)
        out["x.faults_total"] = len(injected)
    aborts = (rec.get("metrics") or {}).get("aborts")
    if isinstance(aborts, int | float) and not isinstance(aborts, bool):
        out["x.aborts"] = int(aborts)
    out["x.fault_classes"] = None
    out["x.faults_armed"] = None
    return out


#: Columns of ``records_frame`` that come from a record's ``exercised``.
X_COLUMNS: tuple[str, ...] = (
    *(f"x.{name}" for name in EXERCISED_COUNTS),
    "x.fault_classes",
    "x.faults_armed",
)

#: Columns of ``records_frame`` that say a record's ``budget`` (its compact texts; None where a
#: record written before trials recorded their budget does not say).
B_COLUMNS: tuple[str, ...] = ("b.mode", "b.agent", "b.retries")


def _budget_columns(rec: Mapping[str, Any]) -> dict[str, Any]:
    # The one spelling of a budget lives with the record's definition (experiment wing).
    from harness.experiment.budget import agent_text, limits_text, mode_text

    budget = rec.get("budget")
    if not isinstance(budget, Mapping):
        return dict.fromkeys(B_COLUMNS)
    return {
        "b.mode": mode_text(budget),
        "b.agent": agent_text(budget),
        "b.retries": limits_text(budget.get("retries") or {}),
    }


#: A record's task-reward components that were not judged (e.g. tau2's natural-language
#: assertions, which need an LLM judge), comma-separated; None where the record has no reward.
UNJUDGED_COLUMN = "r.unjudged"


def _unjudged(rec: Mapping[str, Any]) -> str | None:
    reward = rec.get("reward")
    if not isinstance(reward, Mapping):
        return None
    components = reward.get("components") or {}
    # A component's value is True/False (judged), None (not applicable) or a string saying
    # why it was not judged.
    return ",".join(sorted(k for k, v in components.items() if isinstance(v, str)))


def records_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per trial record.

    Columns: ``key, mode, cell_id, trial, seed``, then ``cell.<param>`` and ``m.<metric>``
    (each group sorted by name), then what the trial exercised: ``x.<count>`` for each of
    ``EXERCISED_COUNTS``, ``x.fault_classes`` (comma-separated) and ``x.faults_armed``
    (None where a record does not say), then its budget as texts (``B_COLUMNS``; None where a
    record does not say), then ``r.unjudged`` (``UNJUDGED_COLUMN``). Metric values are kept
    as given, so bools stay
    bool. Rows are sorted by (mode, cell_id, trial, key). A repeated ``key`` raises
    ValueError, because a trial counted twice would silently inflate N.
    """
    rows: list[dict[str, Any]] = []
    seen: dict[Any, int] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise TypeError(f"record {i} is {type(rec).__name__}, not a mapping")
        missing = [f for f in ("mode", "metrics") if f not in rec]
        if missing:
            raise ValueError(f"record {i} lacks {', '.join(missing)}")
        cell = rec.get("cell") or {}
        cell_id = rec.get("cell_id")
        if cell_id is None:
            cell_id = ", ".join(f"{k}={format_value(_hashable(cell[k]))}" for k in sorted(cell))
        row: dict[str, Any] = {
            "key": rec.get("key"),
            "mode": str(rec["mode"]),
            "cell_id": str(cell_id),
            "trial": rec.get("trial"),
            "seed": rec.get("seed"),
        }
        row.update({f"cell.{k}": _hashable(v) for k, v in cell.items()})
        row.update({f"m.{k}": v for k, v in rec["metrics"].items()})
        row.update(_exercised_columns(rec))
        row.update(_budget_columns(rec))
        row[UNJUDGED_COLUMN] = _unjudged(rec)
        key = row["key"]
        if key is not None:
            if key in seen:
                raise ValueError(
                    f"duplicate trial key {key!r} in records {seen[key]} and {i}: "
                    "a repeated trial would inflate N"
                )
            seen[key] = i
        rows.append(row)
    cell_cols = sorted({c for r in rows for c in r if c.startswith("cell.")})
    metric_cols = sorted({c for r in rows for c in r if c.startswith("m.")})
    df = pd.DataFrame(
        rows,
        columns=[*BASE_COLUMNS, *cell_cols, *metric_cols, *X_COLUMNS, *B_COLUMNS, UNJUDGED_COLUMN],
    )
    if not df.empty:
        df = df.sort_values(
            ["mode", "cell_id", "trial", "key"], kind="mergesort", na_position="last"
        )
    return df.reset_index(drop=True)


# --------------------------------------------------------------------------- exercised


def _sum_known(values: Iterable[Any]) -> int | None:
    """The sum of the known values, or None when no value is known."""
    known = [int(v) for v in (normalize(x) for x in values) if v is not None]
    return sum(known) if known else None


def exercised_counts(df: pd.DataFrame, index: Sequence[int] | None = None) -> dict[str, Any]:
    """Summed ``EXERCISED_COUNTS`` (None: unknown) over rows ``index`` of a records frame,
    plus ``faults_armed``: True when every one of those trials was set to inject faults."""
    sub = df if index is None else df.iloc[list(index)]
    out: dict[str, Any] = {}
    for name in EXERCISED_COUNTS:
        col = f"x.{name}"
        out[name] = _sum_known(sub[col].tolist()) if col in sub.columns else None
    armed = sub["x.faults_armed"].tolist() if "x.faults_armed" in sub.columns else []
    out["faults_armed"] = bool(armed) and all(normalize(a) is True for a in armed)
    return out


def is_exercised(counts: Mapping[str, Any], requires: str | None = None) -> bool:
    """Did a cell's trials exercise what is measured? ``counts`` as from :func:`exercised_counts`.

    ``requires`` None (the default rule): a cell whose every trial was set to inject faults
    (nonzero rate, or bursty arrival) must have had at least one injected; a fault-free
    cell (rate 0, e.g. a calibration column) is a result as it is. "faults": at least one
    fault injected (so a rate-0 cell is n/a too); "F1".."F5": one of that class; "aborts",
    "compensations", "irreversible_calls", "sends": at least one occurred; "none": always a
    result. A count the records do not hold (older records) never makes a cell n/a.
    """
    if requires == "none":
        return True
    if requires is None:
        if not counts.get("faults_armed"):
            return True
        name = "faults_total"
    else:
        if requires not in REQUIRES:
            raise ValueError(
                f"requires: unknown requirement {requires!r}; allowed: {', '.join(REQUIRES)}"
            )
        name = _REQUIRES_COUNT.get(requires, requires)
    value = counts.get(name)
    return value is None or value > 0


def exercised_frame(
    df: pd.DataFrame, mode_order: Sequence[str] = (), cell_order: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per (mode, cell_id): how many trials, the summed ``EXERCISED_COUNTS`` (None:
    the records do not say), the fault classes the cell asked for and whether it was set to
    inject faults at all (``faults_armed``; None when the records do not say).

    Modes in ``mode_order`` first, then the rest sorted; cells likewise by ``cell_order``.
    """
    cols = ["mode", "cell_id", "trials", *EXERCISED_COUNTS, "fault_classes", "faults_armed"]
    positions: dict[tuple[str, str], list[int]] = {}
    for i, (m, c) in enumerate(zip(df["mode"].tolist(), df["cell_id"].tolist(), strict=True)):
        positions.setdefault((str(m), str(c)), []).append(i)

    def order(values: Iterable[str], first: Sequence[str]) -> list[str]:
        present = list(dict.fromkeys(values))
        head = [v for v in dict.fromkeys(first) if v in present]
        return head + sorted(v for v in present if v not in head)

    modes = order((m for m, _ in positions), mode_order)
    cells = order((c for _, c in positions), cell_order)
    rows: list[dict[str, Any]] = []
    for m in modes:
        for c in cells:
            index = positions.get((m, c))
            if not index:
                continue
            sub = df.iloc[index]
            counts = exercised_counts(df, index)
            classes = [normalize(v) for v in sub.get("x.fault_classes", pd.Series(dtype=object))]
            armed = [normalize(v) for v in sub.get("x.faults_armed", pd.Series(dtype=object))]
            known_classes = sorted({v for v in classes if v is not None})
            rows.append(
                {
                    "mode": m,
                    "cell_id": c,
                    "trials": len(index),
                    **{name: counts[name] for name in EXERCISED_COUNTS},
                    "fault_classes": "; ".join(known_classes) if known_classes else None,
                    "faults_armed": None if any(a is None for a in armed) else all(armed),
                }
            )
    return pd.DataFrame(rows, columns=cols, dtype=object)

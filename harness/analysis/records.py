"""Trial records as a DataFrame, and the requirements a table may set on what a cell exercised.

A trial record is one JSON object per line (see ``results/``) with ``mode``, ``cell``,
``cell_id``, ``trial``, ``metrics`` and ``exercised``. ``records_frame`` flattens records
into one row per trial; ``REQUIRES`` and ``requirement_text`` name what a table may require
to have occurred, which ``harness.analysis.exercised`` checks (a condition that never
occurred is not a result).

The value helpers (``format_value``, ``normalize``, ``value_sort_key``, ``is_bool``) are the
one spelling, missing-value rule and ordering of cell values that every table, LaTeX
table and plot uses.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from harness.collector import collector_paused

__all__ = [
    "BASE_COLUMNS",
    "B_COLUMNS",
    "EXERCISED_COUNTS",
    "FAULT_CLASSES",
    "METRIC_BOUNDS",
    "REQUIRES",
    "REQUIRES_TEXT",
    "is_requirement",
    "requirement_text",
    "X_COLUMNS",
    "exercised_records_frame",
    "format_value",
    "is_bool",
    "metric_bounds",
    "normalize",
    "normalized",
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
_K = TypeVar("_K")
_REQUIRES_COUNT = {"faults": "faults_total", **{c: f"faults_{c}" for c in FAULT_CLASSES}}
#: A requirement on a workload's own count: ``metric:NAME`` holds when the cell's trials sum
#: metric NAME above 0 (e.g. ``metric:certificates_sent`` for a leak that needs a certificate).
METRIC_REQUIREMENT = "metric:"


def is_requirement(requires: str | None) -> bool:
    """Whether `requires` names a known requirement (None: the default rule)."""
    if requires is None or requires in REQUIRES:
        return True
    return requires.startswith(METRIC_REQUIREMENT) and len(requires) > len(METRIC_REQUIREMENT)


def requirement_text(requires: str | None) -> str:
    """What did not occur in a cell that was not exercised under `requires`."""
    if requires is not None and requires.startswith(METRIC_REQUIREMENT):
        return f"{requires[len(METRIC_REQUIREMENT):]} was 0 in every trial of the cell"
    return REQUIRES_TEXT[requires]
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


def normalized(column: pd.Series) -> list[Any]:
    """``[normalize(v) for v in column.tolist()]``, without a call per value where the dtype
    says what ``tolist`` gives (ints and bools as they are, floats with NaN as None)."""
    values = column.tolist()
    dtype = column.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "iub":
        return values  # Python ints and bools, never missing
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        return [None if v != v else v for v in values]  # NaN is the one float unequal to itself
    if isinstance(dtype, pd.StringDtype) and not column.hasnans:
        return values  # Python strings, none missing
    return [normalize(v) for v in values]


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


def _columns(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[Any], missing: Any
) -> list[list[Any]]:
    """For each of ``keys``, ``row[key]`` of every row (``missing`` where a row lacks it)."""
    out = []
    for key in keys:
        try:
            # The usual case, every row has the key: one C-level pass that allocates
            # nothing per row.
            out.append(list(map(operator.itemgetter(key), rows)))
        except KeyError:
            out.append([row.get(key, missing) for row in rows])
    return out


def _exercised_data(recs: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """``_exercised_columns`` of every record, as one list per ``X_COLUMNS`` column."""
    given = [rec.get("exercised") for rec in recs]
    exs = [ex for ex in given if type(ex) is dict]
    if len(exs) < len(given):
        rows = [_exercised_columns(rec) for rec in recs]
        return {col: [row[col] for row in rows] for col in X_COLUMNS}
    # Records that say what they exercised (all but the oldest): ``_exercised_columns``
    # column by column.
    out: dict[str, list[Any]] = {}
    per_class = [ex.get("faults") or {} for ex in exs]
    for c, values in zip(FAULT_CLASSES, _columns(per_class, FAULT_CLASSES, 0), strict=True):
        out[f"x.faults_{c}"] = list(map(int, values))
    rest = EXERCISED_COUNTS[len(FAULT_CLASSES) :]
    names = (*rest, "fault_classes", "faults_armed")
    values_of = dict(zip(names, _columns(exs, names, None), strict=True))
    for name in rest:
        out[f"x.{name}"] = _or_none(int, values_of[name])
    out["x.fault_classes"] = _or_none(lambda v: ",".join(map(str, v)), values_of["fault_classes"])
    out["x.faults_armed"] = _or_none(bool, values_of["faults_armed"])
    return out


def _or_none(convert: Any, values: list[Any]) -> list[Any]:
    """``[None if v is None else convert(v) for v in values]``."""
    if not any(v is None for v in values):
        return list(map(convert, values))
    return [None if v is None else convert(v) for v in values]


def _budget_data(recs: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """``_budget_columns`` of every record, as one list per ``B_COLUMNS`` column."""
    # A run holds a handful of distinct budgets (one per mode and cell): spell each once.
    # repr tells JSON values apart by type and key order, so equal reprs spell alike.
    memo: dict[str, tuple[Any, ...]] = {}
    none = (None,) * len(B_COLUMNS)
    rows: list[tuple[Any, ...]] = []
    for rec in recs:
        budget = rec.get("budget")
        if not isinstance(budget, Mapping):
            rows.append(none)
            continue
        token = repr(budget)
        texts = memo.get(token)
        if texts is None:
            cols = _budget_columns(rec)
            texts = memo[token] = tuple(cols[c] for c in B_COLUMNS)
        rows.append(texts)
    columns = zip(*rows, strict=True)
    return {col: list(values) for col, values in zip(B_COLUMNS, columns, strict=True)}


def _checked(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records as a list, each a mapping with a mode and metrics, no key twice."""
    out: list[Mapping[str, Any]] = []
    seen: dict[Any, int] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise TypeError(f"record {i} is {type(rec).__name__}, not a mapping")
        if "mode" not in rec or "metrics" not in rec:
            missing = [f for f in ("mode", "metrics") if f not in rec]
            raise ValueError(f"record {i} lacks {', '.join(missing)}")
        key = rec.get("key")
        if key is not None:
            if key in seen:
                raise ValueError(
                    f"duplicate trial key {key!r} in records {seen[key]} and {i}: "
                    "a repeated trial would inflate N"
                )
            seen[key] = i
        out.append(rec)
    return out


def _frame(
    recs: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None, full: bool
) -> pd.DataFrame:
    # Building a frame from a run's records allocates tens of thousands of short-lived
    # containers; a collection they trigger walks every object alive, the records themselves
    # included, and can cost more than the building. Nothing built here forms a cycle.
    with collector_paused():
        return _build_frame(recs, metrics, full)


def _build_frame(
    recs: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None, full: bool
) -> pd.DataFrame:
    # Built column by column (a list per column): a dict per row costs several times more
    # on a run of tens of thousands of trials. A value a record lacks is NaN, as pandas
    # fills a missing key of a row dict, so every column (values and inferred dtype) is the
    # one a list of row dicts gives.
    nan = math.nan
    cells = [rec.get("cell") or {} for rec in recs]
    cell_ids: list[str] = []
    for rec, cell in zip(recs, cells, strict=True):
        cid = rec.get("cell_id")
        if cid is None:
            cid = ", ".join(f"{k}={format_value(_hashable(cell[k]))}" for k in sorted(cell))
        cell_ids.append(str(cid))
    data: dict[str, list[Any]] = {"mode": [str(rec["mode"]) for rec in recs], "cell_id": cell_ids}
    if full:
        data = {
            "key": [rec.get("key") for rec in recs],
            **data,
            "trial": [rec.get("trial") for rec in recs],
            "seed": [rec.get("seed") for rec in recs],
        }
        names = sorted((f"cell.{k}", k) for k in set().union(*cells))
        values = _columns(cells, [k for _, k in names], nan)
        for (name, _), column in zip(names, values, strict=True):
            data[name] = [_hashable(v) for v in column]
    rec_metrics = [rec["metrics"] for rec in recs]
    if metrics is None:
        names = sorted((f"m.{k}", k) for k in set().union(*rec_metrics))
    else:
        names = sorted({(f"m.{k}", k) for k in metrics if any(k in m for m in rec_metrics)})
    values = _columns(rec_metrics, [k for _, k in names], nan)
    data.update(zip((name for name, _ in names), values, strict=True))
    data.update(_exercised_data(recs))
    if full:
        data.update(_budget_data(recs))
        data[UNJUDGED_COLUMN] = [_unjudged(rec) for rec in recs]
    df = pd.DataFrame(data)
    if not full:
        return df
    df = df.sort_values(["mode", "cell_id", "trial", "key"], kind="mergesort", na_position="last")
    return df.reset_index(drop=True)


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
    recs = _checked(records)
    if not recs:
        columns = [*BASE_COLUMNS, *X_COLUMNS, *B_COLUMNS, UNJUDGED_COLUMN]
        return pd.DataFrame([], columns=columns).reset_index(drop=True)
    return _frame(recs, None, full=True)


def exercised_records_frame(
    records: Iterable[Mapping[str, Any]], metrics: Sequence[str] = ()
) -> pd.DataFrame:
    """What ``exercised_counts_by`` reads of ``records_frame(records)``, for less work:
    ``mode``, ``cell_id``, the ``m.<metric>`` columns of ``metrics`` that some record has,
    and ``X_COLUMNS``, one row per record in the records' order (not sorted). Each column
    holds the values and dtype it has in ``records_frame``; the same records are refused."""
    recs = _checked(records)
    if not recs:
        return pd.DataFrame([], columns=["mode", "cell_id", *X_COLUMNS])
    return _frame(recs, list(metrics), full=False)





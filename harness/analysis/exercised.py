"""Whether a cell's trials exercised what a table measures: the summed counts of what
occurred (faults per class, aborts, compensations, irreversible calls, sends, or a
workload's own metric), the rule that turns them into "n/a (not exercised)", and the per-run
table of what every mode x cell exercised. Counts a record does not hold (older records) are
unknown, and an unknown count never makes a cell n/a."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from harness.analysis.records import (
    _REQUIRES_COUNT,
    EXERCISED_COUNTS,
    METRIC_REQUIREMENT,
    REQUIRES,
    is_requirement,
    normalize,
)

_K = TypeVar("_K")


def _sum_known(values: Iterable[Any]) -> int | None:
    """The sum of the known values, or None when no value is known."""
    known = [int(v) for v in (normalize(x) for x in values) if v is not None]
    return sum(known) if known else None


def exercised_counts(
    df: pd.DataFrame, index: Sequence[int] | None = None, requires: str | None = None
) -> dict[str, Any]:
    """Summed ``EXERCISED_COUNTS`` (None: unknown) over rows ``index`` of a records frame,
    plus ``faults_armed``: True when every one of those trials was set to inject faults; for
    a ``metric:NAME`` requirement, also the sum of that metric under the requirement's name."""
    rows = range(len(df)) if index is None else index
    return exercised_counts_by(df, {None: rows}, requires)[None]


def exercised_counts_by(
    df: pd.DataFrame, groups: Mapping[_K, Sequence[int]], requires: str | None = None
) -> dict[_K, dict[str, Any]]:
    """``exercised_counts(df, index, requires)`` for every ``key: index`` of ``groups`` (row
    positions of ``df``), each column read once for all groups, so a table's cells (or a
    run's mode x cell pairs) cost one pass over the frame, not one per cell."""
    keys = list(groups)
    sizes = np.fromiter((len(groups[k]) for k in keys), dtype=np.intp, count=len(keys))
    total = int(sizes.sum())
    rows = np.fromiter((int(i) for k in keys for i in groups[k]), dtype=np.intp, count=total)
    owner = np.repeat(np.arange(len(keys), dtype=np.intp), sizes)
    columns = [(name, f"x.{name}") for name in EXERCISED_COUNTS]
    if requires is not None and requires.startswith(METRIC_REQUIREMENT):
        columns.append((requires, f"m.{requires[len(METRIC_REQUIREMENT) :]}"))
    sums: dict[str, list[int | None]] = {}
    for name, col in columns:
        if col in df.columns:
            sums[name] = _group_sums(df[col], groups, keys, rows, owner)
        else:
            sums[name] = [None] * len(keys)
    armed = [False] * len(keys)
    if "x.faults_armed" in df.columns:
        flags = df["x.faults_armed"]
        values = flags.to_numpy()
        if values.dtype.kind == "b":
            is_true = values.astype(bool)
        else:
            is_true = np.array([normalize(a) is True for a in flags.tolist()], dtype=bool)
        n_true = np.bincount(owner, weights=is_true[rows], minlength=len(keys))
        pairs = zip(sizes.tolist(), n_true.tolist(), strict=True)
        armed = [bool(size > 0 and true == size) for size, true in pairs]
    out: dict[_K, dict[str, Any]] = {}
    for g, key in enumerate(keys):
        counts: dict[str, Any] = {name: sums[name][g] for name in EXERCISED_COUNTS}
        counts["faults_armed"] = armed[g]
        if len(columns) > len(EXERCISED_COUNTS):
            counts[columns[-1][0]] = sums[columns[-1][0]][g]
        out[key] = counts
    return out


def _group_sums(
    col: pd.Series,
    groups: Mapping[_K, Sequence[int]],
    keys: list[_K],
    rows: np.ndarray,
    owner: np.ndarray,
) -> list[int | None]:
    """``_sum_known`` of ``col`` over each group's rows (``rows``, owned by group ``owner``)."""
    values = col.to_numpy()
    kind = values.dtype.kind
    ints: np.ndarray | None = None
    known: np.ndarray | None = None
    if kind == "b":
        ints = values.astype(np.int64)
    elif kind == "i" and values.size:
        # int64 sums are exact unless a column of huge counts could overflow them.
        if max(abs(int(values.min())), abs(int(values.max()))) * values.size < 2**62:
            ints = values.astype(np.int64)
    elif kind == "f" and values.size:
        known = ~np.isnan(values)
        whole = np.trunc(np.where(known, values, 0.0))  # int(v) truncates toward zero
        # Exact as int64 only for finite values well inside float precision.
        if np.isfinite(whole).all() and float(np.abs(whole).max()) * values.size < 2**53:
            ints = whole.astype(np.int64)
    if ints is None:
        # Anything else (objects, strings, unsigned, huge values): Python's own reading.
        items = col.tolist()
        return [_sum_known([items[int(i)] for i in groups[k]]) for k in keys]
    n = len(keys)
    sums = np.zeros(n, dtype=np.int64)
    np.add.at(sums, owner, ints[rows])
    if known is None:
        n_known = np.bincount(owner, minlength=n)
    else:
        n_known = np.bincount(owner, weights=known[rows], minlength=n)
    return [int(s) if k else None for s, k in zip(sums.tolist(), n_known.tolist(), strict=True)]


def is_exercised(counts: Mapping[str, Any], requires: str | None = None) -> bool:
    """Did a cell's trials exercise what is measured? ``counts`` as from :func:`exercised_counts`.

    ``requires`` None (the default rule): a cell whose every trial was set to inject faults
    (nonzero rate, or bursty arrival) must have had at least one injected; a fault-free
    cell (rate 0, e.g. a calibration column) is a result as it is. "faults": at least one
    fault injected (so a rate-0 cell is n/a too); "F1".."F5": one of that class; "aborts",
    "compensations", "irreversible_calls", "sends": at least one occurred; "metric:NAME":
    the cell's trials summed metric NAME above 0 (``counts`` from ``exercised_counts`` with
    that requirement); "none": always a result. A count the records do not hold (older
    records) never makes a cell n/a.
    """
    if requires == "none":
        return True
    if requires is None:
        if not counts.get("faults_armed"):
            return True
        name = "faults_total"
    else:
        if not is_requirement(requires):
            raise ValueError(
                f"requires: unknown requirement {requires!r}; allowed: {', '.join(REQUIRES)}, "
                "or metric:NAME"
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
    counts_by = exercised_counts_by(df, positions)
    all_classes = [normalize(v) for v in df.get("x.fault_classes", pd.Series(dtype=object))]
    all_armed = [normalize(v) for v in df.get("x.faults_armed", pd.Series(dtype=object))]
    rows: list[dict[str, Any]] = []
    for m in modes:
        for c in cells:
            index = positions.get((m, c))
            if not index:
                continue
            counts = counts_by[(m, c)]
            classes = [all_classes[i] for i in index] if all_classes else []
            armed = [all_armed[i] for i in index] if all_armed else []
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

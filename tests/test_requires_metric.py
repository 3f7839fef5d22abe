"""A table may require a workload's own count (`requires: metric:NAME`): a cell whose trials
never made it (airline's certificates, which no pinned task sends) reads n/a, not 0."""

from __future__ import annotations

import pytest

from harness.analysis.records import records_frame
from harness.analysis.table import TableSpec, build_table


def _record(trial: int, sent: int, leaked: int) -> dict:
    return {"key": f"k{trial}", "mode": "tx-full", "cell": {"fp": 0.1}, "cell_id": "fp=0.1",
            "trial": trial, "metrics": {"leaked_certificates": leaked, "certificates_sent": sent}}


def test_a_cell_that_never_made_the_count_is_not_exercised() -> None:
    spec = TableSpec(name="t", metric="leaked_certificates", kind="mean", columns=("fp",),
                     requires="metric:certificates_sent")
    idle = build_table(records_frame([_record(i, 0, 0) for i in range(5)]), spec)
    assert list(idle.display.iloc[0]) == ["n/a (not exercised)"]
    assert "certificates_sent was 0 in every trial" in idle.footer
    used = build_table(records_frame([_record(i, 1 if i == 2 else 0, 0) for i in range(5)]), spec)
    assert list(used.display.iloc[0]) != ["n/a (not exercised)"]


def test_a_bad_metric_requirement_is_refused() -> None:
    with pytest.raises(ValueError, match="metric:NAME"):
        TableSpec(name="t", metric="m", kind="mean", requires="metric:")

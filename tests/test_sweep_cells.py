"""Sweeps over several keys: every swept key is a dimension of the cell.

Random multi-key sweeps of a small tau_retail config must give tables whose every cell holds
the trials of one setting, and must resume after an interruption at any point (also with
the keys named in another order) to exactly the records of an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.analysis.records import normalize, records_frame
from harness.analysis.show import replay
from harness.analysis.table import TableSpec, build_table
from harness.experiment.config import load_config
from harness.experiment.runner import read_records, run

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tau_retail.yaml"
BASE = {"trials": 3, "modes": ["tx-full", "no-tx"], "params.sample": 3}

# Keys a sweep may vary, each with the values it may take.
KEYS: dict[str, list[Any]] = {
    "faults.rate": [0.0, 0.05, 0.2, 0.5],
    "agent.max_steps": [10, 30],
    "params.task_seed": [0, 1],
}


@st.composite
def sweeps(draw: st.DrawFn) -> tuple[dict[str, list[Any]], int, bool]:
    keys = draw(st.permutations(list(KEYS)))[: draw(st.integers(2, 3))]
    grid = {
        k: draw(st.lists(st.sampled_from(KEYS[k]), min_size=2, max_size=2, unique=True))
        for k in keys
    }
    return grid, draw(st.integers(1, 2)), draw(st.booleans())


def _without_timings(path: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        rec.pop("timings", None)
        assert rec["key"] not in out, f"trial {rec['key']} recorded twice"
        out[rec["key"]] = rec
    return out


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sweep=sweeps())
def test_sweep_cells_never_pool_and_resume(tmp_path_factory: Any, sweep: Any) -> None:
    grid, limit, swap = sweep
    tmp = tmp_path_factory.mktemp("sweep")
    config = load_config(CONFIG, overrides=BASE, grid=grid)
    whole = run(config, out=tmp / "whole")
    records = read_records(whole.records_path)

    # Every swept key is in the record's cell, and cells of different settings have
    # different ids.
    ids: dict[str, tuple[Any, ...]] = {}
    for rec in records:
        setting = tuple(normalize(rec["cell"][config.labels.get(k, k)]) for k in grid)
        assert ids.setdefault(rec["cell_id"], setting) == setting

    # A table whose columns name only the first key never pools two settings in a cell.
    df = records_frame(records)
    first = config.labels.get(next(iter(grid)), next(iter(grid)))
    spec = TableSpec(name="clean", metric="clean", kind="proportion", columns=(first,))
    table = build_table(df, spec)
    assert len(table.data) == len({(r["mode"], r["cell_id"]) for r in records})
    for _, row in table.data.iterrows():
        fixed = {p: normalize(row[f"cell.{p}"]) for p in table.spec.columns}
        members = [
            r for r in records
            if r["mode"] == row["row"]
            and all(normalize(r["cell"].get(p)) == v for p, v in fixed.items())
        ]  # fmt: skip
        assert len({r["cell_id"] for r in members}) == 1
        assert row["n"] == len(members)

    # Interrupted after `limit` trials per cell, then resumed (the keys named in another
    # order when `swap`): the same records as the uninterrupted run, none twice.
    part = run(config, out=tmp / "part", limit=limit)
    again = dict(reversed(list(grid.items()))) if swap else grid
    resumed = load_config(CONFIG, overrides=BASE, grid=again)
    done = run(resumed, resume=part.run_dir)
    assert done.skipped == part.ran and done.ran + done.skipped == whole.total
    assert _without_timings(done.records_path) == _without_timings(whole.records_path)

    # `show` replays a recorded trial from the run's stored config.
    shown = replay(part.run_dir, read_records(done.records_path)[-1])
    assert shown.differences == []

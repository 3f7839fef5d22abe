"""What `atomix runs` says about each run: its bookkeeping, read from the manifest alone.

Standard library only (with `rundir` and `cells`), so that listing many runs stays fast: no
config is validated and no record is parsed; trials done are the lines of trials.jsonl
(a retry replaces a record in place, so a trial is one line).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness.errors import RunError
from harness.experiment.cells import expand_cells
from harness.experiment.rundir import MANIFEST, TRIALS, count_lines, read_manifest, settle_status


@dataclass(frozen=True)
class RunSummary:
    """One run's bookkeeping. `total` is the whole plan (every cell x trial x mode of the
    config), `planned` what the last session planned (fewer with --limit or --tasks), `done`
    the records written; `complete` holds only when every trial of the whole plan is done."""

    run_dir: Path
    config: str
    started_at: str
    status: str
    done: int
    planned: int
    total: int
    limit: int | None = None
    tasks: list[str] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, list[Any]] = field(default_factory=dict)
    revision: str | None = None
    wall_s: float | None = None
    retries: int = 0  # trials run again by --retry-failed, over all retry sessions

    @property
    def complete(self) -> bool:
        return self.status == "complete" and self.done >= self.total

    @property
    def shown_status(self) -> str:
        """The status, with `partial` for a finished session that ran only part of the plan."""
        if self.status == "complete" and self.done < self.total:
            return "partial"
        return self.status

    @property
    def subset(self) -> str:
        """Why only part of the plan ran: `limit 3`, `tasks 3,17`, or ""."""
        parts = []
        if self.limit is not None:
            parts.append(f"limit {self.limit}")
        if self.tasks:
            parts.append("tasks " + ",".join(self.tasks))
        return "; ".join(parts)



def whole_plan_size(config: Mapping[str, Any]) -> int:
    """Cells x trials x modes of a stored config (a cell's own `trials` caps its count, as
    the runner plans); for manifests written before they recorded `trials_total`."""
    trials = int(config.get("trials") or 0)
    grid = config.get("grid") if isinstance(config.get("grid"), dict) else {}
    cells = config.get("cells") if isinstance(config.get("cells"), list) else []
    labels = config.get("labels") if isinstance(config.get("labels"), dict) else {}
    expanded = expand_cells(SimpleNamespace(cells=cells, grid=grid, labels=labels))
    per_mode = sum(min(int(c.get("trials", trials)), trials) for c in expanded)
    return per_mode * len(config.get("modes") or [])


def _label(config: Mapping[str, Any], key: str) -> str:
    labels = config.get("labels")
    return str(labels.get(key, key)) if isinstance(labels, dict) else key


def summarise(run_dir: Path) -> RunSummary:
    """The run's summary; RunError for a damaged manifest."""
    manifest = read_manifest(run_dir)
    config = manifest["config"]
    status = settle_status(run_dir, manifest)
    planned = int(manifest.get("trials_planned") or 0)
    total = manifest.get("trials_total")
    if not isinstance(total, int):
        total = whole_plan_size(config) if manifest.get("limit") is not None else planned
    grid: dict[str, Any] = config["grid"] if isinstance(config.get("grid"), dict) else {}
    given = manifest.get("overrides")
    overrides: dict[str, Any] = given if isinstance(given, dict) else {}
    sessions = manifest.get("retries")
    retries: list[Any] = sessions if isinstance(sessions, list) else []
    wall = manifest.get("wall_s_last_session")
    revision = manifest.get("git_revision")
    return RunSummary(
        run_dir=run_dir,
        config=str(manifest.get("config_name") or run_dir.parent.name),
        started_at=str(manifest.get("started_at") or "?"),
        status=status,
        done=count_lines(run_dir / TRIALS),
        planned=planned,
        total=max(total, planned),
        limit=manifest.get("limit"),
        tasks=[str(t) for t in manifest.get("tasks") or []],
        overrides=dict(overrides),
        sweep={_label(config, k): list(v) if isinstance(v, list) else [v] for k, v in grid.items()},
        revision=str(revision)[:7] if revision else None,
        wall_s=float(wall) if isinstance(wall, int | float) else None,
        retries=sum(int(r.get("trials", 0)) for r in retries if isinstance(r, dict)),
    )


def list_summaries(results: Path) -> list[RunSummary]:
    """Every run under `results/<config>/<run-id>/`, oldest first; a damaged manifest is
    listed with status `damaged manifest` rather than hidden."""
    results = Path(results)
    if not results.is_dir():
        return []
    out = []
    for manifest_path in results.glob(f"*/*/{MANIFEST}"):
        run_dir = manifest_path.parent
        try:
            out.append(summarise(run_dir))
        except RunError:
            out.append(RunSummary(run_dir, run_dir.parent.name, "?", "damaged manifest", 0, 0, 0))
    return sorted(out, key=lambda r: (r.started_at, str(r.run_dir)))


def value_text(value: Any) -> str:
    """A config value as `--set` would spell it."""
    if isinstance(value, list):
        return ",".join(value_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)

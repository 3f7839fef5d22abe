"""`--tasks 3,17,42`: run only the trials that perform the given tasks.

A workload *has task ids* when its class offers `tasks(params)`, a list of task mappings
each with an `"id"`, and trial `t` of a cell performs task `tasks[t % len(tasks)]` (the
tau2 retail workload does; `tau_retail` with `split: base` has 114 tasks, so trials 0, 114
and 228 perform the first). Selecting tasks therefore selects trial indices; the trials
kept are planned exactly as in the full run (same keys, seeds and records), so a run made
with `--tasks` is a part of the full run, and resuming it without `--tasks` runs the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.errors import ConfigError

FLAG = "--tasks"


def parse_task_ids(text: str) -> list[str]:
    """`3,17,42` as ["3", "17", "42"]; ConfigError naming the flag for an empty item or a
    repeated id."""
    items = [v.strip() for v in text.split(",")]
    if not all(items):
        raise ConfigError(
            FLAG,
            [f"expected comma-separated task ids without empty items (e.g. 3,17,42), got {text!r}"],
        )
    repeated = sorted({i for i in items if items.count(i) > 1})
    if repeated:
        raise ConfigError(FLAG, [f"task id(s) listed twice: {', '.join(repeated)}"])
    return items


def workload_task_ids(workload: str, params: Any) -> list[str] | None:
    """The ids of the tasks a workload's trials cycle through, in trial order, or None for a
    workload without task ids."""
    from harness.workloads import WORKLOADS, get_workload

    if workload not in WORKLOADS:
        return None
    instance = get_workload(workload)
    tasks = getattr(instance, "tasks", None)
    if not callable(tasks):
        return None
    return [str(t["id"]) for t in tasks(dict(params))]


def compact_ids(ids: Sequence[str]) -> str:
    """Ids as short text: runs of consecutive integers as `a-b` (`0-4, 6-8, 10`)."""
    out: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run.clear()

    for item in ids:
        if item.isdigit() and run and int(item) == run[-1] + 1:
            run.append(int(item))
        elif item.isdigit():
            flush()
            run.append(int(item))
        else:
            flush()
            out.append(item)
    flush()
    return ", ".join(out)


def trials_for_tasks(ids: Sequence[str], task_ids: Sequence[str], count: int) -> list[int]:
    """The trial indices below `count` whose task (`task_ids[t % len(task_ids)]`) is in `ids`."""
    wanted = set(ids)
    return [t for t in range(count) if task_ids[t % len(task_ids)] in wanted]


def check_task_ids(workload: str, per_cell: Sequence[list[str] | None], ids: Sequence[str]) -> None:
    """Refuse `--tasks` for a workload without task ids, or ids no cell of the config has
    (naming the allowed ids); ConfigError whose path is the flag."""
    if any(cell is None for cell in per_cell):
        from harness.workloads import WORKLOADS

        having = [n for n in WORKLOADS.names() if _has_tasks(n)]
        raise ConfigError(
            FLAG,
            [
                f"workload {workload!r} has no task ids, so its trials cannot be selected by "
                f"task; {FLAG} works for: {', '.join(having) or 'none'} (use --limit N for a "
                "quick look)"
            ],
        )
    known = list(dict.fromkeys(i for cell in per_cell for i in cell or []))
    unknown = [i for i in ids if i not in known]
    if unknown:
        from harness.registry import did_you_mean

        raise ConfigError(
            FLAG,
            [
                f"unknown task id(s) {', '.join(unknown)}{did_you_mean(unknown[0], known)}; "
                f"this config's tasks are: {compact_ids(sorted(known, key=_id_order))}"
            ],
        )


def _has_tasks(name: str) -> bool:
    from harness.workloads import WORKLOADS

    try:
        return callable(getattr(WORKLOADS[name], "tasks", None))
    except Exception:  # noqa: BLE001 - a workload that cannot import has no tasks to offer
        return False


def check_config_tasks(config: Any, ids: Sequence[str]) -> None:
    """`check_task_ids` for every cell of an ExperimentConfig, before anything runs."""
    from harness.experiment.cells import expand_cells
    from harness.experiment.config import cell_config

    per_cell = []
    for cell in expand_cells(config):
        cfg = cell_config(config, cell)
        per_cell.append(workload_task_ids(cfg.workload, cfg.params))
    check_task_ids(config.workload, per_cell, ids)


def _id_order(task_id: str) -> tuple[int, int, str]:
    """Numeric ids in numeric order, before any other id."""
    return (0, int(task_id), "") if task_id.isdigit() else (1, 0, task_id)


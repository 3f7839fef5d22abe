"""tau2 retail tasks: split selection, gold actions and the goal DB they produce."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any, Literal

from harness.workloads.retail.cow import db_sha256
from harness.workloads.retail.data import RetailData, fresh_db
from harness.workloads.retail.tools import TOOLS, RetailToolError, call_tool

__all__ = ["GoalState", "goal_db", "gold_actions", "select_tasks"]


def gold_actions(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's gold actions as [{"name", "arguments"}] (empty when it has none)."""
    criteria = task.get("evaluation_criteria") or {}
    return [{"name": a["name"], "arguments": copy.deepcopy(a.get("arguments") or {})}
            for a in criteria.get("actions") or []]


def select_tasks(
    data: RetailData, split: str = "test", sample: int | Literal["all"] = 30, seed: int = 0
) -> list[dict[str, Any]]:
    """Tasks of `split` (ids from split_tasks.json), sampled without replacement with
    `random.Random(seed)` and returned in the split file's order, so a seed fixes the set."""
    if split not in data.split:
        raise ValueError(f"unknown split {split!r}; available: {sorted(data.split)}")
    ids = data.split[split]
    if sample != "all":
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
            raise ValueError(f"sample must be a non-negative int or 'all', got {sample!r}")
        if sample > len(ids):
            raise ValueError(f"sample {sample} exceeds split {split!r} of size {len(ids)}")
        chosen = set(random.Random(seed).sample(ids, sample))
        ids = [i for i in ids if i in chosen]
    by_id = {t["id"]: t for t in data.tasks}
    return [by_id[i] for i in ids]


@dataclass(frozen=True)
class GoalState:
    """The DB after a task's gold actions, replayed in order on a fresh DB with no faults.

    As tau2's `replay_golden_actions` does, every action is attempted and a failing one is a
    no-op (the retail tools change nothing when they refuse): reference trajectories contain
    deliberate failed look-ups, e.g. an item id tried as a product id. A failing read-only
    action leaves the goal state valid; a failing *write* means the author's end state was
    never reached, so `succeeded` is False and `failed_action`/`error` name the first such
    write. `failures` lists every failing action (reads too) as (index, "tool: message").
    `sha256` is db_sha256(db).
    """

    db: dict[str, Any]
    sha256: str
    succeeded: bool
    failed_action: int | None
    error: str | None
    failures: tuple[tuple[int, str], ...] = ()

    @property
    def all_actions_succeeded(self) -> bool:
        """True when not even a read-only gold action failed."""
        return not self.failures


def goal_db(data: RetailData, task: dict[str, Any]) -> GoalState:
    """Replay `task`'s gold actions on a fresh copy of the initial DB."""
    db = fresh_db(data)
    failures: list[tuple[int, str]] = []
    failed_write: tuple[int, str] | None = None
    for index, action in enumerate(gold_actions(task)):
        try:
            call_tool(db, action["name"], action["arguments"])
        except RetailToolError as exc:
            failures.append((index, f"{action['name']}: {exc}"))
            tool = TOOLS.get(action["name"])
            if failed_write is None and (tool is None or tool.writes):
                failed_write = failures[-1]
    return GoalState(
        db=db,
        sha256=db_sha256(db),
        succeeded=failed_write is None,
        failed_action=failed_write[0] if failed_write else None,
        error=failed_write[1] if failed_write else None,
        failures=tuple(failures),
    )

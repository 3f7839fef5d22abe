"""The tau2-bench retail domain: data, tools with scope metadata, tasks and goal states."""

from harness.workloads.retail.cow import db_sha256
from harness.workloads.retail.data import RetailData, RetailDataError, fresh_db, load_retail
from harness.workloads.retail.tasks import GoalState, goal_db, gold_actions, select_tasks
from harness.workloads.retail.tools import (
    TOOLS,
    RetailTool,
    RetailToolError,
    call_tool,
    order_key,
    records_for_scopes,
    restore,
    snapshot,
)

__all__ = [
    "TOOLS",
    "GoalState",
    "RetailData",
    "RetailDataError",
    "RetailTool",
    "RetailToolError",
    "call_tool",
    "db_sha256",
    "fresh_db",
    "goal_db",
    "gold_actions",
    "load_retail",
    "order_key",
    "records_for_scopes",
    "restore",
    "select_tasks",
    "snapshot",
]

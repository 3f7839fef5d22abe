"""The tau2-bench airline domain: data, tools with effect classes and scopes, tasks, and the
multi-agent booking stress workload."""

from harness.workloads.airline.calls import TOOLS, AirlineTool, call_tool
from harness.workloads.airline.data import AirlineData, AirlineDataError, fresh_db, load_airline
from harness.workloads.airline.tools import AirlineToolError

__all__ = [
    "TOOLS",
    "AirlineData",
    "AirlineDataError",
    "AirlineTool",
    "AirlineToolError",
    "call_tool",
    "fresh_db",
    "load_airline",
]

"""The LangGraph ToolNode that `AtomixToolNode` extends, checked at import to have the
bodies it wraps: an older langgraph would otherwise fail obscurely at the first tool call."""

from __future__ import annotations

import inspect
from importlib.metadata import version as _version

from langgraph.prebuilt.tool_node import ToolNode as LangGraphToolNode

__all__ = ["LangGraphToolNode"]


def _check_langgraph() -> None:
    """The node wraps ToolNode's sync and async bodies, `_func` / `_afunc(input, config,
    runtime)`, as langgraph 1.x has them."""
    for body in (LangGraphToolNode._func, LangGraphToolNode._afunc):
        params = list(inspect.signature(body).parameters)
        if params[:4] != ["self", "input", "config", "runtime"]:
            raise ImportError(
                "atomix.integrations.langgraph needs langgraph>=1.0 (ToolNode."
                f"{body.__name__}(input, config, runtime)); the installed "
                f"langgraph {_version('langgraph')} has {body.__name__}{tuple(params[1:])}"
            )


_check_langgraph()

"""A drop-in replacement for LangGraph's `ToolNode` whose tool calls run in Atomix transactions.

    node = AtomixToolNode([write_file, book_room, send_mail], rt)   # rt.tool shims
    model = model.bind_tools(node.tools)                             # schemas from atomix.schemas
    graph.add_node("tools", node)

`AtomixToolNode` is a `ToolNode` (same input shapes, outputs, `handle_tool_errors`,
`messages_key`, `wrap_tool_call`, sync and async invocation, parallel calls), so it works
wherever a ToolNode does, `create_react_agent(model, node, version="v1")` included. What it
adds is the transaction boundary:

- `boundary="turn"` (default): one node invocation, i.e. all tool calls of one AIMessage, is
  one transaction. It commits when every call succeeded. When a call fails (its ToolMessage
  has status "error") the whole turn aborts: staged writes are dropped, reversible effects
  are compensated, gated sends never leave; every ToolMessage of the turn then says so and
  has status "error", so the model knows nothing of the turn remains. `on_error="commit"`
  keeps the successful calls of a turn instead.
- `boundary="graph"`: one transaction per graph run, opened and settled by the caller:
  `with node.transaction(): graph.invoke(...)` (or `async with node.atransaction():` around
  `ainvoke`). Leaving the block commits it, an exception aborts it, `run.abort()` aborts it
  on purpose. With `on_error="abort"` a failed call aborts the run's transaction at once
  (the later calls of the run fail, saying so) and leaving the block raises
  TransactionAborted; with "commit" failed calls are only reported to the model.

Parallel calls: ToolNode runs a turn's calls concurrently (threads for sync tools, one task
each for async). The node hands each call its transaction explicitly through the call's
config and runs it with `tx.call(...)`, so every call joins the same transaction from any
thread; none can run outside it (atomix.OutsideTransaction).

Only `rt.tool` shims are accepted. A LangChain BaseTool, `@tool` object or plain function has
no declared effect class: run inside a turn, an effect of unknown class would execute eagerly
and could be neither dropped, compensated nor gated when the turn aborts. Shim the function
with `rt.tool(fn, effect=..., writes=..., compensate=...)`, or `rt.tool(fn)` if it only reads.
Arguments from the model are bound to the tool's signature (a missing or unknown argument is
an error message to the model); they are not type-checked against the schema.

`create_react_agent(..., version="v2")` sends each tool call to its own node run, so a turn
cannot span the calls of one AIMessage: under boundary "turn" that is an error naming the
way out (version="v1", or boundary="graph").

An exception that leaves the node (handle_tool_errors=False, an `interrupt()` in a tool)
undoes the turn before it propagates: under "turn" its transaction aborts, under "graph"
the turn is a savepoint of the run's transaction and is rolled back alone. LangGraph runs
the node again on resume, so its calls are made once, not twice. An interrupted run returns
from `invoke` with a "graph" transaction still open: resume it inside the same block.

It wraps ToolNode's sync and async bodies (`_func` / `_afunc`, langgraph 1.x; checked at
import) and changes nothing else of ToolNode.

Modules: `compat` checks the installed ToolNode, `tool` is the LangChain tool over a shim and
how a call finds its transaction, `run` is a graph run's transaction, `node` the ToolNode and
its boundary, and `messages` what the ToolMessages say once the transaction settled.
"""

from __future__ import annotations

from atomix.integrations.langgraph.node import AtomixToolNode, Boundary, OnError
from atomix.integrations.langgraph.node import TurnFailed as TurnFailed
from atomix.integrations.langgraph.run import GraphTransaction
from atomix.integrations.langgraph.tool import AtomixTool

__all__ = [
    "AtomixTool",
    "AtomixToolNode",
    "Boundary",
    "GraphTransaction",
    "OnError",
    "ToolNode",
]

#: So that `from atomix.integrations.langgraph import ToolNode` is the drop-in replacement.
ToolNode = AtomixToolNode

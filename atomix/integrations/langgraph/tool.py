"""`AtomixTool`, the LangChain tool over one `rt.tool` shim, and how a call finds the
transaction its node hands it (through the call's config, so that any thread can join it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field

from atomix.errors import AtomixError
from atomix.handles import ATx, Tx, current_transaction
from atomix.schemas import tool_schema
from atomix.tools import Ack, ToolSpec

# Where a call finds its transaction: in the config ToolNode hands to each tool.invoke. The
# "__" prefix keeps it out of run metadata (LangChain copies only plain configurable values).
_TX_KEY = "__atomix_transaction"


class AtomixTool(BaseTool):
    """A LangChain tool over one `rt.tool` shim: its name, description and JSON schema come
    from `atomix.schemas.tool_schema`, so `model.bind_tools([...])` offers exactly what the shim
    accepts. Called by an AtomixToolNode it runs in the node's transaction (whatever thread it
    runs on); called on its own it is the plain shim (it joins the caller's transaction, or
    runs in one of its own). A staged or queued call returns a message saying so, with the
    Ack as a plain dict in the ToolMessage's artifact."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    args_schema: dict[str, Any]
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    shim: Callable[..., Any] = Field(exclude=True, repr=False)
    spec: ToolSpec = Field(exclude=True, repr=False)

    @classmethod
    def from_shim(cls, shim: Callable[..., Any]) -> AtomixTool:
        """The tool of an `rt.tool` shim (TypeError for anything else, saying what to do)."""
        spec = getattr(shim, "spec", None)
        if not isinstance(spec, ToolSpec):
            raise TypeError(not_a_shim(shim))
        schema = tool_schema(spec)
        return cls(
            name=schema.name,
            description=schema.description or schema.name,
            args_schema=schema.parameters,
            shim=shim,
            spec=spec,
        )

    def _run(self, _atomix_config: RunnableConfig, **kwargs: Any) -> tuple[Any, Any]:
        tx = transaction_of(_atomix_config)
        if tx is None:
            if self.spec.is_async:
                raise AtomixError(
                    f"tool {self.name!r} is async: invoke the graph with ainvoke/astream"
                )
            return _content(self.shim(**kwargs))
        if isinstance(tx, ATx):
            # Only a sync wrap_tool_call under ainvoke gets here, on the event loop's thread,
            # inside the turn's task: the shim joins the transaction from its context.
            if current_transaction() is not tx or self.spec.is_async:
                raise AtomixError(
                    f"tool {self.name!r}: a synchronous call inside the async transaction "
                    f"{tx.txid}; give the node an awrap_tool_call, or invoke the graph "
                    "synchronously"
                )
            return _content(self.shim(**kwargs))
        if self.spec.is_async:
            raise AtomixError(
                f"tool {self.name!r} is async: invoke the graph with ainvoke/astream "
                "(inside `async with node.atransaction():` for boundary 'graph')"
            )
        return _content(tx.call(self.spec, **kwargs))

    async def _arun(self, _atomix_config: RunnableConfig, **kwargs: Any) -> tuple[Any, Any]:
        tx = transaction_of(_atomix_config)
        if tx is None:
            if self.spec.is_async:
                return _content(await self.shim(**kwargs))
            # to_thread copies this context: the shim joins the caller's transaction, if any.
            return _content(await asyncio.to_thread(self.shim, **kwargs))
        if isinstance(tx, ATx):
            # Waits without blocking the loop; a sync tool's function runs in a worker thread.
            return _content(await tx.call(self.spec, **kwargs))
        if self.spec.is_async:
            raise AtomixError(
                f"tool {self.name!r} is async and the graph run's transaction {tx.txid} is "
                "synchronous: open it with `async with node.atransaction():`"
            )
        return _content(await asyncio.to_thread(tx.call, self.spec, **kwargs))


def _content(result: Any) -> tuple[Any, Any]:
    """What a ToolMessage carries: the result; for a deferred call, what will become of it."""
    if isinstance(result, Ack):
        when = (
            "takes effect when the transaction commits"
            if result.status == "staged"
            else "is held at the gate and leaves only when the transaction commits"
        )
        artifact = {"status": result.status, "tool": result.tool, "key": result.key}
        return f"{result.status}: {result.tool} {when}", artifact
    return result, None


def not_a_shim(tool: Any) -> str:
    """Why `tool` is refused, and how to declare it instead."""
    name = getattr(tool, "name", None) or getattr(tool, "__name__", None) or repr(tool)
    what = "a LangChain tool" if isinstance(tool, BaseTool) else type(tool).__name__
    fn = "tool.func" if isinstance(tool, BaseTool) else "fn"
    return (
        f"AtomixToolNode: tool {name!r} is {what}, not an rt.tool shim. Its effect is unknown, "
        "so an aborted turn could neither drop, compensate nor gate it. Declare it: "
        f"rt.tool({fn}, effect='bufferable'|'reversible'|'irreversible', writes=..., "
        f"compensate=...), or rt.tool({fn}) if it only reads"
    )


def transaction_of(config: RunnableConfig | None) -> Tx | ATx | None:
    """The transaction a node handed this call in its config, if any."""
    if not config:
        return None
    tx = (config.get("configurable") or {}).get(_TX_KEY)
    return tx if isinstance(tx, Tx | ATx) else None


def with_transaction(config: RunnableConfig, tx: Tx | ATx) -> RunnableConfig:
    """`config` handing every tool call made with it the transaction `tx`."""
    configurable = {**(config.get("configurable") or {}), _TX_KEY: tx}
    return {**config, "configurable": configurable}

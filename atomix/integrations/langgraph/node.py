"""`AtomixToolNode`: LangGraph's ToolNode with the transaction boundary around its calls -
one transaction per node run ("turn") or per graph run ("graph") - and what a failure undoes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import AsyncToolCallWrapper, ToolCallWrapper
from langgraph.runtime import Runtime as GraphRuntime

from atomix.effects import AbortSource
from atomix.errors import AtomixError, TransactionAborted
from atomix.handles import ATx, Tx, current_transaction
from atomix.integrations.langgraph.compat import LangGraphToolNode
from atomix.integrations.langgraph.messages import (
    failures,
    say_aborted,
    say_settled,
    stamp,
    tool_messages,
    why_failed,
)
from atomix.integrations.langgraph.run import GraphTransaction, aopen_run, current_run, open_run
from atomix.integrations.langgraph.tool import AtomixTool, not_a_shim, with_transaction
from atomix.runtime import Runtime
from atomix.savepoints import ASavepoint, Savepoint
from atomix.tools import ToolSpec

Boundary = Literal["turn", "graph"]
OnError = Literal["abort", "commit"]


class AtomixToolNode(LangGraphToolNode):
    """A LangGraph ToolNode whose tool calls settle in Atomix transactions.

    Guarantees: every call of one node invocation (boundary "turn") or of one graph run
    (boundary "graph") joins one transaction, parallel calls included, so their effects settle
    together: all of a committed turn's effects land once (by idempotency key); nothing of an
    aborted one remains (writes dropped, reversible effects compensated, gated sends never
    sent; a compensation that fails is residue on the settlement). Each ToolMessage says what
    became of its call and carries `response_metadata["atomix"]` (txid, outcome).
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]],
        runtime: Runtime,
        *,
        boundary: Boundary = "turn",
        on_error: OnError = "abort",
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: bool
        | str
        | Callable[..., str]
        | type[Exception]
        | tuple[type[Exception], ...] = True,
        messages_key: str = "messages",
        wrap_tool_call: ToolCallWrapper | None = None,
        awrap_tool_call: AsyncToolCallWrapper | None = None,
    ) -> None:
        if not isinstance(runtime, Runtime):
            raise TypeError(
                f"AtomixToolNode: runtime must be an atomix.Runtime, not {type(runtime).__name__}"
            )
        if boundary not in ("turn", "graph"):
            raise ValueError(f"AtomixToolNode: boundary {boundary!r}; allowed: 'turn', 'graph'")
        if on_error not in ("abort", "commit"):
            raise ValueError(f"AtomixToolNode: on_error {on_error!r}; allowed: 'abort', 'commit'")
        wrapped = [self._wrap(tool, runtime) for tool in tools]
        names = [t.name for t in wrapped]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"AtomixToolNode: tool names {twice} are given more than once")
        super().__init__(
            wrapped,
            name=name,
            tags=tags,
            handle_tool_errors=handle_tool_errors,
            messages_key=messages_key,
            wrap_tool_call=wrap_tool_call,
            awrap_tool_call=awrap_tool_call,
        )
        self.runtime = runtime
        self.boundary: Boundary = boundary
        self.on_error: OnError = on_error

    @staticmethod
    def _wrap(tool: Any, runtime: Runtime) -> AtomixTool:
        if isinstance(tool, AtomixTool):
            tool = tool.shim
        spec = getattr(tool, "spec", None)
        if not isinstance(spec, ToolSpec):
            raise TypeError(not_a_shim(tool))
        if spec.name not in runtime.coordinator.tools:
            raise ValueError(
                f"AtomixToolNode: tool {spec.name!r} was made by another Runtime's rt.tool; "
                "make it with the runtime given to this node"
            )
        return AtomixTool.from_shim(tool)

    @property
    def tools(self) -> list[BaseTool]:
        """The node's tools as LangChain tools, for `model.bind_tools(node.tools)`."""
        return list(self.tools_by_name.values())

    # -- the caller's transaction (boundary "graph") --------------------------------------
    @contextmanager
    def transaction(self, *, trace: str | None = None) -> Iterator[GraphTransaction]:
        """One transaction around a synchronous graph run (`graph.invoke`, `graph.stream`)."""
        self._open_check("with node.transaction()")
        with open_run(self.runtime, trace=trace) as run:
            yield run

    @asynccontextmanager
    async def atransaction(self, *, trace: str | None = None) -> AsyncIterator[GraphTransaction]:
        """One transaction around an async graph run (`graph.ainvoke`, `graph.astream`)."""
        self._open_check("async with node.atransaction()")
        async with aopen_run(self.runtime, trace=trace) as run:
            yield run

    def _open_check(self, what: str) -> None:
        if self.boundary != "graph":
            raise AtomixError(
                f"`{what}` is for boundary='graph'; this node's boundary is 'turn' (each node "
                "run is a transaction of its own)"
            )
        outer = current_transaction()
        if outer is not None:
            raise AtomixError(
                f"`{what}` opens the graph run's transaction and cannot be nested in the open "
                f"transaction {outer.txid}"
            )

    def _current_run(self, *, sync: bool) -> GraphTransaction:
        run = current_run()
        if run is None or run.runtime is not self.runtime:
            opener = "with node.transaction():" if sync else "async with node.atransaction():"
            raise AtomixError(
                f"AtomixToolNode {self.name!r} has boundary='graph': run the graph inside "
                f"`{opener}` (of this node or another node on the same runtime)"
            )
        if sync and isinstance(run.tx, ATx):
            raise AtomixError(
                "a synchronous graph run (invoke/stream) inside `async with node.atransaction()`: "
                "use ainvoke/astream, or `with node.transaction():`"
            )
        return run

    # -- one node run ----------------------------------------------------------------------
    def _check_input(self, input: Any) -> None:
        if (
            self.boundary == "turn"
            and isinstance(input, dict)
            and input.get("__type") == "tool_call_with_context"
        ):
            raise AtomixError(
                "AtomixToolNode got one tool call sent on its own (Send, as "
                "create_react_agent(version='v2') does), so its turn cannot span the other "
                "calls of the same AIMessage: use create_react_agent(..., version='v1'), or "
                "boundary='graph'"
            )

    def _func(self, input: Any, config: RunnableConfig, runtime: GraphRuntime) -> Any:
        self._check_input(input)
        if self.boundary == "graph":
            return self._graph_func(input, config, runtime)
        # Inside an open transaction of this runtime the turn is a savepoint of it; the calls
        # then join that transaction, so it is the one handed to them.
        turn: Tx | Savepoint = self.runtime.transaction()
        handle = turn.outer if isinstance(turn, Savepoint) else turn
        nested = isinstance(turn, Savepoint)
        out: Any = None
        failed: list[ToolMessage] = []
        try:
            with turn:
                out = super()._func(input, with_transaction(config, handle), runtime)
                failed = failures(out, self._messages_key)
                if failed and self.on_error == "abort":
                    raise TurnFailed(failed)
        except TurnFailed as exc:
            return self._report_turn(out, handle, nested, failed, exc.detail)
        except TransactionAborted as exc:
            # Only the commit's own abort (a stale read, a time-out) is the turn's outcome; one
            # raised by a call (handle_tool_errors=False) propagates, as ToolNode's would.
            if out is None or exc.txid != handle.txid:
                raise
            return self._report_turn(out, handle, nested, failed, exc.detail or exc.source)
        return self._report_turn(out, handle, nested, failed, None)

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: GraphRuntime) -> Any:
        self._check_input(input)
        if self.boundary == "graph":
            return await self._graph_afunc(input, config, runtime)
        turn: ATx | ASavepoint = self.runtime.atransaction()
        handle = turn.outer if isinstance(turn, ASavepoint) else turn
        nested = isinstance(turn, ASavepoint)
        out: Any = None
        failed: list[ToolMessage] = []
        try:
            async with turn:
                out = await super()._afunc(input, with_transaction(config, handle), runtime)
                failed = failures(out, self._messages_key)
                if failed and self.on_error == "abort":
                    raise TurnFailed(failed)
        except TurnFailed as exc:
            return self._report_turn(out, handle, nested, failed, exc.detail)
        except TransactionAborted as exc:
            # Only the commit's own abort (a stale read, a time-out) is the turn's outcome; one
            # raised by a call (handle_tool_errors=False) propagates, as ToolNode's would.
            if out is None or exc.txid != handle.txid:
                raise
            return self._report_turn(out, handle, nested, failed, exc.detail or exc.source)
        return self._report_turn(out, handle, nested, failed, None)

    def _graph_func(self, input: Any, config: RunnableConfig, runtime: GraphRuntime) -> Any:
        """A node run under boundary "graph": a savepoint of the run's transaction."""
        run = self._current_run(sync=True)
        tx = run.tx
        assert isinstance(tx, Tx)  # _current_run(sync=True) refuses an async run
        with _turn_savepoint(tx):
            out = super()._func(input, with_transaction(config, tx), runtime)
        failed = failures(out, self._messages_key)
        if failed and self.on_error == "abort" and tx.settlement is None:
            tx.abort(AbortSource.TOOL_FAILURE, why_failed(failed))
        return self._report_graph(out, run, failed)

    async def _graph_afunc(self, input: Any, config: RunnableConfig, runtime: GraphRuntime) -> Any:
        """`_graph_func` under ainvoke: the run's transaction may be async or synchronous."""
        run = self._current_run(sync=False)
        tx = run.tx
        if isinstance(tx, ATx):
            async with _aturn_savepoint(tx):
                out = await super()._afunc(input, with_transaction(config, tx), runtime)
        else:
            mark = _turn_savepoint(tx)
            mark.__enter__()
            try:
                out = await super()._afunc(input, with_transaction(config, tx), runtime)
            except BaseException as exc:
                # A rollback may compensate, which blocks: not on the loop's thread.
                await asyncio.to_thread(mark.__exit__, type(exc), exc, exc.__traceback__)
                raise
        failed = failures(out, self._messages_key)
        if failed and self.on_error == "abort" and tx.settlement is None:
            if isinstance(tx, ATx):
                await tx.abort(AbortSource.TOOL_FAILURE, why_failed(failed))
            else:  # compensations may block: not on the loop's thread
                await asyncio.to_thread(tx.abort, AbortSource.TOOL_FAILURE, why_failed(failed))
        return self._report_graph(out, run, failed)

    # -- what the messages say -------------------------------------------------------------
    def _report_turn(
        self,
        out: Any,
        handle: Tx | ATx,
        nested: bool,
        failed: list[ToolMessage],
        aborted: str | None,
    ) -> Any:
        if aborted is None:
            outcome = "open" if nested else "committed"
            for msg in tool_messages(out, self._messages_key):
                if not nested:
                    say_settled(msg, handle.txid)
                stamp(msg, handle.txid, outcome, self.boundary)
            return out
        what = (
            f"this turn was rolled back inside transaction {handle.txid}"
            if nested
            else f"the transaction of this turn ({handle.txid}) aborted"
        )
        say_aborted(out, self._messages_key, self.tools_by_name, failed, what, aborted)
        for msg in tool_messages(out, self._messages_key):
            stamp(msg, handle.txid, "rolled_back" if nested else "aborted", self.boundary)
        return out

    def _report_graph(self, out: Any, run: GraphTransaction, failed: list[ToolMessage]) -> Any:
        done = run.tx.settlement
        if done is not None and not done.committed:
            what = f"the transaction of this graph run ({run.txid}) aborted"
            why = done.detail or done.abort_source
            say_aborted(out, self._messages_key, self.tools_by_name, failed, what, why)
            outcome = "aborted"
        else:
            outcome = "open"
        for msg in tool_messages(out, self._messages_key):
            stamp(msg, run.txid, outcome, self.boundary)
        return out


def _turn_savepoint(tx: Tx) -> AbstractContextManager[Any]:
    """A turn of a graph run is a savepoint of the run's transaction: an exception leaving the
    node (an interrupt, an unhandled tool error) undoes this turn's calls only, so that the
    node, run again on resume, does not do them twice. (None once the run has aborted: its
    calls then fail, saying so.)"""
    return nullcontext() if tx.settlement is not None else Savepoint(tx)


def _aturn_savepoint(tx: ATx) -> AbstractAsyncContextManager[Any]:
    return nullcontext() if tx.settlement is not None else ASavepoint(tx)


class TurnFailed(AtomixError):
    """Raised inside a turn's block to abort it (source tool_failure) when a call failed.

    Guarantees: leaving a turn's block with it aborts the turn's transaction (or rolls back
    its savepoint) with `abort_source` tool_failure and the failed calls as the detail.
    """

    abort_source = AbortSource.TOOL_FAILURE

    def __init__(self, failed: list[ToolMessage]) -> None:
        self.detail = why_failed(failed)
        super().__init__(self.detail)

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
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from importlib.metadata import version as _version
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import AsyncToolCallWrapper, ToolCallWrapper
from langgraph.prebuilt.tool_node import ToolNode as LangGraphToolNode
from langgraph.runtime import Runtime as GraphRuntime
from langgraph.types import Command
from pydantic import ConfigDict, Field

from atomix.decisions import Settlement
from atomix.effects import AbortSource, EffectClass
from atomix.errors import AtomixError, TransactionAborted
from atomix.runtime import ASavepoint, ATx, Runtime, Savepoint, Tx, current_transaction
from atomix.schemas import tool_schema
from atomix.tools import Ack, ToolSpec

__all__ = [
    "AtomixTool",
    "AtomixToolNode",
    "Boundary",
    "GraphTransaction",
    "OnError",
    "ToolNode",
]


def _check_langgraph() -> None:
    """The node wraps ToolNode's sync and async bodies, `_func` / `_afunc(input, config,
    runtime)`, as langgraph 1.x has them; an older langgraph would fail obscurely later."""
    for body in (LangGraphToolNode._func, LangGraphToolNode._afunc):
        params = list(inspect.signature(body).parameters)
        if params[:4] != ["self", "input", "config", "runtime"]:
            raise ImportError(
                "atomix.integrations.langgraph needs langgraph>=1.0 (ToolNode."
                f"{body.__name__}(input, config, runtime)); the installed "
                f"langgraph {_version('langgraph')} has {body.__name__}{tuple(params[1:])}"
            )


_check_langgraph()

Boundary = Literal["turn", "graph"]
OnError = Literal["abort", "commit"]

# Where a call finds its transaction: in the config ToolNode hands to each tool.invoke. The
# "__" prefix keeps it out of run metadata (LangChain copies only plain configurable values).
_TX_KEY = "__atomix_transaction"


# ------------------------------------------------------------------------------- the tools
class AtomixTool(BaseTool):
    """A LangChain tool over one `rt.tool` shim: its name, description and JSON schema come
    from `atomix.schemas.tool_schema`, so `model.bind_tools([...])` offers exactly what the shim
    accepts. Called by an AtomixToolNode it runs in the node's transaction (whatever thread it
    runs on); called on its own it is the plain shim (it joins the caller's transaction, or
    runs in one of its own). A staged or queued call returns a message saying so, with the
    Ack as a plain dict in the ToolMessage's artifact."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    args_schema: dict[str, Any]  # type: ignore[assignment]
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    shim: Callable[..., Any] = Field(exclude=True, repr=False)
    spec: ToolSpec = Field(exclude=True, repr=False)

    @classmethod
    def from_shim(cls, shim: Callable[..., Any]) -> AtomixTool:
        """The tool of an `rt.tool` shim (TypeError for anything else, saying what to do)."""
        spec = getattr(shim, "spec", None)
        if not isinstance(spec, ToolSpec):
            raise TypeError(_not_a_shim(shim))
        schema = tool_schema(spec)
        return cls(
            name=schema.name,
            description=schema.description or schema.name,
            args_schema=schema.parameters,
            shim=shim,
            spec=spec,
        )

    def _run(self, _atomix_config: RunnableConfig, **kwargs: Any) -> tuple[Any, Any]:
        tx = _transaction_of(_atomix_config)
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
        tx = _transaction_of(_atomix_config)
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


def _not_a_shim(tool: Any) -> str:
    name = getattr(tool, "name", None) or getattr(tool, "__name__", None) or repr(tool)
    what = "a LangChain tool" if isinstance(tool, BaseTool) else type(tool).__name__
    fn = "tool.func" if isinstance(tool, BaseTool) else "fn"
    return (
        f"AtomixToolNode: tool {name!r} is {what}, not an rt.tool shim. Its effect is unknown, "
        "so an aborted turn could neither drop, compensate nor gate it. Declare it: "
        f"rt.tool({fn}, effect='bufferable'|'reversible'|'irreversible', writes=..., "
        f"compensate=...), or rt.tool({fn}) if it only reads"
    )


def _transaction_of(config: RunnableConfig | None) -> Tx | ATx | None:
    if not config:
        return None
    return (config.get("configurable") or {}).get(_TX_KEY)


def _with_transaction(config: RunnableConfig, tx: Tx | ATx) -> RunnableConfig:
    configurable = {**(config.get("configurable") or {}), _TX_KEY: tx}
    return {**config, "configurable": configurable}  # type: ignore[typeddict-item]


# ------------------------------------------------------------------------ the graph's run
_graph_run: contextvars.ContextVar[GraphTransaction | None] = contextvars.ContextVar(
    "atomix_langgraph_run", default=None
)


class GraphTransaction:
    """The one transaction of a graph run under boundary "graph", as `node.transaction()` (or
    `node.atransaction()`) yields it. Every tool call the node makes during the block joins
    it. Leaving the block commits it (a clean exit) or aborts it (an exception). If a failed
    call aborted it during the run (on_error="abort"), or the runtime did (a stale read, a
    time-out), leaving the block cleanly raises TransactionAborted: a run that lost its
    effects never looks committed. `abort()` / `aabort()` abort it on purpose; then a clean
    exit raises nothing."""

    def __init__(self, runtime: Runtime, tx: Tx | ATx) -> None:
        self.runtime = runtime
        self.tx = tx
        self._by_caller = False

    @property
    def txid(self) -> int:
        return self.tx.txid

    @property
    def settlement(self) -> Settlement | None:
        """What became of the run's effects, once it has settled."""
        return self.tx.settlement

    def abort(self, detail: str = "aborted by the caller") -> Settlement:
        """Abort the run's transaction (a synchronous one, from `node.transaction()`)."""
        if not isinstance(self.tx, Tx):
            raise AtomixError("this graph run's transaction is async: use `await run.aabort()`")
        self._by_caller = True
        return self.tx.abort(AbortSource.PRE_COMMIT_VETO, detail)

    async def aabort(self, detail: str = "aborted by the caller") -> Settlement:
        """Abort the run's transaction (an async one, from `node.atransaction()`)."""
        if not isinstance(self.tx, ATx):
            raise AtomixError("this graph run's transaction is synchronous: use `run.abort()`")
        self._by_caller = True
        return await self.tx.abort(AbortSource.PRE_COMMIT_VETO, detail)

    def _raise_if_lost(self) -> None:
        done = self.tx.settlement
        if done is not None and not done.committed and not self._by_caller:
            raise TransactionAborted(self.txid, done.abort_source or "aborted", done.detail, done)


# ------------------------------------------------------------------------------- the node
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
            raise TypeError(_not_a_shim(tool))
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
        tx = self.runtime.transaction(trace=trace)
        run = GraphTransaction(self.runtime, tx)
        token = _graph_run.set(run)
        try:
            with tx:
                yield run
        finally:
            _graph_run.reset(token)
        run._raise_if_lost()

    @asynccontextmanager
    async def atransaction(self, *, trace: str | None = None) -> AsyncIterator[GraphTransaction]:
        """One transaction around an async graph run (`graph.ainvoke`, `graph.astream`)."""
        self._open_check("async with node.atransaction()")
        tx = self.runtime.atransaction(trace=trace)
        run = GraphTransaction(self.runtime, tx)
        token = _graph_run.set(run)
        try:
            async with tx:
                yield run
        finally:
            _graph_run.reset(token)
        run._raise_if_lost()

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
        run = _graph_run.get()
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
            run = self._current_run(sync=True)
            tx = run.tx
            assert isinstance(tx, Tx)
            with _turn_savepoint(tx):
                out = super()._func(input, _with_transaction(config, tx), runtime)
            failed = _failures(out, self._messages_key)
            if failed and self.on_error == "abort" and tx.settlement is None:
                tx.abort(AbortSource.TOOL_FAILURE, _why(failed))
            return self._report_graph(out, run, failed)
        turn: Tx | Savepoint | None = None
        handle: Tx | None = None
        out: Any = None
        failed: list[ToolMessage] = []
        try:
            with self.runtime.transaction() as turn:
                handle = turn.outer if isinstance(turn, Savepoint) else turn
                out = super()._func(input, _with_transaction(config, handle), runtime)
                failed = _failures(out, self._messages_key)
                if failed and self.on_error == "abort":
                    raise TurnFailed(failed)
        except TurnFailed as exc:
            return self._report_turn(out, handle, turn, failed, exc.detail)
        except TransactionAborted as exc:
            # Only the commit's own abort (a stale read, a time-out) is the turn's outcome; one
            # raised by a call (handle_tool_errors=False) propagates, as ToolNode's would.
            if out is None or handle is None or exc.txid != handle.txid:
                raise
            return self._report_turn(out, handle, turn, failed, exc.detail or exc.source)
        return self._report_turn(out, handle, turn, failed, None)

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: GraphRuntime) -> Any:
        self._check_input(input)
        if self.boundary == "graph":
            run = self._current_run(sync=False)
            tx = run.tx
            if isinstance(tx, ATx):
                async with _aturn_savepoint(tx):
                    out = await super()._afunc(input, _with_transaction(config, tx), runtime)
            else:
                mark = _turn_savepoint(tx)
                mark.__enter__()
                try:
                    out = await super()._afunc(input, _with_transaction(config, tx), runtime)
                except BaseException as exc:
                    # A rollback may compensate, which blocks: not on the loop's thread.
                    await asyncio.to_thread(mark.__exit__, type(exc), exc, exc.__traceback__)
                    raise
            failed = _failures(out, self._messages_key)
            if failed and self.on_error == "abort" and tx.settlement is None:
                if isinstance(tx, ATx):
                    await tx.abort(AbortSource.TOOL_FAILURE, _why(failed))
                else:  # compensations may block: not on the loop's thread
                    await asyncio.to_thread(tx.abort, AbortSource.TOOL_FAILURE, _why(failed))
            return self._report_graph(out, run, failed)
        turn: ATx | Savepoint | None = None
        handle: ATx | None = None
        out: Any = None
        failed: list[ToolMessage] = []
        try:
            async with self.runtime.atransaction() as turn:
                handle = turn.outer if isinstance(turn, Savepoint) else turn
                out = await super()._afunc(input, _with_transaction(config, handle), runtime)
                failed = _failures(out, self._messages_key)
                if failed and self.on_error == "abort":
                    raise TurnFailed(failed)
        except TurnFailed as exc:
            return self._report_turn(out, handle, turn, failed, exc.detail)
        except TransactionAborted as exc:
            # Only the commit's own abort (a stale read, a time-out) is the turn's outcome; one
            # raised by a call (handle_tool_errors=False) propagates, as ToolNode's would.
            if out is None or handle is None or exc.txid != handle.txid:
                raise
            return self._report_turn(out, handle, turn, failed, exc.detail or exc.source)
        return self._report_turn(out, handle, turn, failed, None)

    # -- what the messages say -------------------------------------------------------------
    def _report_turn(
        self,
        out: Any,
        handle: Tx | ATx,
        turn: Any,
        failed: list[ToolMessage],
        aborted: str | None,
    ) -> Any:
        nested = isinstance(turn, Savepoint)
        if aborted is None:
            outcome = "open" if nested else "committed"
            for msg in _tool_messages(out, self._messages_key):
                if not nested:
                    _say_settled(msg, handle.txid)
                _stamp(msg, handle.txid, outcome, self.boundary)
            return out
        what = (
            f"this turn was rolled back inside transaction {handle.txid}"
            if nested
            else f"the transaction of this turn ({handle.txid}) aborted"
        )
        _say_aborted(out, self._messages_key, self.tools_by_name, failed, what, aborted)
        for msg in _tool_messages(out, self._messages_key):
            _stamp(msg, handle.txid, "rolled_back" if nested else "aborted", self.boundary)
        return out

    def _report_graph(self, out: Any, run: GraphTransaction, failed: list[ToolMessage]) -> Any:
        done = run.tx.settlement
        if done is not None and not done.committed:
            what = f"the transaction of this graph run ({run.txid}) aborted"
            why = done.detail or done.abort_source
            _say_aborted(out, self._messages_key, self.tools_by_name, failed, what, why)
            outcome = "aborted"
        else:
            outcome = "open"
        for msg in _tool_messages(out, self._messages_key):
            _stamp(msg, run.txid, outcome, self.boundary)
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
    """Raised inside a turn's block to abort it (source tool_failure) when a call failed."""

    abort_source = AbortSource.TOOL_FAILURE

    def __init__(self, failed: list[ToolMessage]) -> None:
        self.detail = _why(failed)
        super().__init__(self.detail)


def _why(failed: list[ToolMessage]) -> str:
    calls = ", ".join(f"{m.tool_call_id!r} ({m.name})" for m in failed)
    return f"tool call(s) {calls} failed"


def _tool_messages(out: Any, key: str) -> Iterator[ToolMessage]:
    """Every ToolMessage in a ToolNode output, whatever its shape (a list, {key: [...]}, a list
    mixing Commands with those)."""
    if isinstance(out, ToolMessage):
        yield out
    elif isinstance(out, list | tuple):
        for item in out:
            yield from _tool_messages(item, key)
    elif isinstance(out, dict):
        yield from _tool_messages(out.get(key, ()), key)
    elif isinstance(out, Command) and out.update is not None:
        yield from _tool_messages(out.update, key)


def _failures(out: Any, key: str) -> list[ToolMessage]:
    return [m for m in _tool_messages(out, key) if m.status == "error"]


def _stamp(msg: ToolMessage, txid: int, outcome: str, boundary: str) -> None:
    msg.response_metadata = {
        **(msg.response_metadata or {}),
        "atomix": {"txid": txid, "outcome": outcome, "boundary": boundary},
    }


def _say_settled(msg: ToolMessage, txid: int) -> None:
    """A deferred call's message, once its turn committed: it now says that it took effect."""
    ack = msg.artifact if isinstance(msg.artifact, dict) else None
    if ack is None or msg.status == "error" or ack.get("status") not in ("staged", "queued"):
        return
    done = "applied" if ack["status"] == "staged" else "released"
    msg.content = f"done: {ack['tool']} {done} when transaction {txid} committed"


_UNDONE = {
    EffectClass.BUFFERABLE: "its write was dropped before it reached anything",
    EffectClass.REVERSIBLE: "its effect was compensated",
    EffectClass.IRREVERSIBLE: "it never left the gate",
    None: "it changed nothing itself",
}


def _say_aborted(
    out: Any,
    key: str,
    tools: dict[str, BaseTool],
    failed: list[ToolMessage],
    what: str,
    why: str | None,
) -> None:
    """Rewrite a turn's messages after its transaction aborted: every call is an error now,
    and each says what became of its effect."""
    reason = f"{what}: {why}" if why else what
    failed_ids = {id(m) for m in failed}
    for msg in _tool_messages(out, key):
        if id(msg) in failed_ids:
            msg.content = f"{_text(msg.content)}\n({reason}; no effect of it remains.)"
        else:
            tool = tools.get(msg.name or "")
            effect = tool.spec.effect if isinstance(tool, AtomixTool) else None
            msg.content = (
                f"rolled back: {reason}, so this call was undone: {_UNDONE[effect]}. "
                f"It had returned: {_text(msg.content)}"
            )
        msg.status = "error"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in content]
    return " ".join(p for p in parts if p)


#: So that `from atomix.integrations.langgraph import ToolNode` is the drop-in replacement.
ToolNode = AtomixToolNode

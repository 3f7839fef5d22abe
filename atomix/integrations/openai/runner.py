"""`OpenAITools`: the transaction policy around a turn's calls - which transaction a turn runs
in (its own, the task's, the caller's), when it commits, and what a failure undoes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal, TypeVar

from atomix.decisions import Settlement
from atomix.effects import AbortSource
from atomix.errors import AtomixError, CommitIncomplete, TransactionAborted
from atomix.handles import ATx, Tx, current_transaction
from atomix.integrations.openai.messages import messages
from atomix.integrations.openai.turn import (
    Turn,
    abort_source,
    aexecute,
    execute,
    invalid,
    is_dead,
    why,
)
from atomix.integrations.openai.wire import ToolCall, parse
from atomix.runtime import Runtime
from atomix.savepoints import ASavepoint, Savepoint
from atomix.schemas import ToolSchema, tool_schema
from atomix.tools import ToolSpec

Boundary = Literal["turn", "task", "explicit"]
OnError = Literal["abort", "commit"]

# The driver a method works with: Tx for run/task/commit/abort, ATx for their async forms.
_TxT = TypeVar("_TxT", Tx, ATx)


class OpenAITools:
    """Runs a chat completion's tool calls through an Atomix runtime and returns the tool
    messages (see `atomix.integrations.openai` for the boundaries and what a failure does).

    Guarantees: `run` returns one message per call, in order, and raises only for a caller's
    mistake (a malformed container, no open transaction under "explicit", an async tool in
    the sync `run`), before any tool runs; a call that fails or is invalid never causes
    another tool to run in its place; with on_error "abort" a turn's effects take effect all
    together or not at all.
    """

    def __init__(
        self,
        runtime: Runtime,
        tools: Iterable[Any] | None = None,
        *,
        boundary: Boundary = "turn",
        on_error: OnError = "abort",
        retries: int = 2,
    ) -> None:
        if boundary not in ("turn", "task", "explicit"):
            raise ValueError(f"boundary={boundary!r}: allowed are 'turn', 'task', 'explicit'")
        if on_error not in ("abort", "commit"):
            raise ValueError(f"on_error={on_error!r}: allowed are 'abort', 'commit'")
        if retries < 0:
            raise ValueError(f"retries={retries!r}: must be 0 or more")
        self.rt = runtime
        self.boundary: Boundary = boundary
        self.on_error: OnError = on_error
        self.retries = retries
        # None: every tool of the runtime, looked up at each use (tools defined later too).
        self._fixed: dict[str, ToolSpec] | None = None
        if tools is not None:
            self._fixed = {}
            for tool in tools:
                spec = self._own_spec(tool)
                if spec.name in self._fixed:
                    raise ValueError(f"two tools are named {spec.name!r}; the model calls by name")
                self._fixed[spec.name] = spec
        self._task: Tx | ATx | None = None
        #: The settlement of the last transaction this runner committed or aborted.
        self.last_settlement: Settlement | None = None

    def _own_spec(self, tool: Any) -> ToolSpec:
        spec = tool if isinstance(tool, ToolSpec) else getattr(tool, "spec", None)
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"OpenAITools: {tool!r} is not a tool (an rt.tool shim or a ToolSpec)")
        if self.rt.coordinator.tools.get(spec.name) is not spec:
            raise ValueError(
                f"tool {spec.name!r} is not a tool of this runtime (or two functions share its "
                "name there): define it with this runtime's rt.tool, under a unique name"
            )
        return spec

    # -- what the model is offered ------------------------------------------------------------

    def _catalog(self) -> dict[str, ToolSpec]:
        if self._fixed is not None:
            return self._fixed
        return {name: spec for name, spec in self.rt.coordinator.tools.items() if spec is not None}

    @property
    def schemas(self) -> list[ToolSchema]:
        """The offered tools' schemas (see atomix.schemas)."""
        return [tool_schema(spec) for spec in self._catalog().values()]

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The `tools=` argument of `chat.completions.create` (fresh copies each time)."""
        return [schema.openai() for schema in self.schemas]

    # -- sync ---------------------------------------------------------------------------------

    def run(self, tool_calls: Any) -> list[dict[str, Any]]:
        """Run the tool calls (a ChatCompletion, its message, a list of calls, or dicts of
        those shapes) and return one tool message per call, in order."""
        calls = parse(tool_calls, self._catalog())
        if not calls:
            return []
        for call in calls:
            if call.spec is not None and call.spec.is_async:
                raise AtomixError(
                    f"tool {call.name!r} is async: run these calls with `await tools.arun(...)`"
                )
        if self.boundary == "turn":
            self._no_open_transaction("run")
            for attempt in range(self.retries + 1):
                replies, stale = self._turn(calls)
                if not stale or attempt == self.retries:
                    return replies
            raise AssertionError("unreachable")
        tx = self._explicit(Tx, "run") if self.boundary == "explicit" else self._task_tx(Tx)
        with tx.active():
            turn = self._execute_in(tx, calls)
        return self._messages(calls, turn, committed=False)

    def _turn(self, calls: list[ToolCall]) -> tuple[list[dict[str, Any]], bool]:
        """One attempt at a turn in a transaction of its own; whether it lost to a stale read."""
        if self.on_error == "abort" and any(c.error for c in calls):
            return self._messages(calls, invalid(calls), committed=False), False
        tx = self._own_transaction(Tx)
        incomplete: CommitIncomplete | None = None
        turn = Turn([None] * len(calls))
        try:
            with tx:
                turn = execute(tx, calls, savepoints=self.on_error == "commit")
                if turn.dead is None:
                    if turn.failed is not None and self.on_error == "abort":
                        self.last_settlement = tx.abort(AbortSource.TOOL_FAILURE, why(calls, turn))
                    else:
                        try:
                            self.last_settlement = tx.commit()
                        except CommitIncomplete as exc:
                            incomplete = exc
                            self.last_settlement = _settlement_of(exc)
        except TransactionAborted as exc:  # at commit (a stale read, a time-out), or by another
            if exc.txid != tx.txid:
                raise
            turn.dead = exc
        if turn.dead is not None:
            self.last_settlement = tx.settlement
        stale = turn.dead is not None and turn.dead.source == AbortSource.STALE_READ
        return self._messages(calls, turn, committed=True, incomplete=incomplete), stale

    def _execute_in(self, tx: Tx, calls: list[ToolCall]) -> Turn:
        """A turn inside a transaction that outlives it (task, explicit): under "abort" it is
        rolled back to a savepoint when a call fails, and never runs when one is invalid."""
        if self.on_error == "commit":
            turn = execute(tx, calls, savepoints=True)
        elif any(c.error for c in calls):
            return invalid(calls)
        else:
            with Savepoint(tx) as savepoint:
                turn = execute(tx, calls, savepoints=False)
                if turn.failed is not None and turn.dead is None and not is_dead(tx):
                    savepoint.rollback()
        if turn.dead is not None and self._task is tx:
            self._task = None
            self.last_settlement = tx.settlement
        return turn

    @contextmanager
    def task(self) -> Iterator[OpenAITools]:
        """A task transaction as a block: the `run` calls inside it share one transaction,
        committed when the block ends, aborted if it raises. If the transaction aborted
        itself meanwhile (the messages said so), later calls begin a new one."""
        self._begin_task(Tx)
        try:
            yield self
        except BaseException as exc:
            if self._task is not None:
                self.abort(abort_source(exc), f"{type(exc).__name__}: {exc}")
            raise
        self.commit()

    def commit(self) -> Settlement | None:
        """Commit the task transaction (None if none is open). A stale read or time-out at
        commit raises TransactionAborted; either way the next `run` begins a new task."""
        tx = self._take_task(Tx, "commit")
        if tx is None:
            return None
        try:
            self.last_settlement = tx.commit()
        except TransactionAborted:
            self.last_settlement = tx.settlement
            raise
        except CommitIncomplete as exc:
            self.last_settlement = _settlement_of(exc)
            raise
        return self.last_settlement

    def abort(
        self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = ""
    ) -> Settlement | None:
        """Abort the task transaction (None if none is open): every turn of it is undone."""
        tx = self._take_task(Tx, "abort")
        if tx is None:
            return None
        self.last_settlement = tx.abort(source, detail)
        return self.last_settlement

    # -- async --------------------------------------------------------------------------------

    async def arun(self, tool_calls: Any) -> list[dict[str, Any]]:
        """`run` for asyncio: async tools are awaited, sync ones run in a worker thread (as
        `tx.call` does), inside an `rt.atransaction()`."""
        calls = parse(tool_calls, self._catalog())
        if not calls:
            return []
        if self.boundary == "turn":
            self._no_open_transaction("arun")
            for attempt in range(self.retries + 1):
                replies, stale = await self._aturn(calls)
                if not stale or attempt == self.retries:
                    return replies
            raise AssertionError("unreachable")
        tx = self._explicit(ATx, "arun") if self.boundary == "explicit" else self._task_tx(ATx)
        with tx.active():
            turn = await self._aexecute_in(tx, calls)
        return self._messages(calls, turn, committed=False)

    async def _aturn(self, calls: list[ToolCall]) -> tuple[list[dict[str, Any]], bool]:
        if self.on_error == "abort" and any(c.error for c in calls):
            return self._messages(calls, invalid(calls), committed=False), False
        tx = self._own_transaction(ATx)
        incomplete: CommitIncomplete | None = None
        turn = Turn([None] * len(calls))
        try:
            async with tx:
                turn = await aexecute(tx, calls, savepoints=self.on_error == "commit")
                if turn.dead is None:
                    if turn.failed is not None and self.on_error == "abort":
                        self.last_settlement = await tx.abort(
                            AbortSource.TOOL_FAILURE, why(calls, turn)
                        )
                    else:
                        try:
                            self.last_settlement = await tx.commit()
                        except CommitIncomplete as exc:
                            incomplete = exc
                            self.last_settlement = _settlement_of(exc)
        except TransactionAborted as exc:
            if exc.txid != tx.txid:
                raise
            turn.dead = exc
        if turn.dead is not None:
            self.last_settlement = tx.settlement
        stale = turn.dead is not None and turn.dead.source == AbortSource.STALE_READ
        return self._messages(calls, turn, committed=True, incomplete=incomplete), stale

    async def _aexecute_in(self, tx: ATx, calls: list[ToolCall]) -> Turn:
        if self.on_error == "commit":
            turn = await aexecute(tx, calls, savepoints=True)
        elif any(c.error for c in calls):
            return invalid(calls)
        else:
            async with ASavepoint(tx) as savepoint:
                turn = await aexecute(tx, calls, savepoints=False)
                if turn.failed is not None and turn.dead is None and not is_dead(tx):
                    await savepoint.rollback()
        if turn.dead is not None and self._task is tx:
            self._task = None
            self.last_settlement = tx.settlement
        return turn

    @asynccontextmanager
    async def atask(self) -> AsyncIterator[OpenAITools]:
        """`task` for asyncio: the `arun` calls inside share one transaction."""
        self._begin_task(ATx)
        try:
            yield self
        except BaseException as exc:
            if self._task is not None:
                await self.aabort(abort_source(exc), f"{type(exc).__name__}: {exc}")
            raise
        await self.acommit()

    async def acommit(self) -> Settlement | None:
        """`commit` for a task begun by `arun` or `atask`."""
        tx = self._take_task(ATx, "acommit")
        if tx is None:
            return None
        try:
            self.last_settlement = await tx.commit()
        except TransactionAborted:
            self.last_settlement = tx.settlement
            raise
        except CommitIncomplete as exc:
            self.last_settlement = _settlement_of(exc)
            raise
        return self.last_settlement

    async def aabort(
        self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = ""
    ) -> Settlement | None:
        """`abort` for a task begun by `arun` or `atask`."""
        tx = self._take_task(ATx, "aabort")
        if tx is None:
            return None
        self.last_settlement = await tx.abort(source, detail)
        return self.last_settlement

    # -- transactions -------------------------------------------------------------------------

    def _no_open_transaction(self, method: str) -> None:
        outer = current_transaction()
        if outer is not None and outer.rt is self.rt:
            raise AtomixError(
                f"{method}(): boundary 'turn' commits each turn in a transaction of its own, "
                f"but transaction {outer.txid} is open here; to run the calls inside it, use "
                "OpenAITools(..., boundary='explicit')"
            )

    def _explicit(self, kind: type[_TxT], method: str) -> _TxT:
        tx = current_transaction()
        want = "with rt.transaction():" if kind is Tx else "async with rt.atransaction():"
        if tx is None or tx.rt is not self.rt:
            raise AtomixError(
                f"{method}(): boundary 'explicit' runs the calls in the caller's transaction, and "
                f"none of this runtime is open here: call it inside `{want}`"
            )
        if not isinstance(tx, kind):
            raise AtomixError(
                f"{method}(): transaction {tx.txid} is of the other driver: use `{want}` "
                f"with {method}()"
            )
        if is_dead(tx):
            raise AtomixError(
                f"{method}(): transaction {tx.txid} has already settled; open a new one"
            )
        return tx

    def _task_tx(self, kind: type[_TxT]) -> _TxT:
        self._no_open_transaction("run" if kind is Tx else "arun")
        tx = self._task
        if tx is not None and is_dead(tx):
            tx = self._task = None
        if tx is None:
            return self._begin_task(kind)
        if not isinstance(tx, kind):
            mine, other = ("run", "arun") if kind is Tx else ("arun", "run")
            raise AtomixError(
                f"{mine}(): this task's transaction was begun by {other}(); continue it with "
                f"{other}(), or settle it first"
            )
        return tx

    def _begin_task(self, kind: type[_TxT]) -> _TxT:
        if self.boundary != "task":
            raise AtomixError(
                f"a task transaction needs OpenAITools(..., boundary='task'), not {self.boundary!r}"
            )
        if self._task is not None and not is_dead(self._task):
            raise AtomixError(
                f"task transaction {self._task.txid} is still open: commit() or abort() it first"
            )
        self._no_open_transaction("task")
        task = self._task = self._own_transaction(kind)
        return task

    def _own_transaction(self, kind: type[_TxT]) -> _TxT:
        """A new transaction for a turn or a task. Its callers have checked that no
        transaction of this runtime is open here, so the runtime begins one of its own rather
        than a savepoint of another."""
        tx = self.rt.transaction() if kind is Tx else self.rt.atransaction()
        assert isinstance(tx, kind), "a transaction of this runtime is open: not a turn's own"
        return tx

    def _take_task(self, kind: type[_TxT], method: str) -> _TxT | None:
        if self.boundary != "task":
            raise AtomixError(f"{method}() settles a task: boundary is {self.boundary!r}")
        tx = self._task
        if tx is None:
            return None
        if not isinstance(tx, kind):
            other = {"commit": "acommit", "abort": "aabort"}.get(method) or method[1:]
            raise AtomixError(
                f"{method}(): the task transaction is of the other driver; use {other}()"
            )
        self._task = None
        return tx

    # -- messages -----------------------------------------------------------------------------

    def _messages(
        self,
        calls: list[ToolCall],
        turn: Turn,
        *,
        committed: bool,
        incomplete: CommitIncomplete | None = None,
    ) -> list[dict[str, Any]]:
        return messages(
            calls,
            turn,
            boundary=self.boundary,
            on_error=self.on_error,
            settled=self.last_settlement,
            committed=committed,
            incomplete=incomplete,
        )


def _settlement_of(exc: CommitIncomplete) -> Settlement | None:
    """The settlement a CommitIncomplete carries (typed `object` where it is declared)."""
    settlement = exc.settlement
    return settlement if isinstance(settlement, Settlement) else None

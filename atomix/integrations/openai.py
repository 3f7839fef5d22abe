"""Run an OpenAI chat completion's tool calls through the Atomix runtime.

    tools = OpenAITools(rt, [write_file, send_mail])          # rt.tool shims
    reply = client.chat.completions.create(model=..., messages=messages, tools=tools.tools)
    messages.append(reply.choices[0].message)
    messages += tools.run(reply)                              # one tool message per call

`run` takes a ChatCompletion, its message, a list of tool calls, or plain dicts of the same
shapes; the openai package is not needed. It returns `{"role": "tool", "tool_call_id",
"content"}` messages in the order of the calls. A result is JSON; a staged or queued call
says it takes effect at commit. Whatever goes wrong with one call - arguments that are not
JSON, an unknown tool, arguments that do not fit its signature or types, a scope the tool
refuses, the tool raising, the transaction aborting - comes back as a message whose content
starts with "Error:", for the model to read; `run` itself does not raise for it.

The transaction boundary (`boundary=`):

- "turn" (default): each `run` is one transaction, committed before `run` returns.
- "task": one transaction spans several `run` calls, until `commit()` / `abort()` or the
  end of a `with tools.task():` block (which commits, or aborts on an exception).
- "explicit": the caller opens it: `with rt.transaction(): tools.run(...)`; `run` raises
  AtomixError when none of this runtime is open, and never commits or aborts it.

A turn is the calls of one `run`. The calls of a turn run one after another, in the order
the model gave them, inside its transaction: parallel tool calls are deterministic, and a
later call sees what earlier ones staged. When a call fails, `on_error` decides the turn:

- "abort" (default): the whole turn is undone and the rest of its calls are not run; if a
  call is invalid (bad JSON, unknown tool, wrong arguments) no call of the turn runs at all.
  Under "turn" the transaction aborts: staged writes are dropped, queued sends never leave,
  reversible effects are compensated. Under "task" and "explicit" the turn is rolled back to
  a savepoint and the transaction stays open with the earlier turns' work. Every message of
  the turn then starts with "Error:" and says the turn was undone, so the model retries it
  whole rather than building on a call that no longer exists.
- "commit": only the failing call is undone (each call runs in its own savepoint); the
  others stand and, under "turn", commit.

If the transaction itself aborts (a stale read at commit, a time-out, a seal violation),
every call since it began is gone, and the messages say so; under "turn" a stale read
retries the whole turn with a fresh epoch, up to `retries` times, as `Runtime.run` does.

A runner keeps the state of one conversation (its task transaction): use one per agent and
do not share it between threads.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal

from atomix.decisions import Settlement
from atomix.effects import AbortSource
from atomix.errors import AtomixError, CommitIncomplete, ScopeError, TransactionAborted
from atomix.runtime import ATx, Runtime, Tx, current_transaction
from atomix.schemas import ArgumentsError, ToolSchema, check_arguments, tool_schema
from atomix.tools import Ack, ToolSpec
from atomix.transaction import ABORTED

__all__ = ["OpenAITools"]

Boundary = Literal["turn", "task", "explicit"]
OnError = Literal["abort", "commit"]


@dataclasses.dataclass(slots=True)
class _Call:
    """One tool call as parsed: what to run, or why it cannot run."""

    id: str
    name: str
    spec: ToolSpec | None = None
    args: dict[str, Any] | None = None
    error: str | None = None  # set when the call is invalid: it never runs


@dataclasses.dataclass(slots=True)
class _Turn:
    """What running a turn's calls in a transaction did."""

    results: list[Any]  # per call: its value, or _Failed, or None when it was not run
    failed: int | None = None  # index of the first call that failed
    dead: TransactionAborted | None = None  # the transaction aborted while running
    ran: bool = False  # whether any tool of the turn was called


@dataclasses.dataclass(slots=True)
class _Failed:
    text: str  # the message after "Error: "


class OpenAITools:
    """Runs a chat completion's tool calls through an Atomix runtime and returns the tool
    messages (see the module docstring for the boundaries and what a failure does).

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
        calls = self._parse(tool_calls)
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
                messages, stale = self._turn(calls)
                if not stale or attempt == self.retries:
                    return messages
            raise AssertionError("unreachable")
        tx = self._explicit(Tx, "run") if self.boundary == "explicit" else self._task_tx(Tx)
        with tx.active():
            turn = self._execute_in(tx, calls)
        return self._messages(calls, turn, committed=False)

    def _turn(self, calls: list[_Call]) -> tuple[list[dict[str, Any]], bool]:
        """One attempt at a turn in a transaction of its own; whether it lost to a stale read."""
        if self.on_error == "abort" and any(c.error for c in calls):
            return self._messages(calls, _invalid(calls), committed=False), False
        tx = self.rt.transaction()
        incomplete: CommitIncomplete | None = None
        turn = _Turn([None] * len(calls))
        try:
            with tx:
                turn = self._execute(tx, calls, savepoints=self.on_error == "commit")
                if turn.dead is None:
                    if turn.failed is not None and self.on_error == "abort":
                        self.last_settlement = tx.abort(
                            AbortSource.TOOL_FAILURE, _why(calls, turn)
                        )
                    else:
                        try:
                            self.last_settlement = tx.commit()
                        except CommitIncomplete as exc:
                            incomplete = exc
                            self.last_settlement = exc.settlement  # type: ignore[assignment]
        except TransactionAborted as exc:  # at commit (a stale read, a time-out), or by another
            if exc.txid != tx.txid:
                raise
            turn.dead = exc
        if turn.dead is not None:
            self.last_settlement = tx.settlement
        stale = turn.dead is not None and turn.dead.source == AbortSource.STALE_READ
        return self._messages(calls, turn, committed=True, incomplete=incomplete), stale

    def _execute_in(self, tx: Tx, calls: list[_Call]) -> _Turn:
        """A turn inside a transaction that outlives it (task, explicit): under "abort" it is
        rolled back to a savepoint when a call fails, and never runs when one is invalid."""
        if self.on_error == "commit":
            turn = self._execute(tx, calls, savepoints=True)
        elif any(c.error for c in calls):
            return _invalid(calls)
        else:
            with self.rt.transaction() as savepoint:  # a savepoint of tx
                turn = self._execute(tx, calls, savepoints=False)
                if turn.failed is not None and turn.dead is None and not _is_dead(tx):
                    savepoint.rollback()
        if turn.dead is not None and self._task is tx:
            self._task = None
            self.last_settlement = tx.settlement
        return turn

    def _execute(self, tx: Tx, calls: list[_Call], *, savepoints: bool) -> _Turn:
        turn = _Turn([None] * len(calls))
        for i, call in enumerate(calls):
            if call.error is not None:
                turn.results[i] = _Failed(call.error)
                turn.failed = i if turn.failed is None else turn.failed
                continue
            assert call.spec is not None and call.args is not None
            turn.ran = True
            try:
                # _call_bound, not tx.call(spec, **args): a tool may have a parameter `spec`.
                if savepoints:
                    with self.rt.transaction():  # a savepoint: a failure undoes this call only
                        value = tx._call_bound(call.spec, call.args)
                else:
                    value = tx._call_bound(call.spec, call.args)
            except Exception as exc:  # noqa: BLE001 - becomes the model's error message
                dead = _death(tx, exc)
                if dead is not None:
                    turn.dead = dead
                    return turn
                turn.results[i] = _Failed(_failure(call, exc))
                turn.failed = i if turn.failed is None else turn.failed
                if not savepoints:
                    return turn  # the turn is undone: run nothing more of it
                continue
            turn.results[i] = value
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
                self.abort(_source(exc), f"{type(exc).__name__}: {exc}")
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
            self.last_settlement = exc.settlement  # type: ignore[assignment]
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
        calls = self._parse(tool_calls)
        if not calls:
            return []
        if self.boundary == "turn":
            self._no_open_transaction("arun")
            for attempt in range(self.retries + 1):
                messages, stale = await self._aturn(calls)
                if not stale or attempt == self.retries:
                    return messages
            raise AssertionError("unreachable")
        tx = self._explicit(ATx, "arun") if self.boundary == "explicit" else self._task_tx(ATx)
        with tx.active():
            turn = await self._aexecute_in(tx, calls)
        return self._messages(calls, turn, committed=False)

    async def _aturn(self, calls: list[_Call]) -> tuple[list[dict[str, Any]], bool]:
        if self.on_error == "abort" and any(c.error for c in calls):
            return self._messages(calls, _invalid(calls), committed=False), False
        tx = self.rt.atransaction()
        incomplete: CommitIncomplete | None = None
        turn = _Turn([None] * len(calls))
        try:
            async with tx:
                turn = await self._aexecute(tx, calls, savepoints=self.on_error == "commit")
                if turn.dead is None:
                    if turn.failed is not None and self.on_error == "abort":
                        self.last_settlement = await tx.abort(
                            AbortSource.TOOL_FAILURE, _why(calls, turn)
                        )
                    else:
                        try:
                            self.last_settlement = await tx.commit()
                        except CommitIncomplete as exc:
                            incomplete = exc
                            self.last_settlement = exc.settlement  # type: ignore[assignment]
        except TransactionAborted as exc:
            if exc.txid != tx.txid:
                raise
            turn.dead = exc
        if turn.dead is not None:
            self.last_settlement = tx.settlement
        stale = turn.dead is not None and turn.dead.source == AbortSource.STALE_READ
        return self._messages(calls, turn, committed=True, incomplete=incomplete), stale

    async def _aexecute_in(self, tx: ATx, calls: list[_Call]) -> _Turn:
        if self.on_error == "commit":
            turn = await self._aexecute(tx, calls, savepoints=True)
        elif any(c.error for c in calls):
            return _invalid(calls)
        else:
            async with self.rt.atransaction() as savepoint:  # a savepoint of tx
                turn = await self._aexecute(tx, calls, savepoints=False)
                if turn.failed is not None and turn.dead is None and not _is_dead(tx):
                    await savepoint.rollback()
        if turn.dead is not None and self._task is tx:
            self._task = None
            self.last_settlement = tx.settlement
        return turn

    async def _aexecute(self, tx: ATx, calls: list[_Call], *, savepoints: bool) -> _Turn:
        turn = _Turn([None] * len(calls))
        for i, call in enumerate(calls):
            if call.error is not None:
                turn.results[i] = _Failed(call.error)
                turn.failed = i if turn.failed is None else turn.failed
                continue
            assert call.spec is not None and call.args is not None
            turn.ran = True
            try:
                if savepoints:
                    async with self.rt.atransaction():
                        value = await tx._call_bound(call.spec, call.args)
                else:
                    value = await tx._call_bound(call.spec, call.args)
            except Exception as exc:  # noqa: BLE001 - becomes the model's error message
                dead = _death(tx, exc)
                if dead is not None:
                    turn.dead = dead
                    return turn
                turn.results[i] = _Failed(_failure(call, exc))
                turn.failed = i if turn.failed is None else turn.failed
                if not savepoints:
                    return turn
                continue
            turn.results[i] = value
        return turn

    @asynccontextmanager
    async def atask(self) -> AsyncIterator[OpenAITools]:
        """`task` for asyncio: the `arun` calls inside share one transaction."""
        self._begin_task(ATx)
        try:
            yield self
        except BaseException as exc:
            if self._task is not None:
                await self.aabort(_source(exc), f"{type(exc).__name__}: {exc}")
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
            self.last_settlement = exc.settlement  # type: ignore[assignment]
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

    def _explicit(self, kind: type, method: str) -> Any:
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
        if _is_dead(tx):
            raise AtomixError(
                f"{method}(): transaction {tx.txid} has already settled; open a new one"
            )
        return tx

    def _task_tx(self, kind: type) -> Any:
        self._no_open_transaction("run" if kind is Tx else "arun")
        tx = self._task
        if tx is not None and _is_dead(tx):
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

    def _begin_task(self, kind: type) -> Tx | ATx:
        if self.boundary != "task":
            raise AtomixError(
                f"a task transaction needs OpenAITools(..., boundary='task'), not {self.boundary!r}"
            )
        if self._task is not None and not _is_dead(self._task):
            raise AtomixError(
                f"task transaction {self._task.txid} is still open: commit() or abort() it first"
            )
        self._no_open_transaction("task")
        self._task = self.rt.transaction() if kind is Tx else self.rt.atransaction()
        return self._task

    def _take_task(self, kind: type, method: str) -> Any:
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

    # -- parsing and messages -----------------------------------------------------------------

    def _parse(self, tool_calls: Any) -> list[_Call]:
        catalog = self._catalog()
        calls = []
        for index, raw in enumerate(_tool_calls(tool_calls)):
            call_id, kind, name, arguments = _fields(raw, index)
            call = _Call(call_id, name if isinstance(name, str) else repr(name))
            calls.append(call)
            if kind != "function":
                call.error = f"only function tool calls are supported, not type {kind!r}"
                continue
            spec = catalog.get(name) if isinstance(name, str) else None
            if spec is None:
                offered = ", ".join(catalog) or "none"
                call.error = f"there is no tool named {call.name!r}; the tools are: {offered}"
                continue
            call.spec = spec
            if arguments is None or arguments == "":
                arguments = "{}"  # a call of a tool without parameters
            if isinstance(arguments, str | bytes):
                try:
                    arguments = json.loads(arguments)
                except ValueError as exc:
                    call.error = (
                        f"the arguments of {call.name} are not valid JSON ({exc}); send one "
                        "JSON object of the parameters"
                    )
                    continue
            try:
                call.args = check_arguments(spec, arguments)
            except ArgumentsError as exc:
                call.error = f"wrong arguments for {call.name}: {exc}"
        return calls

    def _messages(
        self,
        calls: list[_Call],
        turn: _Turn,
        *,
        committed: bool,
        incomplete: CommitIncomplete | None = None,
    ) -> list[dict[str, Any]]:
        """The tool messages: each result as it is if it stands, else why it does not."""
        undone = _undone(calls, turn, self.boundary, self.on_error)
        if undone is not None and self.boundary == "turn":
            settled = self.last_settlement
            if settled is not None and settled.residue:
                cause, consequence = undone
                consequence += (
                    f". Warning: {len(settled.residue)} effect(s) could not be undone and "
                    f"need a human: {', '.join(settled.residue)}"
                )
                undone = cause, consequence
        failed_keys: dict[str, BaseException | None] = {}
        if incomplete is not None:
            settlement = incomplete.settlement
            errors = getattr(settlement, "errors", {})
            failed_keys = {k: errors.get(k) for k in getattr(settlement, "failed_applies", ())}
        out = []
        for i, (call, result) in enumerate(zip(calls, turn.results, strict=True)):
            if isinstance(result, _Failed):
                text = f"Error: {result.text}"
                if undone is not None:
                    cause, consequence = undone
                    also = "" if i == turn.failed and turn.dead is None else f" Also, {cause}."
                    text += f".{also} {consequence}."
            elif undone is not None:
                cause, consequence = undone
                if result is None:
                    text = f"Error: not run: {cause}. {consequence}."
                else:
                    text = f"Error: undone: {call.name} ran, but {cause}. {consequence}."
            elif isinstance(result, Ack):
                if result.key in failed_keys:
                    why = failed_keys[result.key]
                    text = (
                        f"Error: the transaction committed, but this {result.status} effect did "
                        f"not take effect after retries: {type(why).__name__}: {why}"
                    )
                else:
                    text = _ack_text(result, committed)
            else:
                text = _result_text(result)
            out.append({"role": "tool", "tool_call_id": call.id, "content": text})
        return out


# --------------------------------------------------------------------------- helpers


def _is_dead(tx: Tx | ATx) -> bool:
    return tx.settlement is not None or tx.state is ABORTED


def _death(tx: Tx | ATx, exc: BaseException) -> TransactionAborted | None:
    """The abort of `tx`, if `exc` came from it aborting, else None (the call failed alone)."""
    if isinstance(exc, TransactionAborted) and exc.txid == tx.txid:
        return exc
    if _is_dead(tx):
        source = tx.abort_source or "aborted"
        return TransactionAborted(tx.txid, str(source), tx.abort_detail or str(exc), tx.settlement)
    return None


def _source(exc: BaseException) -> AbortSource | str:
    source = getattr(exc, "abort_source", None)
    if source is not None:
        return source  # type: ignore[no-any-return]
    return AbortSource.TOOL_FAILURE if isinstance(exc, Exception) else AbortSource.CANCELLED


def _failure(call: _Call, exc: Exception) -> str:
    if isinstance(exc, ScopeError):
        return f"{call.name} refused these arguments: {exc}"
    if isinstance(exc, TypeError) and "argument" in str(exc):
        return f"wrong arguments for {call.name}: {exc}"
    return f"{call.name} failed: {type(exc).__name__}: {exc}"


def _why(calls: list[_Call], turn: _Turn) -> str:
    assert turn.failed is not None
    call = calls[turn.failed]
    result = turn.results[turn.failed]
    text = result.text if isinstance(result, _Failed) else "failed"
    return f"tool call {call.id} ({call.name}): {text}"


def _invalid(calls: list[_Call]) -> _Turn:
    """A turn not run because some of its calls are invalid."""
    turn = _Turn([None] * len(calls))
    for i, call in enumerate(calls):
        if call.error is not None:
            turn.results[i] = _Failed(call.error)
            turn.failed = i if turn.failed is None else turn.failed
    return turn


_UNDO = "staged writes dropped, queued actions never sent, reversible actions compensated"


def _undone(
    calls: list[_Call], turn: _Turn, boundary: str, on_error: str
) -> tuple[str, str] | None:
    """Why no call of the turn stands, as (cause, consequence) for the messages, or None if
    the calls that succeeded stand."""
    if turn.dead is not None:
        dead = turn.dead
        what = {
            "turn": "Nothing of this turn took effect",
            "task": "Nothing of this task took effect, this turn and earlier ones alike",
            "explicit": "Nothing done in that transaction took effect, this turn included",
        }[boundary]
        stale = " (a stale read: the state changed meanwhile)" if dead.source == "stale_read" else ""
        cause = f"the transaction was aborted: {dead.source}{stale}: {dead.detail}"
        return cause, f"{what} ({_UNDO}). Read the state again before you retry"
    if turn.failed is None or on_error == "commit":
        return None
    call = calls[turn.failed]
    if not turn.ran:
        where = "none of them was run"
    elif boundary == "turn":
        where = "the turn's transaction was aborted"
    else:
        where = "the turn was rolled back, and the transaction's earlier work stands"
    cause = f"call {call.id} ({call.name}) of this turn failed"
    undo = f" ({_UNDO})" if turn.ran else ""
    consequence = (
        f"No call of this turn took effect: {where}{undo}. Fix the failing call and make "
        "all of this turn's calls again"
    )
    return cause, consequence


def _ack_text(ack: Ack, committed: bool) -> str:
    if committed:
        note = (
            "the staged write was applied when this turn committed"
            if ack.status == "staged"
            else "the queued action was released when this turn committed"
        )
        return json.dumps({"status": "committed", "note": note})
    note = (
        "staged: it takes effect when the transaction commits"
        if ack.status == "staged"
        else "queued: it happens only when the transaction commits, never if it aborts"
    )
    return json.dumps({"status": ack.status, "note": note})


def _result_text(result: Any) -> str:
    return json.dumps(_plain(result), default=str, ensure_ascii=False)


def _plain(value: Any) -> Any:
    """Dataclasses and pydantic models as their fields, so that JSON carries them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return dump(mode="json")
        except TypeError:
            return dump()
    return value


# --------------------------------------------------------------------------- wire shapes


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _tool_calls(obj: Any) -> list[Any]:
    """The tool calls of a ChatCompletion, a choice, a message, or a list of calls (SDK
    objects or dicts); a ChatCompletion's first choice is the one taken."""
    if obj is None:
        return []
    if isinstance(obj, str | bytes):
        raise TypeError(
            "tool calls: got a string; pass the ChatCompletion, its message or its tool_calls"
        )
    choices = _get(obj, "choices")
    if choices is not None:
        if not choices:
            raise ValueError("tool calls: the ChatCompletion has no choices")
        return _tool_calls(_get(choices[0], "message"))
    message = _get(obj, "message")
    if message is not None and _get(obj, "function") is None:  # a Choice
        return _tool_calls(message)
    if isinstance(obj, Mapping):
        if "tool_calls" in obj or "role" in obj:
            return list(obj.get("tool_calls") or [])
        if "function" in obj:
            return [obj]
        raise TypeError(
            f"tool calls: a dict with keys {sorted(obj)} is not a ChatCompletion, a message or "
            "a tool call"
        )
    if hasattr(obj, "tool_calls"):
        return list(obj.tool_calls or [])
    if hasattr(obj, "function"):
        return [obj]
    if isinstance(obj, Sequence | Iterable):
        return list(obj)
    raise TypeError(
        f"tool calls: {type(obj).__name__} is not a ChatCompletion, a message or a tool call"
    )


def _fields(call: Any, index: int) -> tuple[str, Any, Any, Any]:
    """(id, type, function name, arguments) of one tool call."""
    call_id = _get(call, "id")
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(
            f"tool call #{index}: it has no id ({call!r}); each tool message must name the id "
            "of its call"
        )
    kind = _get(call, "type") or "function"
    function = _get(call, "function")
    if function is None:
        return call_id, kind, None, None
    return call_id, kind, _get(function, "name"), _get(function, "arguments")

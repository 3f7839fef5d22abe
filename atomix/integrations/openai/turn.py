"""Running a turn's parsed calls, one after another, inside a transaction that is open."""

from __future__ import annotations

import dataclasses
from typing import Any

from atomix.effects import AbortSource
from atomix.errors import ScopeError, TransactionAborted
from atomix.handles import ATx, Tx
from atomix.integrations.openai.wire import ToolCall
from atomix.savepoints import ASavepoint, Savepoint
from atomix.transaction import ABORTED


@dataclasses.dataclass(slots=True)
class Failed:
    """A call that failed or was invalid; `text` is its message after "Error: "."""

    text: str


@dataclasses.dataclass(slots=True)
class Turn:
    """What running a turn's calls in a transaction did.

    Guarantees: `results` has one entry per call, in order; `failed` is the first call that
    failed, if any; `dead` is set when the transaction itself aborted while the turn ran.
    """

    results: list[Any]  # per call: its value, or Failed, or None when it was not run
    failed: int | None = None  # index of the first call that failed
    dead: TransactionAborted | None = None  # the transaction aborted while running
    ran: bool = False  # whether any tool of the turn was called


def execute(tx: Tx, calls: list[ToolCall], *, savepoints: bool) -> Turn:
    """Run the calls in `tx`, the current transaction. With `savepoints` each call is a
    savepoint of its own (a failure undoes that call only, and the rest still run); without,
    the first failure stops the turn, for the caller to undo whole."""
    turn = Turn([None] * len(calls))
    for i, call in enumerate(calls):
        if call.error is not None:
            _fail(turn, i, call.error)
            continue
        assert call.spec is not None and call.args is not None
        turn.ran = True
        try:
            # _call_bound, not tx.call(spec, **args): a tool may have a parameter `spec`.
            if savepoints:
                with Savepoint(tx):
                    value = tx._call_bound(call.spec, call.args)
            else:
                value = tx._call_bound(call.spec, call.args)
        except Exception as exc:  # noqa: BLE001 - becomes the model's error message
            dead = death(tx, exc)
            if dead is not None:
                turn.dead = dead
                return turn
            _fail(turn, i, _failure(call, exc))
            if not savepoints:
                return turn  # the turn is undone: run nothing more of it
            continue
        turn.results[i] = value
    return turn


async def aexecute(tx: ATx, calls: list[ToolCall], *, savepoints: bool) -> Turn:
    """`execute` for asyncio: async tools are awaited, sync ones run in a worker thread."""
    turn = Turn([None] * len(calls))
    for i, call in enumerate(calls):
        if call.error is not None:
            _fail(turn, i, call.error)
            continue
        assert call.spec is not None and call.args is not None
        turn.ran = True
        try:
            if savepoints:
                async with ASavepoint(tx):
                    value = await tx._call_bound(call.spec, call.args)
            else:
                value = await tx._call_bound(call.spec, call.args)
        except Exception as exc:  # noqa: BLE001 - becomes the model's error message
            dead = death(tx, exc)
            if dead is not None:
                turn.dead = dead
                return turn
            _fail(turn, i, _failure(call, exc))
            if not savepoints:
                return turn
            continue
        turn.results[i] = value
    return turn


def invalid(calls: list[ToolCall]) -> Turn:
    """A turn not run because some of its calls are invalid."""
    turn = Turn([None] * len(calls))
    for i, call in enumerate(calls):
        if call.error is not None:
            _fail(turn, i, call.error)
    return turn


def _fail(turn: Turn, index: int, text: str) -> None:
    turn.results[index] = Failed(text)
    turn.failed = index if turn.failed is None else turn.failed


def is_dead(tx: Tx | ATx) -> bool:
    """Whether `tx` can take no more calls: settled, or aborted and settling."""
    return tx.settlement is not None or tx.state is ABORTED


def death(tx: Tx | ATx, exc: BaseException) -> TransactionAborted | None:
    """The abort of `tx`, if `exc` came from it aborting, else None (the call failed alone)."""
    if isinstance(exc, TransactionAborted) and exc.txid == tx.txid:
        return exc
    if is_dead(tx):
        source = tx.abort_source or "aborted"
        return TransactionAborted(tx.txid, str(source), tx.abort_detail or str(exc), tx.settlement)
    return None


def abort_source(exc: BaseException) -> AbortSource | str:
    """Why an exception leaving a task block aborts the task: the source it names, else
    `cancelled` for a cancellation or an interrupt (not an Exception), else `tool_failure`."""
    source = getattr(exc, "abort_source", None)
    if isinstance(source, str):  # AbortSource is a StrEnum
        return source
    return AbortSource.TOOL_FAILURE if isinstance(exc, Exception) else AbortSource.CANCELLED


def why(calls: list[ToolCall], turn: Turn) -> str:
    """The abort detail of a turn that failed: its first failing call."""
    assert turn.failed is not None
    call = calls[turn.failed]
    result = turn.results[turn.failed]
    text = result.text if isinstance(result, Failed) else "failed"
    return f"tool call {call.id} ({call.name}): {text}"


def _failure(call: ToolCall, exc: Exception) -> str:
    if isinstance(exc, ScopeError):
        return f"{call.name} refused these arguments: {exc}"
    if isinstance(exc, TypeError) and "argument" in str(exc):
        return f"wrong arguments for {call.name}: {exc}"
    return f"{call.name} failed: {type(exc).__name__}: {exc}"

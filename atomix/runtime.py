"""The public runtime: a thread-safe synchronous API and an asyncio one over one core."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import threading
import time
from _thread import get_ident
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from atomix.decisions import AbortPlan, CommitPlan, Resolution, Settlement
from atomix.effects import REVERSIBLE, AbortSource, Effect
from atomix.errors import (
    AtomixError,
    CommitIncomplete,
    IllegalTransition,
    OutsideTransaction,
    TransactionAborted,
)
from atomix.log import TxLog
from atomix.manager import RuntimeOptions
from atomix.recovery import RecoveryReport
from atomix.recovery import recover as _recover
from atomix.scopes import Scope
from atomix.session import (
    ApplyAbort,
    ApplyCommit,
    Block,
    Coordinator,
    Run,
    Steps,
    TxSession,
)
from atomix.settle import acarry_out_abort, acarry_out_commit, carry_out_abort, carry_out_commit
from atomix.tools import Call, ScopeSpec, ToolSpec, define_tool, with_signature
from atomix.transaction import ABORTED

if TYPE_CHECKING:
    from atomix.schemas import ToolSchema

T = TypeVar("T")
_UNSET: Any = object()

_current: contextvars.ContextVar[Tx | ATx | None] = contextvars.ContextVar(
    "atomix_current_tx", default=None
)


def current_transaction() -> Tx | ATx | None:
    """The transaction the calling thread or task is inside, if any."""
    return _current.get()


class _ThreadSignal:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()

    def set(self) -> None:
        self.event.set()


class _AsyncSignal:
    __slots__ = ("event", "loop")

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def set(self) -> None:
        # Settlement may happen on another thread; wake the waiter on its own loop. A closed
        # loop has no waiter left to wake (its transaction expires at its deadline), and it
        # may close between the check and the call.
        loop = self.loop
        if loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:
            if not loop.is_closed():
                raise


class _SyncDriver:
    def __init__(self, timeout: float | None, attempts: int, clock: Callable[[], float]) -> None:
        self.timeout = timeout
        self.attempts = attempts
        self._clock = clock

    def new_signal(self) -> _ThreadSignal:
        return _ThreadSignal()

    def now(self) -> float:
        return self._clock()

    def drive(self, steps: Steps) -> Any:
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                instr = steps.throw(throw) if throw is not None else steps.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            # Whatever interrupts an instruction (a tool's error, Ctrl-C at a Block) is thrown
            # back into the steps: the session decides (an interrupted waiter aborts, settles,
            # and re-raises it).
            try:
                if isinstance(instr, Block):
                    assert isinstance(instr.signal, _ThreadSignal)
                    send = instr.signal.event.wait(instr.timeout)
                elif isinstance(instr, Run):
                    send = instr.fn()
                elif isinstance(instr, ApplyCommit):
                    send = carry_out_commit(
                        instr.plan, attempts=self.attempts, on_step=instr.on_step
                    )
                elif isinstance(instr, ApplyAbort):
                    send = carry_out_abort(instr.plan, on_compensated=instr.on_compensated)
            except BaseException as exc:  # noqa: BLE001 - handed back to the session
                throw = exc


class _InlineDriver(_SyncDriver):
    """Drives a sync tool's steps on the event loop's thread, for a sync shim called directly
    from a coroutine inside `async with rt.atransaction()`. It cannot wait without blocking
    the loop, so where the core says Wait it raises (before anything is recorded)."""

    def __init__(self, base: _SyncDriver, tool: str) -> None:
        super().__init__(base.timeout, base.attempts, base._clock)
        self.tool = tool

    def new_signal(self) -> _ThreadSignal:
        raise AtomixError(
            f"tool {self.tool!r} must wait for an earlier transaction on its scopes, and a sync "
            "call made directly from a coroutine cannot wait without blocking the event loop: "
            "inside `async with rt.atransaction() as tx:` call it as "
            "`await tx.call(tool, ...)`, which waits and runs it in a worker thread"
        )


def _abort_source(exc: BaseException) -> AbortSource | str:
    """Why an exception leaving a transaction's block aborts it: the source it names, else
    `cancelled` for a cancellation or an interrupt (CancelledError, KeyboardInterrupt,
    SystemExit: not an Exception), else `tool_failure`."""
    source = getattr(exc, "abort_source", None)
    if source is not None:
        return source  # type: ignore[no-any-return]
    return AbortSource.TOOL_FAILURE if isinstance(exc, Exception) else AbortSource.CANCELLED


class _AsyncDriver(_SyncDriver):
    def new_signal(self) -> _AsyncSignal:  # type: ignore[override]
        return _AsyncSignal()

    async def adrive(self, steps: Steps, *, threaded: bool = False) -> Any:
        """Drive `steps` on this task. With `threaded`, a Run (a sync tool function) runs in
        a worker thread, in a copy of this context, so that it never blocks the loop."""
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                instr = steps.throw(throw) if throw is not None else steps.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            # As in drive: a CancelledError at a Block goes back into the steps. Not
            # GeneratorExit: this coroutine is being closed (its loop is gone) and can no
            # longer await anything; its transaction expires at its deadline.
            try:
                if isinstance(instr, Block):
                    assert isinstance(instr.signal, _AsyncSignal)
                    try:
                        await asyncio.wait_for(instr.signal.event.wait(), instr.timeout)
                        send = True
                    except TimeoutError:
                        send = False
                elif isinstance(instr, Run):
                    send = await asyncio.to_thread(instr.fn) if threaded else instr.fn()
                    if asyncio.iscoroutine(send):
                        send = await send
                elif isinstance(instr, ApplyCommit):
                    send = await acarry_out_commit(
                        instr.plan, attempts=self.attempts, on_step=instr.on_step
                    )
                elif isinstance(instr, ApplyAbort):
                    send = await acarry_out_abort(
                        instr.plan, on_compensated=instr.on_compensated
                    )
            except GeneratorExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - handed back to the session
                throw = exc


class Tx(TxSession):
    """A synchronous transaction handle: a session that drives its own steps. As a context
    manager it commits on a clean exit and aborts on an exception (source `tool_failure`
    unless the exception names one)."""

    __slots__ = ("rt", "_driver", "_autocommit", "_token", "_own")

    rt: Runtime
    _driver: _SyncDriver
    _autocommit: bool
    _token: contextvars.Token[Any] | None
    _own: bool  # begun by the runtime for one call outside any transaction

    # The core makes the handle (it is the core's record, see TxSession); the runtime then
    # attaches its driver side, under the lock that began it.
    def _attach(self, rt: Runtime, driver: _SyncDriver, autocommit: bool) -> None:
        co = self.co = rt.coordinator  # TxSession._bind, spelled out: one per begin
        run = co.run_id
        self.key_prefix = (
            f"{run}:{self.trace}:{self.epoch}:{self.branch}:"
            if run
            else f"{self.trace}:{self.epoch}:{self.branch}:"
        )
        self.rt = rt
        self._driver = driver
        self._autocommit = autocommit
        self._token = None
        self._own = False

    @property
    def session(self) -> TxSession:
        """The driver-agnostic session: this handle itself."""
        return self

    def read(self, *scopes: str | Scope) -> None:
        self._driver.drive(self.read_steps(scopes, self._driver))

    def externalize(self, *scopes: str | Scope) -> None:
        self._driver.drive(self.externalize_steps(scopes, self._driver))

    def stage(self, effect: Effect) -> None:
        self._driver.drive(self.stage_steps(effect))

    def call(self, spec: ToolSpec, *args: Any, **kwargs: Any) -> Any:
        return self._call_bound(spec, spec.bind(args, kwargs))

    def _call_bound(self, spec: ToolSpec, bound: dict[str, Any]) -> Any:
        if spec.deferred_only:  # staged or queued: never waits, so no steps to drive
            outcome = self.defer(spec, bound)
            if outcome.__class__ is AbortPlan:
                self._driver.drive(self._abort_and_raise(outcome))
            return outcome
        if spec.effect is REVERSIBLE and not spec.is_async:  # inline unless it must wait
            return self.call_now(spec, bound, self._driver)
        return self._driver.drive(self.call_steps(spec, bound, self._driver))

    def commit(self) -> Settlement:
        """Commit; a speculative branch commits as its group's winner (`Runtime.resolve`)."""
        group = self.group
        if group is not None and self.settlement is None:
            with self.co.lock:
                first = self.co.core.winner(group) is None
            if first:
                return self.rt.resolve(group, self)[0]
        done = self.commit_now(self._driver.attempts)  # inline unless it must wait or log
        if done is not None:
            return _complete(done)
        return _complete(self._driver.drive(self.commit_steps(self._driver)))

    def abort(self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = "") -> Settlement:
        return self._driver.drive(self.abort_steps(source, detail))

    def active(self) -> contextlib.AbstractContextManager[Tx]:
        """Make this the current transaction for a block, without settling it on leaving.

        For integrations whose transaction outlives one call (a task spanning several chat
        turns, an MCP session): tools called in the block, or in workers the block starts
        through `Runtime.executor`, join it. Settle it with `commit()` or `abort()`.
        """
        return _activated(self)

    def __enter__(self) -> Tx:
        self._token = _current.set(self)
        if not self._own:
            self.rt._blocks[self.txid] = get_ident()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
            self.rt._blocks.pop(self.txid, None)
        if exc is None:
            if self.settlement is None:
                if self._autocommit:
                    self.commit()
                else:  # seal(), without its frame: every branch leaves its block this way
                    lock = self.co.lock
                    lock.acquire()
                    try:
                        self.co.core.seal(self.txid)
                    finally:
                        lock.release()
                    return False
        elif not (isinstance(exc, TransactionAborted) and exc.txid == self.txid):
            self.abort(_abort_source(exc), f"{type(exc).__name__}: {exc}")
        return False


@contextlib.contextmanager
def _activated(tx: Any) -> Iterator[Any]:
    if _current.get() is tx:  # already its own block's (or an enclosing active()'s)
        yield tx
        return
    token = _current.set(tx)
    tx.rt._blocks[tx.txid] = get_ident()
    try:
        yield tx
    finally:
        _current.reset(token)
        tx.rt._blocks.pop(tx.txid, None)


class ATx(TxSession):
    """The asyncio transaction handle; same contract as Tx."""

    __slots__ = ("rt", "_driver", "_token", "_own")

    rt: Runtime
    _driver: _AsyncDriver
    _token: contextvars.Token[Any] | None
    _own: bool  # begun by the runtime for one call outside any transaction

    def _attach(self, rt: Runtime, driver: _AsyncDriver) -> None:
        self._bind(rt.coordinator)
        self.rt = rt
        self._driver = driver
        self._token = None
        self._own = False

    @property
    def session(self) -> TxSession:
        """The driver-agnostic session: this handle itself."""
        return self

    async def read(self, *scopes: str | Scope) -> None:
        await self._driver.adrive(self.read_steps(scopes, self._driver))

    async def stage(self, effect: Effect) -> None:
        await self._driver.adrive(self.stage_steps(effect))

    async def call(self, tool: ToolSpec | Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call `tool` (a ToolSpec, or the shim `rt.tool` made) in this transaction. It waits
        for earlier transactions without blocking the loop, and a sync tool's function runs
        in a worker thread (in a copy of this context, so its own calls join this one)."""
        spec = tool if isinstance(tool, ToolSpec) else getattr(tool, "spec", None)
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"tx.call: {tool!r} is not a tool (a ToolSpec or an rt.tool shim)")
        return await self._call_bound(spec, spec.bind(args, kwargs))

    async def _call_bound(self, spec: ToolSpec, bound: dict[str, Any]) -> Any:
        if spec.is_async:
            return await self._driver.adrive(self.call_steps(spec, bound, self._driver))
        if spec.deferred_only:  # staged or queued: nothing runs now, nothing waits
            return self._call_inline(spec, bound)
        steps = self.call_steps(spec, bound, self._driver)
        return await self._driver.adrive(steps, threaded=True)

    def _call_inline(self, spec: ToolSpec, bound: dict[str, Any]) -> Any:
        """A sync tool called directly from a coroutine: deferred ones stage or queue at
        once; others run here, on the loop's thread, unless the core says Wait, which a sync
        call cannot do without blocking the loop: then it raises, naming `await tx.call`."""
        if spec.deferred_only:
            outcome = self.defer(spec, bound)
            if outcome.__class__ is AbortPlan:
                self._drive_inline(self._abort_and_raise(outcome), spec.name)  # type: ignore[arg-type]
            return outcome
        driver = _InlineDriver(self._driver, spec.name)
        return driver.drive(self.call_steps(spec, bound, driver))

    def _drive_inline(self, steps: Steps, tool: str) -> Any:
        """Drive steps that never wait (staging) from sync code inside this transaction."""
        return _InlineDriver(self._driver, tool).drive(steps)

    async def commit(self) -> Settlement:
        return _complete(await self._driver.adrive(self.commit_steps(self._driver)))

    async def abort(
        self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = ""
    ) -> Settlement:
        return await self._driver.adrive(self.abort_steps(source, detail))

    def active(self) -> contextlib.AbstractContextManager[ATx]:
        """As `Tx.active`: current for a block (a `with`, also inside a coroutine), not
        settled on leaving; settle it with `await commit()` or `await abort()`."""
        return _activated(self)

    async def __aenter__(self) -> ATx:
        self._token = _current.set(self)
        if not self._own:
            self.rt._blocks[self.txid] = get_ident()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
            self.rt._blocks.pop(self.txid, None)
        if exc is None:
            if self.settlement is None:
                await self.commit()
            return False
        if isinstance(exc, TransactionAborted) and exc.txid == self.txid:
            return False
        await self.abort(_abort_source(exc), f"{type(exc).__name__}: {exc}")
        return False


class Savepoint:
    """A `with rt.transaction()` block nested in another transaction of the same runtime.

    Guarantees: it is never an independent transaction. Its calls join the enclosing
    transaction and their effects settle with it, at its commit or abort. Leaving the block
    by an exception (or calling `rollback()`) undoes only what was staged inside it:
    reversible effects are compensated in reverse order, staged and gated ones are dropped,
    and the enclosing transaction stays open. What was undone, and any compensation that
    failed (residue, with its exception), appears in the enclosing settlement.
    """

    __slots__ = ("outer", "_mark")

    def __init__(self, outer: Tx | ATx) -> None:
        self.outer = outer
        self._mark: int | None = None

    def __getattr__(self, name: str) -> Any:  # call, read, stage, txid, settlement, ...
        return getattr(self.outer, name)

    def _entered(self) -> int:
        if self._mark is None:
            raise AtomixError("a savepoint is used as a `with` block; this one was not entered")
        return self._mark

    def _outer_settled(self, exc: BaseException | None) -> bool:
        outer = self.outer
        return outer.settlement is not None or outer.state is ABORTED or (
            isinstance(exc, TransactionAborted) and exc.txid == outer.txid
        )

    def commit(self) -> Settlement:
        raise AtomixError(
            f"transaction {self.outer.txid}: a nested transaction is a savepoint; its effects "
            "settle with the enclosing transaction's (leave the block to keep them, or "
            "call rollback() to undo them)"
        )

    def abort(self, *args: Any, **kwargs: Any) -> Settlement:
        raise AtomixError(
            f"transaction {self.outer.txid}: a nested transaction is a savepoint; call "
            "rollback() to undo what it staged, or abort the enclosing transaction"
        )

    def rollback(self) -> None:
        """Undo what this block has staged so far; the enclosing transaction stays open."""
        outer = self.outer
        assert isinstance(outer, Tx)
        outer._driver.drive(outer.rollback_steps(self._entered()))

    def __enter__(self) -> Savepoint:
        self._mark = self.outer.savepoint()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and not self._outer_settled(exc):
            self.rollback()
        return False


class ASavepoint(Savepoint):
    """The asyncio form of `Savepoint`: `async with rt.atransaction()` nested in another."""

    __slots__ = ()

    async def rollback(self) -> None:  # type: ignore[override]
        outer = self.outer
        assert isinstance(outer, ATx)
        await outer._driver.adrive(outer.rollback_steps(self._entered()))

    async def __aenter__(self) -> ASavepoint:
        self._mark = self.outer.savepoint()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and not self._outer_settled(exc):
            await self.rollback()
        return False


class TransactionExecutor(ThreadPoolExecutor):
    """A thread pool whose tasks run in a copy of the submitter's context, so a tool called
    from a worker joins the transaction that submitted it (as `rt.run_in_executor` does)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        # A fresh copy per task: one Context cannot be entered by two threads at once.
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


class Runtime:
    """Atomix for library users: transactions over shimmed tools, safe across threads and
    asyncio tasks. Effects settle only when a transaction is sealed and no earlier
    conflicting transaction can still arrive; a commit blocked past `timeout` seconds
    aborts with source `timeout`."""

    def __init__(
        self,
        options: RuntimeOptions | None = None,
        *,
        timeout: float | None = 30.0,
        apply_attempts: int = 8,
        clock: Callable[[], float] = time.monotonic,
        keep_settlements: bool = True,
        strict: bool = False,
        log: TxLog | str | os.PathLike[str] | None = None,
        recover: bool = True,
    ) -> None:
        # log: a durable transaction log (a directory, or a TxLog for other settings); with
        # `recover`, what a dead earlier run left in it is finished or aborted now, as far as
        # it can be without this program's tools (see `recover`).
        self.log: TxLog | None = None
        self.recovery: RecoveryReport | None = None
        run_id = None
        if log is not None:
            self.log = log if isinstance(log, TxLog) else TxLog(log)
            if recover:
                self.recovery = _recover(self.log)
            run_id = self.log.begin_run()  # keys stay unique across processes and restarts
        self.coordinator = Coordinator(
            options, apply_attempts=apply_attempts, keep_settlements=keep_settlements, run_id=run_id
        )
        self.coordinator.log = self.log
        self.timeout = timeout
        self._clock = clock
        self._attempts = apply_attempts
        # strict: no call runs outside a transaction (no auto-commit at all).
        self.strict = strict
        # Transactions the user has entered as blocks and not left: txid -> thread ident.
        # Read without a lock (dict operations are atomic) only when a call has no context.
        self._blocks: dict[int, int] = {}
        self._pool: TransactionExecutor | None = None
        # Drivers hold no per-transaction state: one serves every transaction that keeps
        # the runtime's own time-out.
        self._sync_driver = _SyncDriver(timeout, apply_attempts, clock)

    def recover(self) -> RecoveryReport:
        """Finish (committed) or abort (the rest) every transaction a dead earlier run left
        in the durable log, now with this program's tools: call it once the tools are defined
        and before new transactions touch the same resources. Returns what was done and what
        still needs a human; a second call finds nothing to do."""
        if self.log is None:
            raise AtomixError("recover(): this runtime has no durable log (Runtime(log=DIR))")
        self.recovery = _recover(self.log, tools=self.coordinator.tools)
        return self.recovery

    def close(self) -> None:
        """Close the durable log, if any (releasing its directory for another process)."""
        if self.log is not None:
            self.log.close()

    @property
    def core(self):  # noqa: ANN201 - the TransactionManager, for inspection
        return self.coordinator.core

    @property
    def settlements(self) -> list[Settlement]:
        return self.coordinator.settlements

    def transaction(
        self, *, timeout: float | None = _UNSET, group: str | None = None, trace: str | None = None
    ) -> Tx:
        """A transaction, as a `with` block: it commits on a clean exit and aborts on an
        exception. Inside another transaction of this runtime it is a `Savepoint` of it."""
        outer = _current.get()
        if outer is not None and outer.rt is self:
            return self._nested(outer, Tx, timeout, group, trace)  # type: ignore[return-value]
        driver = self._sync_driver if timeout is _UNSET else self._sync_driver_for(timeout)
        lock = self.coordinator.lock
        lock.acquire()  # (not `with`: see Coordinator.lock)
        try:
            tx = self.coordinator.core.begin(group=group, trace=trace, record=Tx)
            tx._attach(self, driver, True)
        finally:
            lock.release()
        return tx

    def branch(self, group: str, index: int, *, timeout: float | None = _UNSET) -> Tx:
        """One speculative branch of `group`; leaving its block seals it, `resolve` settles it."""
        outer = _current.get()
        if outer is not None and outer.rt is self:
            raise AtomixError(
                f"branch {group!r}/{index}: speculative branches are transactions of their own "
                f"and cannot be opened inside transaction {outer.txid}; open them outside it"
            )
        driver = self._sync_driver if timeout is _UNSET else self._sync_driver_for(timeout)
        lock = self.coordinator.lock
        lock.acquire()  # (not `with`: see Coordinator.lock)
        try:
            tx = self.coordinator.core.begin(group=group, trace=group, branch=index, record=Tx)
            tx._attach(self, driver, False)
        finally:
            lock.release()
        return tx

    def _sync_driver_for(self, timeout: float | None) -> _SyncDriver:
        if timeout is _UNSET or timeout == self.timeout:
            return self._sync_driver
        return _SyncDriver(timeout, self._attempts, self._clock)

    def resolve(self, group: str, winner: Tx) -> tuple[Settlement, list[Settlement]]:
        """Commit the winning branch and abort every other branch of its group."""
        co = self.coordinator
        with co.lock:
            done = winner.settlement
            if done is not None and done.committed:
                raise IllegalTransition(winner.txid, "committed", "resolve")
            if done is None and winner.state is not ABORTED:
                resolution = co.core.resolve(group, winner.txid, forget=True)
            else:
                # The winner failed and settled already, or another resolve (a sibling that
                # committed first) aborted it and is settling it now: it cannot win, and
                # settling it here too would race that. Unless a winner was picked before
                # (and stands), every live branch loses with it.
                resolution = (
                    Resolution(None)
                    if co.core.winner(group) is not None
                    else co.core.abort_group(group, forget=True)
                )
                lost = (
                    (done.abort_source, done.detail)
                    if done is not None
                    else (winner.abort_source, winner.abort_detail)
                )
            # The core set each settled loser's settlement on its record, the loser's handle.
            co.adopt(resolution.settled, resolution.woken)
            compensating = (
                [(co.core.get(plan.txid), plan) for plan in resolution.compensate]
                if resolution.compensate
                else None
            )
        losers = resolution.settled  # in begin order
        if compensating:
            settled = {s.txid: s for s in losers}
            drive = winner._driver.drive
            for loser, plan in compensating:
                settled[plan.txid] = drive(loser.settle_abort_steps(plan))  # type: ignore[attr-defined]
            losers = [settled[txid] for txid in sorted(settled)]
        if resolution.decision is None:
            source, detail = lost
            raise TransactionAborted(winner.txid, source or "aborted", detail, done)
        decision = resolution.decision
        if decision.__class__ is CommitPlan:  # the usual case: carried out here, no steps
            done = winner.settle_commit_now(decision, winner._driver.attempts)  # type: ignore[arg-type]
            if done is not None:
                return _complete(done), losers
            steps = winner.settle_commit_steps(decision)  # type: ignore[arg-type]
        else:
            steps = _resume_commit(winner, decision, winner._driver)
        return _complete(winner._driver.drive(steps)), losers

    def atransaction(
        self, *, timeout: float | None = _UNSET, group: str | None = None, trace: str | None = None
    ) -> ATx:
        """The asyncio form of `transaction`; nested in another, an `ASavepoint` of it."""
        outer = _current.get()
        if outer is not None and outer.rt is self:
            return self._nested(outer, ATx, timeout, group, trace)  # type: ignore[return-value]
        driver = _AsyncDriver(self.timeout if timeout is _UNSET else timeout, self._attempts, self._clock)
        co = self.coordinator
        with co.lock:
            tx = co.core.begin(group=group, trace=trace, record=ATx)
            tx._attach(self, driver)
        return tx

    def _nested(
        self, outer: Tx | ATx, kind: type, timeout: Any, group: str | None, trace: str | None
    ) -> Savepoint:
        """A savepoint of `outer`, or a clear error when a nested block cannot be one."""
        if not isinstance(outer, kind):
            want = "async with rt.atransaction()" if isinstance(outer, ATx) else "with rt.transaction()"
            raise AtomixError(
                f"a transaction nested in transaction {outer.txid} is a savepoint of it and "
                f"must use the same driver: use `{want}`"
            )
        if timeout is not _UNSET or group is not None or trace is not None:
            raise AtomixError(
                f"a transaction nested in transaction {outer.txid} is a savepoint of it: it "
                "settles with it and cannot have its own timeout, group or trace"
            )
        return ASavepoint(outer) if kind is ATx else Savepoint(outer)

    def _own_transaction(self, tool: str) -> Tx:
        """The transaction of one call made outside every transaction (auto-commit), unless
        the runtime is strict or the call cannot be told apart from a worker of an open one."""
        if self.strict:
            raise OutsideTransaction(
                f"tool {tool!r} was called outside any transaction, and this runtime is strict "
                "(Runtime(strict=True)): call it inside `with rt.transaction():`"
            )
        blocks = dict(self._blocks)
        if blocks:
            where = ", ".join(
                f"tx{txid} in thread {_thread_name(ident)!r}" for txid, ident in sorted(blocks.items())
            )
            raise OutsideTransaction(
                f"tool {tool!r} was called from thread {threading.current_thread().name!r} outside "
                f"any transaction while {where} is open, so it may belong to it. A worker thread "
                "does not inherit its transaction: submit the work with rt.run_in_executor(fn, ...) "
                "or an rt.executor() pool (or run it in contextvars.copy_context()), or, if the call "
                "is independent, give it its own `with rt.transaction():`"
            )
        tx = self.transaction()
        tx._own = True
        return tx

    def tool_schemas(self) -> list[ToolSchema]:
        """The JSON schema of every tool defined on this runtime (not of a name two functions
        share), computed once per tool; see atomix.schemas."""
        from atomix.schemas import tool_schema

        return [tool_schema(spec) for spec in self.coordinator.tools.values() if spec is not None]

    def executor(self, max_workers: int | None = None) -> TransactionExecutor:
        """A thread pool whose workers' tool calls join the submitting transaction."""
        return TransactionExecutor(max_workers=max_workers, thread_name_prefix="atomix-worker")

    def run_in_executor(
        self, fn: Callable[..., T], /, *args: Any, executor: Executor | None = None, **kwargs: Any
    ) -> Future[T]:
        """Run `fn(*args, **kwargs)` in a worker thread, inside the caller's transaction: its
        tool calls join it. `executor` defaults to a pool of this runtime. (In asyncio,
        `asyncio.to_thread` copies the context too.)"""
        pool: Executor | None = executor
        if pool is None:
            if self._pool is None:
                self._pool = self.executor()
            pool = self._pool
        if isinstance(pool, TransactionExecutor):
            return pool.submit(fn, *args, **kwargs)
        return pool.submit(contextvars.copy_context().run, fn, *args, **kwargs)

    def run(self, body: Callable[[Tx], T], *, retries: int = 3) -> T:
        """Run `body` in a transaction; on a stale abort, retry with a fresh epoch. Inside
        another transaction it runs once, as a savepoint: only the outer one can retry."""
        outer = _current.get()
        if outer is not None and outer.rt is self:
            with self.transaction() as nested:
                return body(nested)  # type: ignore[arg-type]
        for attempt in range(retries + 1):
            try:
                with self.transaction() as tx:
                    return body(tx)
            except TransactionAborted as exc:
                if exc.source != AbortSource.STALE_READ or attempt == retries:
                    raise
        raise AssertionError("unreachable")

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        effect: Any = None,
        reads: ScopeSpec | Iterable[ScopeSpec] | None = None,
        writes: ScopeSpec | Iterable[ScopeSpec] | None = None,
        key: str | Callable[..., Any] | None = None,
        compensate: Callable[[Call], Any] | None = None,
        before: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> Any:
        """Turn a plain function into a shimmed tool (usable as `@rt.tool(...)`).

        Inside a transaction a call registers its read scopes, then runs now (read-only and
        reversible tools), or is staged (bufferable) or queued at the gate (irreversible),
        returning an `Ack`. Outside a transaction the call runs in its own transaction.
        """

        def wrap(f: Callable[..., Any]) -> Any:
            spec = define_tool(
                f,
                effect=effect,
                reads=reads,
                writes=writes,
                key=key,
                compensate=compensate,
                before=before,
                name=name,
                policy=self.coordinator.core.options.scopes,
            )
            # By name, for recovery of a logged effect; a name two different functions share
            # is ambiguous (None).
            known = self.coordinator.tools.get(spec.name, spec)
            same = known is not None and known.fn is spec.fn
            self.coordinator.tools[spec.name] = spec if same else None
            if spec.is_async:

                async def adispatch(bound: dict[str, Any]) -> Any:
                    tx = _current.get()
                    if isinstance(tx, ATx) and tx.rt is self:
                        return await tx._call_bound(spec, bound)
                    if tx is not None:
                        raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                    if self.strict or self._blocks:
                        self._own_transaction(spec.name)  # raises: say why
                    own = self.atransaction()
                    own._own = True
                    async with own:
                        return await own._call_bound(spec, bound)

                shim = with_signature(spec.name, spec.signature, adispatch, is_async=True)
            else:

                deferred_only = spec.deferred_only

                def dispatch(bound: dict[str, Any]) -> Any:
                    tx = _current.get()
                    if tx.__class__ is Tx and tx.rt is self:  # type: ignore[union-attr]
                        if deferred_only:  # _call_bound's first case, without its frame
                            outcome = tx.defer(spec, bound)  # type: ignore[union-attr]
                            if outcome.__class__ is AbortPlan:
                                tx._driver.drive(tx._abort_and_raise(outcome))  # type: ignore[union-attr]
                            return outcome
                        return tx._call_bound(spec, bound)  # type: ignore[union-attr]
                    if tx is not None:
                        if isinstance(tx, ATx) and tx.rt is self:  # from a coroutine: join it
                            return tx._call_inline(spec, bound)
                        raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                    with self._own_transaction(spec.name) as own:
                        return own._call_bound(spec, bound)

                # The shim has the tool's own signature, so Python binds each call.
                shim = with_signature(spec.name, spec.signature, dispatch)
            functools.update_wrapper(shim, f)
            shim.spec = spec  # type: ignore[attr-defined]
            shim.__signature__ = spec.signature  # type: ignore[attr-defined]
            return shim

        return wrap(fn) if fn is not None else wrap


def _thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return f"#{ident} (ended)"


def _complete(settlement: Settlement) -> Settlement:
    """A commit's settlement, or CommitIncomplete when an effect did not land after its
    retries: a commit that lost part of itself must not look like a clean exit."""
    if settlement.failed_applies:
        raise CommitIncomplete(settlement)
    return settlement


def _resume_commit(session: TxSession, decision: Any, driver: _SyncDriver) -> Steps:
    """The winner's steps after resolve decided its commit: carry out the plan, settle the
    abort, or wait like any commit."""
    if isinstance(decision, CommitPlan):
        return (yield from session.settle_commit_steps(decision))
    if isinstance(decision, AbortPlan):
        if session.settlement is not None:  # the winner had already failed and settled
            raise TransactionAborted(
                session.txid, decision.source.value, decision.detail, session.settlement
            )
        settlement = yield from session.settle_abort_steps(decision)
        raise TransactionAborted(session.txid, decision.source.value, decision.detail, settlement)
    # Wait: the winner waits for earlier transactions of other groups like any commit.
    return (yield from session.commit_steps(driver))

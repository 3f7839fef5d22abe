"""The public runtime: a thread-safe synchronous API and an asyncio one over one core."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from atomix.decisions import AbortPlan, CommitPlan, Resolution, Settlement
from atomix.effects import AbortSource, Effect
from atomix.errors import AtomixError, IllegalTransition, TransactionAborted
from atomix.manager import RuntimeOptions
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
        # Settlement may happen on another thread; wake the waiter on its own loop.
        self.loop.call_soon_threadsafe(self.event.set)


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
            if isinstance(instr, Block):
                assert isinstance(instr.signal, _ThreadSignal)
                send = instr.signal.event.wait(instr.timeout)
            elif isinstance(instr, Run):
                try:
                    send = instr.fn()
                except Exception as exc:  # noqa: BLE001 - handed back to the session
                    throw = exc
            elif isinstance(instr, ApplyCommit):
                send = carry_out_commit(instr.plan, attempts=self.attempts)
            elif isinstance(instr, ApplyAbort):
                send = carry_out_abort(instr.plan)


class _AsyncDriver(_SyncDriver):
    def new_signal(self) -> _AsyncSignal:  # type: ignore[override]
        return _AsyncSignal()

    async def adrive(self, steps: Steps) -> Any:
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                instr = steps.throw(throw) if throw is not None else steps.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            if isinstance(instr, Block):
                assert isinstance(instr.signal, _AsyncSignal)
                try:
                    await asyncio.wait_for(instr.signal.event.wait(), instr.timeout)
                    send = True
                except TimeoutError:
                    send = False
            elif isinstance(instr, Run):
                try:
                    send = instr.fn()
                    if asyncio.iscoroutine(send):
                        send = await send
                except Exception as exc:  # noqa: BLE001
                    throw = exc
            elif isinstance(instr, ApplyCommit):
                send = await acarry_out_commit(instr.plan, attempts=self.attempts)
            elif isinstance(instr, ApplyAbort):
                send = await acarry_out_abort(instr.plan)


class Tx(TxSession):
    """A synchronous transaction handle: a session that drives its own steps. As a context
    manager it commits on a clean exit and aborts on an exception (source `tool_failure`
    unless the exception names one)."""

    __slots__ = ("rt", "_driver", "_autocommit", "_token")

    rt: Runtime
    _driver: _SyncDriver
    _autocommit: bool
    _token: contextvars.Token[Any] | None

    # The core makes the handle (it is the core's record, see TxSession); the runtime then
    # attaches its driver side, under the lock that began it.
    def _attach(self, rt: Runtime, driver: _SyncDriver, autocommit: bool) -> None:
        self._bind(rt.coordinator)
        self.rt = rt
        self._driver = driver
        self._autocommit = autocommit
        self._token = None

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
        return self._driver.drive(self.call_steps(spec, bound, self._driver))

    def commit(self) -> Settlement:
        """Commit; a speculative branch commits as its group's winner (`Runtime.resolve`)."""
        group = self.group
        if group is not None and self.settlement is None:
            with self.co.lock:
                first = self.co.core.winner(group) is None
            if first:
                return self.rt.resolve(group, self)[0]
        return self._driver.drive(self.commit_steps(self._driver))

    def abort(self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = "") -> Settlement:
        return self._driver.drive(self.abort_steps(source, detail))

    def __enter__(self) -> Tx:
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
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
            source = getattr(exc, "abort_source", AbortSource.TOOL_FAILURE)
            self.abort(source, f"{type(exc).__name__}: {exc}")
        return False


class ATx(TxSession):
    """The asyncio transaction handle; same contract as Tx."""

    __slots__ = ("rt", "_driver", "_token")

    rt: Runtime
    _driver: _AsyncDriver
    _token: contextvars.Token[Any] | None

    def _attach(self, rt: Runtime, driver: _AsyncDriver) -> None:
        self._bind(rt.coordinator)
        self.rt = rt
        self._driver = driver
        self._token = None

    @property
    def session(self) -> TxSession:
        """The driver-agnostic session: this handle itself."""
        return self

    async def read(self, *scopes: str | Scope) -> None:
        await self._driver.adrive(self.read_steps(scopes, self._driver))

    async def stage(self, effect: Effect) -> None:
        await self._driver.adrive(self.stage_steps(effect))

    async def call(self, spec: ToolSpec, *args: Any, **kwargs: Any) -> Any:
        return await self._call_bound(spec, spec.bind(args, kwargs))

    async def _call_bound(self, spec: ToolSpec, bound: dict[str, Any]) -> Any:
        return await self._driver.adrive(self.call_steps(spec, bound, self._driver))

    async def commit(self) -> Settlement:
        return await self._driver.adrive(self.commit_steps(self._driver))

    async def abort(
        self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = ""
    ) -> Settlement:
        return await self._driver.adrive(self.abort_steps(source, detail))

    async def __aenter__(self) -> ATx:
        self._token = _current.set(self)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if exc is None:
            if self.settlement is None:
                await self.commit()
            return False
        if isinstance(exc, TransactionAborted) and exc.txid == self.txid:
            return False
        source = getattr(exc, "abort_source", AbortSource.TOOL_FAILURE)
        await self.abort(source, f"{type(exc).__name__}: {exc}")
        return False


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
    ) -> None:
        self.coordinator = Coordinator(
            options, apply_attempts=apply_attempts, keep_settlements=keep_settlements
        )
        self.timeout = timeout
        self._clock = clock
        self._attempts = apply_attempts
        # Drivers hold no per-transaction state: one serves every transaction that keeps
        # the runtime's own time-out.
        self._sync_driver = _SyncDriver(timeout, apply_attempts, clock)

    @property
    def core(self):  # noqa: ANN201 - the TransactionManager, for inspection
        return self.coordinator.core

    @property
    def settlements(self) -> list[Settlement]:
        return self.coordinator.settlements

    def transaction(
        self, *, timeout: float | None = _UNSET, group: str | None = None, trace: str | None = None
    ) -> Tx:
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
        steps = (
            winner.settle_commit_steps(decision)  # the usual case, one generator layer less
            if decision.__class__ is CommitPlan
            else _resume_commit(winner, decision, winner._driver)
        )
        return winner._driver.drive(steps), losers

    def atransaction(
        self, *, timeout: float | None = _UNSET, group: str | None = None, trace: str | None = None
    ) -> ATx:
        driver = _AsyncDriver(self.timeout if timeout is _UNSET else timeout, self._attempts, self._clock)
        co = self.coordinator
        with co.lock:
            tx = co.core.begin(group=group, trace=trace, record=ATx)
            tx._attach(self, driver)
        return tx

    def run(self, body: Callable[[Tx], T], *, retries: int = 3) -> T:
        """Run `body` in a transaction; on a stale abort, retry with a fresh epoch."""
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
            if spec.is_async:

                async def adispatch(bound: dict[str, Any]) -> Any:
                    tx = _current.get()
                    if isinstance(tx, ATx) and tx.rt is self:
                        return await tx._call_bound(spec, bound)
                    if tx is not None:
                        raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                    async with self.atransaction() as own:
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
                        raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                    with self.transaction() as own:
                        return own._call_bound(spec, bound)

                # The shim has the tool's own signature, so Python binds each call.
                shim = with_signature(spec.name, spec.signature, dispatch)
            functools.update_wrapper(shim, f)
            shim.spec = spec  # type: ignore[attr-defined]
            shim.__signature__ = spec.signature  # type: ignore[attr-defined]
            return shim

        return wrap(fn) if fn is not None else wrap


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

"""The public runtime: a thread-safe synchronous API and an asyncio one over one core."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from atomix.decisions import AbortPlan, Resolution, Settlement
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
from atomix.tools import Call, ScopeSpec, ToolSpec, define_tool
from atomix.transaction import TxState

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


class Tx:
    """A synchronous transaction handle. As a context manager it commits on a clean exit
    and aborts on an exception (source `tool_failure` unless the exception names one)."""

    __slots__ = ("rt", "session", "_driver", "_autocommit", "_token")

    def __init__(self, rt: Runtime, session: TxSession, driver: _SyncDriver, autocommit: bool) -> None:
        self.rt = rt
        self.session = session
        self._driver = driver
        self._autocommit = autocommit
        self._token: contextvars.Token[Any] | None = None

    txid = property(lambda self: self.session.txid)
    epoch = property(lambda self: self.session.epoch)
    settlement = property(lambda self: self.session.settlement)

    def read(self, *scopes: str | Scope) -> None:
        self._driver.drive(self.session.read(scopes, self._driver))

    def externalize(self, *scopes: str | Scope) -> None:
        self._driver.drive(self.session.externalize(scopes, self._driver))

    def stage(self, effect: Effect) -> None:
        self._driver.drive(self.session.stage(effect))

    def call(self, spec: ToolSpec, *args: Any, **kwargs: Any) -> Any:
        if spec.deferred_only:
            outcome = self.session.defer(spec, spec.bind(args, kwargs))
            if outcome.__class__ is AbortPlan:
                self._driver.drive(self.session._abort_and_raise(outcome))
            return outcome
        return self._driver.drive(self.session.call(spec, spec.bind(args, kwargs), self._driver))

    def seal(self) -> None:
        self.session.seal()

    def commit(self) -> Settlement:
        """Commit; a speculative branch commits as its group's winner (`Runtime.resolve`)."""
        group = self.session.group
        if group is not None and self.session.settlement is None:
            with self.rt.coordinator.lock:
                first = self.rt.core.winner(group) is None
            if first:
                return self.rt.resolve(group, self)[0]
        return self._driver.drive(self.session.commit(self._driver))

    def abort(self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = "") -> Settlement:
        return self._driver.drive(self.session.abort(source, detail))

    def __enter__(self) -> Tx:
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if exc is None:
            if self.session.settlement is None:
                if self._autocommit:
                    self.commit()
                else:
                    self.session.seal()
                    return False
        elif not (isinstance(exc, TransactionAborted) and exc.txid == self.txid):
            source = getattr(exc, "abort_source", AbortSource.TOOL_FAILURE)
            self.abort(source, f"{type(exc).__name__}: {exc}")
        if self.session.group is not None:
            self.rt._untrack(self.session)  # settled: resolve has nothing left to do for it
        return False


class ATx:
    """The asyncio transaction handle; same contract as Tx."""

    def __init__(self, rt: Runtime, session: TxSession, driver: _AsyncDriver) -> None:
        self.rt = rt
        self.session = session
        self._driver = driver
        self._token: contextvars.Token[Any] | None = None

    txid = property(lambda self: self.session.txid)
    epoch = property(lambda self: self.session.epoch)
    settlement = property(lambda self: self.session.settlement)

    async def read(self, *scopes: str | Scope) -> None:
        await self._driver.adrive(self.session.read(scopes, self._driver))

    async def stage(self, effect: Effect) -> None:
        await self._driver.adrive(self.session.stage(effect))

    async def call(self, spec: ToolSpec, *args: Any, **kwargs: Any) -> Any:
        return await self._driver.adrive(
            self.session.call(spec, spec.bind(args, kwargs), self._driver)
        )

    async def commit(self) -> Settlement:
        return await self._driver.adrive(self.session.commit(self._driver))

    async def abort(
        self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = ""
    ) -> Settlement:
        return await self._driver.adrive(self.session.abort(source, detail))

    async def __aenter__(self) -> ATx:
        self._token = _current.set(self)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if exc is None:
            if self.session.settlement is None:
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
        self._branches: dict[str, dict[int, TxSession]] = {}  # unresolved branches by group
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
        session = self._begin(group, trace, 0)
        return Tx(self, session, self._sync_driver_for(timeout), autocommit=True)

    def branch(self, group: str, index: int, *, timeout: float | None = _UNSET) -> Tx:
        """One speculative branch of `group`; leaving its block seals it, `resolve` settles it."""
        session = self._begin(group, group, index)
        return Tx(self, session, self._sync_driver_for(timeout), autocommit=False)

    def _sync_driver_for(self, timeout: float | None) -> _SyncDriver:
        if timeout is _UNSET or timeout == self.timeout:
            return self._sync_driver
        return _SyncDriver(timeout, self._attempts, self._clock)

    def _begin(self, group: str | None, trace: str | None, index: int) -> TxSession:
        co = self.coordinator
        with co.lock:  # one lock round: this is speculation's per-branch cost
            session = co.begin(group=group, trace=trace, branch=index)
            if group is not None:
                # resolve settles each loser through its handle's own session, which so sees it
                self._branches.setdefault(group, {})[session.txid] = session
        return session

    def _untrack(self, session: TxSession) -> None:
        with self.coordinator.lock:
            branches = self._branches.get(session.group or "")
            if branches is not None:
                branches.pop(session.txid, None)
                if not branches:
                    del self._branches[session.group or ""]

    def resolve(self, group: str, winner: Tx) -> tuple[Settlement, list[Settlement]]:
        """Commit the winning branch and abort every other branch of its group."""
        co = self.coordinator
        with co.lock:
            done = winner.session.settlement
            if done is not None and done.committed:
                raise IllegalTransition(winner.txid, "committed", "resolve")
            record = co.core.get(winner.txid) if done is None else None
            if record is not None and record.state is not TxState.ABORTED:
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
                    else (record.abort_source, record.abort_detail)  # type: ignore[union-attr]
                )
            # Each loser's settlement goes to its own handle's session, so the handle sees it.
            sessions = self._branches.pop(group, {})
            co.adopt(resolution.settled, sessions, resolution.woken)
        settled = {s.txid: s for s in resolution.settled}
        for plan in resolution.compensate:
            session = sessions.get(plan.txid) or self._sessions_by_id(plan.txid)
            settled[plan.txid] = winner._driver.drive(session.settle_abort(plan))
        losers = [settled[txid] for txid in sorted(settled)]  # begin order
        if resolution.decision is None:
            source, detail = lost
            raise TransactionAborted(winner.txid, source or "aborted", detail, done)
        steps = _resume_commit(winner.session, resolution.decision, winner._driver)
        return winner._driver.drive(steps), losers

    def _sessions_by_id(self, txid: int) -> TxSession:
        tx = self.coordinator.core.get(txid)
        return TxSession(self.coordinator, txid, tx.epoch, tx.trace, tx.group, tx.branch)

    def atransaction(
        self, *, timeout: float | None = _UNSET, group: str | None = None, trace: str | None = None
    ) -> ATx:
        driver = _AsyncDriver(self.timeout if timeout is _UNSET else timeout, self._attempts, self._clock)
        return ATx(self, self.coordinator.begin(group=group, trace=trace), driver)

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

                @functools.wraps(f)
                async def ashim(*args: Any, **kwargs: Any) -> Any:
                    tx = _current.get()
                    if isinstance(tx, ATx) and tx.rt is self:
                        return await tx.call(spec, *args, **kwargs)
                    if tx is not None:
                        raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                    async with self.atransaction() as own:
                        return await own.call(spec, *args, **kwargs)

                ashim.spec = spec  # type: ignore[attr-defined]
                ashim.__signature__ = spec.signature  # type: ignore[attr-defined]
                return ashim

            @functools.wraps(f)
            def shim(*args: Any, **kwargs: Any) -> Any:
                tx = _current.get()
                if tx.__class__ is Tx and tx.rt is self:  # type: ignore[union-attr]
                    return tx.call(spec, *args, **kwargs)  # type: ignore[union-attr]
                if tx is not None:
                    raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                with self.transaction() as own:
                    return own.call(spec, *args, **kwargs)

            shim.spec = spec  # type: ignore[attr-defined]
            shim.__signature__ = spec.signature  # type: ignore[attr-defined]
            return shim

        return wrap(fn) if fn is not None else wrap


def _resume_commit(session: TxSession, decision: Any, driver: _SyncDriver) -> Steps:
    from atomix.decisions import AbortPlan, CommitPlan

    if isinstance(decision, CommitPlan):
        return (yield from session.settle_commit(decision))
    if isinstance(decision, AbortPlan):
        if session.settlement is not None:  # the winner had already failed and settled
            raise TransactionAborted(
                session.txid, decision.source.value, decision.detail, session.settlement
            )
        settlement = yield from session.settle_abort(decision)
        raise TransactionAborted(session.txid, decision.source.value, decision.detail, settlement)
    # Wait: the winner waits for earlier transactions of other groups like any commit.
    return (yield from session.commit(driver))

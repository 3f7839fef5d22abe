"""The public runtime: transactions over shimmed tools, for threads and asyncio alike.

`Runtime` begins transactions (`transaction`, `atransaction`, `branch`), resolves speculation
groups, and turns plain functions into tools (`tool`). The handles it returns are
`atomix.handles`; a nested block is an `atomix.savepoints.Savepoint`; the drivers that carry
out the steps are `atomix.thread_driver` and `atomix.asyncio_driver`.
"""

from __future__ import annotations

import contextvars
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from atomix.asyncio_driver import AsyncDriver
from atomix.decisions import AbortPlan, CommitPlan, Resolution, Settlement, Wait
from atomix.effects import AbortSource, EffectClass
from atomix.errors import (
    AtomixError,
    IllegalTransition,
    OutsideTransaction,
    TransactionAborted,
)
from atomix.handles import ATx, Tx, check_complete, current_tx
from atomix.instructions import Steps
from atomix.log import TxLog
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.recovery import RecoveryReport
from atomix.recovery import recover as _recover
from atomix.savepoints import ASavepoint, Savepoint
from atomix.session import Coordinator, TxSession
from atomix.thread_driver import SyncDriver
from atomix.tools import Call, ScopeSpec, define_tool, with_signature
from atomix.transaction import ABORTED

if TYPE_CHECKING:
    from atomix.coordinator import CoordinatorSettings, Membership
    from atomix.schemas import ToolSchema

T = TypeVar("T")
_UNSET: Any = object()


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
    aborts with source `timeout`.

    Memory follows the live work, not the work ever done: `settlements` keeps the latest
    `keep_settlements` settlements (default 1000; True: all, False: none), and the core drops
    the scopes settled work left once they can no longer change a decision. Measure it with
    `python -m harness.bench.memory`."""

    def __init__(
        self,
        options: RuntimeOptions | None = None,
        *,
        timeout: float | None = 30.0,
        apply_attempts: int = 8,
        clock: Callable[[], float] = time.monotonic,
        keep_settlements: bool | int = 1000,
        strict: bool = False,
        log: TxLog | str | os.PathLike[str] | None = None,
        recover: bool = True,
        coordinator: str | CoordinatorSettings | None = None,
    ) -> None:
        if options is not None and not (options.gate_irreversible and options.keyed_delivery):
            # Its tool shims gate irreversible calls and hand every function its key: they
            # would silently ignore these switches, so it refuses them instead.
            raise ValueError(
                "Runtime(options=...): gate_irreversible=False and keyed_delivery=False are "
                "ablations honoured only by shims that ask the core (`runs_at_call`) and the "
                "session (`delivery_key`), as the experiment harness's does; Runtime's tool "
                "shims do not, so leave both True"
            )
        # log: a durable transaction log (a directory, or a TxLog for other settings; with a
        # postgresql:// coordinator, "coordinator" keeps it in the coordinator's database, where
        # a survivor on any host recovers it: atomix.coordinator.db_log); with `recover`, what
        # a dead earlier run left in it is finished or aborted now, as far as it can be
        # without this program's tools (see `recover`).
        self.log: TxLog | None = None
        self.recovery: RecoveryReport | None = None
        run_id = None
        if isinstance(log, str) and log == "coordinator":
            from atomix.coordinator.db_log import coordinator_log

            log = coordinator_log(coordinator)
        if log is not None:
            self.log = log if isinstance(log, TxLog) else TxLog(log)
            if recover:
                self.recovery = _recover(self.log)
            run_id = self.log.begin_run()  # keys stay unique across processes and restarts
        self.coordinator = Coordinator(
            options, apply_attempts=apply_attempts, keep_settlements=keep_settlements, run_id=run_id
        )
        self.coordinator.log = self.log
        # coordinator: a URL (or CoordinatorSettings) shared with other processes' runtimes;
        # the core becomes a replica of its event log (see atomix.coordinator).
        self.membership: Membership | None = None
        if coordinator is not None:
            from atomix.coordinator import attach

            self.membership = attach(self.coordinator, coordinator, log=self.log)
        self.timeout = timeout
        self._clock = clock
        self._attempts = apply_attempts
        # strict: no call runs outside a transaction (no auto-commit at all).
        self.strict = strict
        # Transactions the user has entered as blocks and not left: txid -> thread ident.
        # Read without a lock (dict operations are atomic) only when a call has no context.
        self._blocks: dict[int, int] = {}
        # Threads started while a block was open, still alive after it (see
        # `atomix.handles.block_closed`): their calls outside any transaction are refused.
        self._block_threads: dict[int, frozenset[int]] = {}
        self._late_threads: dict[int, tuple[threading.Thread, int]] = {}
        self._pool: TransactionExecutor | None = None
        # Drivers hold no per-transaction state: one serves every transaction that keeps
        # the runtime's own time-out.
        self._sync_driver = SyncDriver(timeout, apply_attempts, clock)

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
        """Close the durable log, if any (releasing its directory for another process), and
        leave the coordinator, if any.

        Refused (AtomixError, nothing closed) while a transaction of this runtime is
        unsettled: released, the log would let a new runtime's recovery compensate the
        transaction while it is still live, and its own end would settle it again. Commit or
        abort every transaction first."""
        self._refuse_close_while_live()
        if self.membership is not None:
            self.membership.close()
        if self.log is not None:
            self.log.close()

    def _refuse_close_while_live(self) -> None:
        logged = self.log is not None and not self.log.closed
        if not logged and getattr(self, "membership", None) is None:
            return  # nothing is released that another runtime could recover
        membership = getattr(self, "membership", None)
        if membership is not None and membership.out_of_its_hands():
            return  # fenced: a survivor recovers its transactions, whatever it does now
        with self.coordinator.lock:
            live = sorted(tx.txid for tx in self.coordinator.core.active())
        if live:
            names = ", ".join(f"tx{txid}" for txid in live[:10]) + (" ..." if len(live) > 10 else "")
            raise AtomixError(
                f"Runtime.close(): {len(live)} transaction(s) still unsettled ({names}); commit "
                "or abort them first (leave their blocks), or the durable log's next owner "
                "would recover them while they are live"
            )

    @property
    def core(self) -> TransactionManager:
        """The transaction manager, for inspection."""
        return self.coordinator.core

    @property
    def settlements(self) -> list[Settlement]:
        return self.coordinator.settlements

    def transaction(
        self, *, timeout: float | None = _UNSET, group: str | None = None, trace: str | None = None
    ) -> Tx | Savepoint:
        """A transaction, as a `with` block: it commits on a clean exit and aborts on an
        exception. Inside another transaction of this runtime it is a `Savepoint` of it."""
        outer = current_tx.get()
        if outer is not None and outer.rt is self:
            self._check_nested(outer, Tx, timeout, group, trace)
            return Savepoint(outer)
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
        outer = current_tx.get()
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

    def _sync_driver_for(self, timeout: float | None) -> SyncDriver:
        if timeout is _UNSET or timeout == self.timeout:
            return self._sync_driver
        return SyncDriver(timeout, self._attempts, self._clock)

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
                assert isinstance(loser, TxSession)  # every record of a coordinator's core is one
                settled[plan.txid] = drive(loser.settle_abort_steps(plan))
            losers = [settled[txid] for txid in sorted(settled)]
        if resolution.decision is None:
            source, detail = lost
            raise TransactionAborted(winner.txid, source or "aborted", detail, done)
        decision = resolution.decision
        if decision.__class__ is CommitPlan:  # the usual case: carried out here, no steps
            done = winner.settle_commit_now(decision, winner._driver.attempts)
            if done is not None:
                return check_complete(done), losers
            steps = winner.settle_commit_steps(decision)
        else:
            steps = _resume_commit(winner, decision, winner._driver)
        return check_complete(winner._driver.drive(steps)), losers

    def atransaction(
        self, *, timeout: float | None = _UNSET, group: str | None = None, trace: str | None = None
    ) -> ATx | ASavepoint:
        """The asyncio form of `transaction`; nested in another, an `ASavepoint` of it."""
        outer = current_tx.get()
        if outer is not None and outer.rt is self:
            self._check_nested(outer, ATx, timeout, group, trace)
            return ASavepoint(outer)
        driver = AsyncDriver(self.timeout if timeout is _UNSET else timeout, self._attempts, self._clock)
        co = self.coordinator
        with co.lock:
            tx = co.core.begin(group=group, trace=trace, record=ATx)
            tx._attach(self, driver)
        return tx

    def _check_nested(
        self,
        outer: Tx | ATx,
        kind: type[Tx] | type[ATx],
        timeout: float | None,
        group: str | None,
        trace: str | None,
    ) -> None:
        """Raise a clear error when a block nested in `outer` cannot be a savepoint of it."""
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

    def _own_transaction(self, tool: str) -> Tx:
        """The transaction of one call made outside every transaction (auto-commit), unless
        the runtime is strict or the call cannot be told apart from a worker of an open one
        (or a late one of a block that has ended)."""
        self._refuse_outside(tool)
        tx = self.transaction()
        assert isinstance(tx, Tx)  # outside every transaction: never a savepoint
        tx._own = True
        return tx

    def _refuse_outside(self, tool: str) -> None:
        """Raise OutsideTransaction if a call outside every transaction must not auto-commit."""
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
        if self._late_threads:
            late = self._late_threads.get(threading.get_ident())
            if late is not None and late[0] is threading.current_thread():
                raise OutsideTransaction(
                    f"tool {tool!r} was called outside any transaction from thread "
                    f"{late[0].name!r}, which was started while tx{late[1]} was open and has "
                    f"outlived it: the call may be a late task of tx{late[1]}, which has ended, so "
                    "it is refused rather than committed on its own. Submit a transaction's work "
                    "with rt.run_in_executor(fn, ...) or an rt.executor() pool (a late call then "
                    "fails with its transaction), or, if the call is independent, give it its "
                    "own `with rt.transaction():`"
                )

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

    def run(self, body: Callable[[Tx | Savepoint], T], *, retries: int = 3) -> T:
        """Run `body` in a transaction; on a stale abort, retry with a fresh epoch. Inside
        another transaction it runs once, as a savepoint: only the outer one can retry.

        A retry first claims what the failed attempt read and wrote (`Tx.reserve`): it waits
        for the earlier transactions holding those scopes, and later ones wait for it there.
        Without the claim a retry is the newest transaction on its scopes every time, the
        one an earlier writer makes stale, and under contention it can lose every attempt."""
        outer = current_tx.get()
        if outer is not None and outer.rt is self:
            with self.transaction() as nested:
                return body(nested)
        claim: tuple[str, ...] = ()
        for attempt in range(retries + 1):
            try:
                with self.transaction() as tx:
                    assert isinstance(tx, Tx)  # outside every transaction: never a savepoint
                    if claim:
                        tx.reserve(*claim)
                    return body(tx)
            except TransactionAborted as exc:
                if exc.source != AbortSource.STALE_READ or attempt == retries:
                    raise
                done = exc.settlement
                if isinstance(done, Settlement):
                    claim = tuple(dict.fromkeys((*claim, *done.reads, *done.writes)))
        raise AssertionError("unreachable")

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        effect: EffectClass | str | None = None,
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
                    tx = current_tx.get()
                    if isinstance(tx, ATx) and tx.rt is self:
                        return await tx._call_bound(spec, bound)
                    if tx is not None:
                        raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                    if self.strict or self._blocks or self._late_threads:
                        self._refuse_outside(spec.name)
                    own = self.atransaction()
                    assert isinstance(own, ATx)  # outside every transaction: never a savepoint
                    own._own = True
                    async with own:
                        return await own._call_bound(spec, bound)

                shim = with_signature(spec.name, spec.signature, adispatch, is_async=True)
            else:

                deferred_only = spec.deferred_only

                def dispatch(bound: dict[str, Any]) -> Any:
                    tx = current_tx.get()
                    if tx.__class__ is Tx and tx.rt is self:
                        if deferred_only:  # _call_bound's first case, without its frame
                            outcome = tx.defer(spec, bound)
                            if outcome.__class__ is AbortPlan:
                                tx._driver.drive(tx._abort_and_raise(outcome))
                            return outcome
                        return tx._call_bound(spec, bound)
                    if tx is not None:
                        if isinstance(tx, ATx) and tx.rt is self:  # from a coroutine: join it
                            return tx._call_inline(spec, bound)
                        raise AtomixError(f"tool {spec.name!r}: called inside a transaction of another runtime or driver")
                    with self._own_transaction(spec.name) as own:
                        return own._call_bound(spec, bound)

                # The shim has the tool's own signature, so Python binds each call.
                shim = with_signature(spec.name, spec.signature, dispatch)
            functools.update_wrapper(shim, f)
            # A function's attributes live in its __dict__: set there, they are typed.
            shim.__dict__["spec"] = spec
            shim.__dict__["__signature__"] = spec.signature
            return shim

        return wrap(fn) if fn is not None else wrap


def _thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return f"#{ident} (ended)"


def _resume_commit(
    session: TxSession, decision: CommitPlan | Wait | AbortPlan, driver: SyncDriver
) -> Steps:
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

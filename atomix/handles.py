"""The runtime's transaction handles: `Tx` (synchronous) and `ATx` (asyncio).

A handle is the core's own record of its transaction (a session, see `atomix.session`) that
drives its own steps: `Tx` with the threaded driver, `ATx` with the asyncio driver. As a
`with` block a handle is the current transaction of its thread or task (`current_transaction`),
so the tools called in it join it. The runtime makes handles; a handle knows the runtime that
began it only by what it uses of it (`TxOwner`), so imports run one way.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from _thread import get_ident
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol, TypeVar

from atomix.asyncio_driver import AsyncDriver
from atomix.decisions import AbortPlan, Settlement
from atomix.effects import REVERSIBLE, AbortSource, Effect
from atomix.errors import CommitIncomplete, TransactionAborted
from atomix.inline import InlineSession
from atomix.instructions import Steps
from atomix.scopes import Scope
from atomix.session import Coordinator, TxSession
from atomix.thread_driver import InlineDriver, SyncDriver
from atomix.tools import ToolSpec

current_tx: contextvars.ContextVar[Tx | ATx | None] = contextvars.ContextVar(
    "atomix_current_tx", default=None
)


def current_transaction() -> Tx | ATx | None:
    """The transaction the calling thread or task is inside, if any."""
    return current_tx.get()


class TxOwner(Protocol):
    """What a handle uses of the runtime that began it (a `Runtime` is one)."""

    coordinator: Coordinator
    # Transactions entered as blocks and not left: txid -> the ident of the entering thread.
    _blocks: dict[int, int]
    # Per open block, the threads alive when it was entered; and the threads started while
    # a block was open that outlived it: ident -> (the thread, that block's txid).
    _block_threads: dict[int, frozenset[int]]
    _late_threads: dict[int, tuple[threading.Thread, int]]

    def resolve(self, group: str, winner: Tx) -> tuple[Settlement, list[Settlement]]: ...


def abort_source_of(exc: BaseException) -> AbortSource | str:
    """Why an exception leaving a transaction's block aborts it: the source it names, else
    `cancelled` for a cancellation or an interrupt (CancelledError, KeyboardInterrupt,
    SystemExit: not an Exception), else `tool_failure`."""
    source: AbortSource | str | None = getattr(exc, "abort_source", None)
    if source is not None:
        return source
    return AbortSource.TOOL_FAILURE if isinstance(exc, Exception) else AbortSource.CANCELLED


def check_complete(settlement: Settlement) -> Settlement:
    """A commit's settlement, or CommitIncomplete when an effect did not land after its
    retries: a commit that lost part of itself must not look like a clean exit."""
    if settlement.failed_applies:
        raise CommitIncomplete(settlement)
    return settlement


class Tx(InlineSession):
    """A synchronous transaction handle: a session that drives its own steps. As a context
    manager it commits on a clean exit and aborts on an exception (source `tool_failure`
    unless the exception names one)."""

    __slots__ = ("rt", "_driver", "_autocommit", "_token", "_own")

    rt: TxOwner
    _driver: SyncDriver
    _autocommit: bool
    _token: contextvars.Token[Tx | ATx | None] | None
    _own: bool  # begun by the runtime for one call outside any transaction

    # The core makes the handle (it is the core's record, see TxSession); the runtime then
    # attaches its driver side, under the lock that began it.
    def _attach(self, rt: TxOwner, driver: SyncDriver, autocommit: bool) -> None:
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

    def reserve(self, *scopes: str | Scope) -> None:
        """Claim scopes before touching them: later transactions that touch one wait for
        this one, and this waits until every earlier holder of one has settled (see
        `TransactionManager.reserve`; `Runtime.run` claims a failed attempt's footprint)."""
        self._driver.drive(self.reserve_steps(scopes, self._driver))

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
            return check_complete(done)
        return check_complete(self._driver.drive(self.commit_steps(self._driver)))

    def abort(self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = "") -> Settlement:
        settlement: Settlement = self._driver.drive(self.abort_steps(source, detail))
        return settlement

    def active(self) -> contextlib.AbstractContextManager[Tx]:
        """Make this the current transaction for a block, without settling it on leaving.

        For integrations whose transaction outlives one call (a task spanning several chat
        turns, an MCP session): tools called in the block, or in workers the block starts
        through `Runtime.executor`, join it. Settle it with `commit()` or `abort()`.
        """
        return activated(self)

    def __enter__(self) -> Tx:
        self._token = current_tx.set(self)
        if not self._own:
            block_opened(self.rt, self.txid)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if self._token is not None:
            current_tx.reset(self._token)
            self._token = None
            block_closed(self.rt, self.txid)
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
            self.abort(abort_source_of(exc), f"{type(exc).__name__}: {exc}")
        return False


class ATx(TxSession):
    """The asyncio transaction handle; same contract as Tx."""

    __slots__ = ("rt", "_driver", "_token", "_own")

    rt: TxOwner
    _driver: AsyncDriver
    _token: contextvars.Token[Tx | ATx | None] | None
    _own: bool  # begun by the runtime for one call outside any transaction

    def _attach(self, rt: TxOwner, driver: AsyncDriver) -> None:
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
                self._drive_inline(self._abort_and_raise(outcome), spec.name)
            return outcome
        driver = InlineDriver(self._driver, spec.name)
        return driver.drive(self.call_steps(spec, bound, driver))

    def _drive_inline(self, steps: Steps, tool: str) -> Any:
        """Drive steps that never wait (staging) from sync code inside this transaction."""
        return InlineDriver(self._driver, tool).drive(steps)

    async def commit(self) -> Settlement:
        return check_complete(await self._driver.adrive(self.commit_steps(self._driver)))

    async def abort(
        self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = ""
    ) -> Settlement:
        settlement: Settlement = await self._driver.adrive(self.abort_steps(source, detail))
        return settlement

    def active(self) -> contextlib.AbstractContextManager[ATx]:
        """As `Tx.active`: current for a block (a `with`, also inside a coroutine), not
        settled on leaving; settle it with `await commit()` or `await abort()`."""
        return activated(self)

    async def __aenter__(self) -> ATx:
        self._token = current_tx.set(self)
        if not self._own:
            block_opened(self.rt, self.txid)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._token is not None:
            current_tx.reset(self._token)
            self._token = None
            block_closed(self.rt, self.txid)
        if exc is None:
            if self.settlement is None:
                await self.commit()
            return False
        if isinstance(exc, TransactionAborted) and exc.txid == self.txid:
            return False
        await self.abort(abort_source_of(exc), f"{type(exc).__name__}: {exc}")
        return False


_Handle = TypeVar("_Handle", Tx, ATx)


@contextlib.contextmanager
def activated(tx: _Handle) -> Iterator[_Handle]:
    """Make `tx` the current transaction for a block (see `Tx.active`)."""
    if current_tx.get() is tx:  # already its own block's (or an enclosing active()'s)
        yield tx
        return
    token = current_tx.set(tx)
    block_opened(tx.rt, tx.txid)
    try:
        yield tx
    finally:
        current_tx.reset(token)
        block_closed(tx.rt, tx.txid)


# Pools whose workers run every task in a copy of the submitter's context (`rt.executor()`,
# asyncio's default executor behind `asyncio.to_thread`): a call from one without a
# transaction was made outside every transaction, so their threads are never suspects.
_CONTEXT_POOLS = ("atomix-worker", "asyncio_")


def block_opened(rt: TxOwner, txid: int) -> None:
    """A transaction block was entered on this thread: note it, and which threads exist."""
    rt._blocks[txid] = get_ident()
    # One thread: nothing to enumerate (the usual case, without threading.enumerate()).
    if threading.active_count() > 1:
        rt._block_threads[txid] = frozenset(t.ident for t in threading.enumerate() if t.ident)
    else:
        rt._block_threads[txid] = frozenset((get_ident(),))


def block_closed(rt: TxOwner, txid: int) -> None:
    """A block was left. A thread started while it was open (a plain pool's worker, made
    at the block's submit) that is still alive may run a task of the block late, after its
    transaction has ended: without the block's context its call would otherwise commit on its
    own, so such a thread is remembered, and `Runtime` refuses its calls outside every
    transaction (see `Runtime._own_transaction`)."""
    rt._blocks.pop(txid, None)
    before = rt._block_threads.pop(txid, None)
    late = rt._late_threads
    if late:  # forget the threads that have ended
        for ident, (thread, _) in list(late.items()):
            if not thread.is_alive():
                late.pop(ident, None)
    if before is None or threading.active_count() <= 1:
        return
    me = get_ident()
    for thread in threading.enumerate():
        born = thread.ident
        if (
            born is not None
            and born != me
            and born not in before
            and not thread.name.startswith(_CONTEXT_POOLS)
        ):
            late[born] = (thread, txid)

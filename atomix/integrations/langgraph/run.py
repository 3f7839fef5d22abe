"""The transaction of a whole graph run (boundary "graph"): opened by the caller's block, found
by every node run inside it through a context variable."""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from atomix.decisions import Settlement
from atomix.effects import AbortSource
from atomix.errors import AtomixError, TransactionAborted
from atomix.handles import ATx, Tx
from atomix.runtime import Runtime

# A context variable, not a node attribute: several nodes on one runtime share the run, and
# LangGraph copies the context into the threads and tasks that run the node.
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


def current_run() -> GraphTransaction | None:
    """The graph run whose block encloses this thread or task, if any."""
    return _graph_run.get()


@contextmanager
def open_run(runtime: Runtime, *, trace: str | None) -> Iterator[GraphTransaction]:
    """A synchronous graph run's transaction as a block (see GraphTransaction). The caller
    has checked that no transaction is open here: the run's is one of its own."""
    tx = runtime.transaction(trace=trace)
    assert isinstance(tx, Tx), "a graph run's transaction is never a savepoint"
    run = GraphTransaction(runtime, tx)
    token = _graph_run.set(run)
    try:
        with tx:
            yield run
    finally:
        _graph_run.reset(token)
    run._raise_if_lost()


@asynccontextmanager
async def aopen_run(runtime: Runtime, *, trace: str | None) -> AsyncIterator[GraphTransaction]:
    """An async graph run's transaction as a block (see GraphTransaction). The caller has
    checked that no transaction is open here: the run's is one of its own."""
    tx = runtime.atransaction(trace=trace)
    assert isinstance(tx, ATx), "a graph run's transaction is never a savepoint"
    run = GraphTransaction(runtime, tx)
    token = _graph_run.set(run)
    try:
        async with tx:
            yield run
    finally:
        _graph_run.reset(token)
    run._raise_if_lost()

"""Savepoints: a transaction block nested in another transaction of the same runtime."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable
from typing import Any, Literal

from atomix.decisions import Settlement
from atomix.errors import AtomixError, TransactionAborted
from atomix.handles import ATx, Tx
from atomix.session import TxSession, current_savepoint
from atomix.transaction import ABORTED


class Savepoint:
    """A `with rt.transaction()` block nested in another transaction of the same runtime.

    Guarantees: it is never an independent transaction. Its calls join the enclosing
    transaction and their effects settle with it, at its commit or abort. Leaving the block
    by an exception (or calling `rollback()`) undoes only what was staged inside it (and in
    blocks nested in it): reversible effects are compensated in reverse order, staged and
    gated ones are dropped, and the enclosing transaction stays open. Savepoints open at the
    same time (in `asyncio.gather` tasks, or `rt.executor()` workers) are isolated: each
    stages into its own, so one's rollback never undoes a sibling's effects, nor what the
    enclosing block staged meanwhile. What was undone, and any compensation that failed
    (residue, with its exception), appears in the enclosing settlement.
    """

    __slots__ = ("outer", "_mark", "_token")

    def __init__(self, outer: Tx | ATx) -> None:
        self.outer = outer
        self._mark: int | None = None
        self._token: contextvars.Token[tuple[TxSession, int] | None] | None = None

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

    def rollback(self) -> Awaitable[None] | None:
        """Undo what this block has staged so far; the enclosing transaction stays open.
        (The asyncio form, `ASavepoint.rollback`, returns an awaitable that does it.)"""
        outer = self.outer
        assert isinstance(outer, Tx)
        outer._driver.drive(outer.rollback_steps(self._entered()))
        return None

    def _open(self) -> None:
        """Open the savepoint and make it this task's or thread's current one: what is
        staged here, until the block ends, belongs to it."""
        mark = self._mark = self.outer.savepoint()
        self._token = current_savepoint.set((self.outer, mark))

    def _close(self) -> None:
        token = self._token
        if token is not None:
            self._token = None
            current_savepoint.reset(token)
        if self._mark is not None:
            self.outer.release_savepoint(self._mark)

    def __enter__(self) -> Savepoint:
        self._open()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        try:
            if exc is not None and not self._outer_settled(exc):
                self.rollback()
        finally:
            self._close()
        return False


class ASavepoint(Savepoint):
    """The asyncio form of `Savepoint`: `async with rt.atransaction()` nested in another."""

    __slots__ = ()

    async def rollback(self) -> None:
        outer = self.outer
        assert isinstance(outer, ATx)
        await outer._driver.adrive(outer.rollback_steps(self._entered()))

    async def __aenter__(self) -> ASavepoint:
        self._open()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            if exc is not None and not self._outer_settled(exc):
                await self.rollback()
        finally:
            self._close()
        return False

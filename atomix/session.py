"""One transaction's protocol steps, written once for every driver, and the coordinator
that every session of one runtime shares.

A `TxSession` step method (`read_steps`, `commit_steps`, ...) is a generator: it talks to
the core under the coordinator's lock and yields an instruction (see `atomix.instructions`)
whenever something must happen outside the core — block until woken, run a tool function,
carry out a settlement plan. A driver (threads, asyncio, or the harness's virtual clock)
executes the instruction and sends the result back. So the rules live in the core, the
sequencing here, and only the waiting differs between drivers. The runtime's own handles
(`Tx`, `ATx` in `atomix.handles`) are sessions that drive their steps themselves.

The coordinator and the session live together: the coordinator makes sessions (`begin`),
and each session works through its coordinator. Their parts are layers, each importing
only the ones below it:

- `atomix.session_coordinator`: the shared core, its lock, settlement history, wake-ups;
- `atomix.session_settle`: the record's keys, its savepoint tree, and settling (a decided
  commit or abort carried out with the durable log's marks, then finished in the core);
- `atomix.session_wait`: the wait loop and the steps that may wait (read, externalize,
  reserve, commit);
- `atomix.session_calls`: the shim (one tool call, by its effect class);
- here: `TxSession`, the whole, and `Coordinator`, which makes them.
"""

from __future__ import annotations

import contextvars
from typing import cast

from atomix.session_calls import CallingSession
from atomix.session_coordinator import SessionCoordinator
from atomix.session_settle import current_savepoint as _current_savepoint

__all__ = ["Coordinator", "TxSession", "current_savepoint"]


class Coordinator(SessionCoordinator):
    """The shared, thread-safe home of one TransactionManager and its wake-ups (see
    `SessionCoordinator`), and the maker of its sessions.

    Every driver of one runtime goes through the same coordinator, so threads and asyncio
    tasks can share transactions' frontiers safely. Guarantees: `begin` registers a new
    transaction in the core and returns its session already bound to this coordinator.
    """

    def begin(
        self, *, group: str | None = None, trace: str | None = None, branch: int = 0
    ) -> TxSession:
        with self.lock:
            tx = self.core.begin(group=group, trace=trace, branch=branch, record=TxSession)
            tx._bind(self)
        return tx


class TxSession(CallingSession):
    """A driver-agnostic handle on one transaction (see the module docstring). It is the
    core's own record of the transaction (the manager makes it, see `Coordinator.begin`),
    with what the driver side adds: the coordinator and the key prefix. So a handle sees its
    state and settlement without asking the core, and after the core has forgotten it.

    Guarantees: those of its layers (`SettlingSession`, `WaitingSession`,
    `CallingSession`); it adds no state of its own."""

    __slots__ = ()

    # Every session is made by a Coordinator (`begin`, or a handle bound to the runtime's).
    co: Coordinator


#: The savepoint the calling task or thread is in: (its transaction's session, savepoint id),
#: set by a savepoint's block. Each asyncio task and each worker started in a copy of the
#: context sees its own, so blocks that run at the same time stage into their own savepoints.
#: (The one variable of `atomix.session_settle`, typed for whole sessions: only those are
#: ever set in it.)
current_savepoint = cast("contextvars.ContextVar[tuple[TxSession, int] | None]", _current_savepoint)

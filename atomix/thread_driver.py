"""The threaded driver: carries out a session's instructions on the calling thread.

A Block waits on a `threading.Event`, so the calling thread sleeps until a settling
transaction (on any thread) sets it or the time-out passes. `InlineDriver` is the same driver
for a sync tool called directly from a coroutine, which must never block its event loop.
"""

from __future__ import annotations

import threading
from typing import Any

from atomix.errors import AtomixError
from atomix.instructions import ApplyAbort, ApplyCommit, Block, Driver, Run, Steps
from atomix.settle import carry_out_abort, carry_out_commit


class ThreadSignal:
    """A waiter's wake-up for a thread: setting it (from any thread) ends the thread's wait."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()

    def set(self) -> None:
        self.event.set()


class SyncDriver(Driver):
    """Drives steps to their end on the calling thread, blocking it while they wait.

    Guarantees: every instruction is carried out where it stands, in order; whatever
    interrupts one (a tool's error, Ctrl-C at a Block) is thrown back into the steps, which
    decide what it means, so `drive` returns the steps' value or raises what they raise.
    """

    def new_signal(self) -> ThreadSignal:
        return ThreadSignal()

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
                    assert isinstance(instr.signal, ThreadSignal)
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


class InlineDriver(SyncDriver):
    """Drives a sync tool's steps on the event loop's thread, for a sync shim called directly
    from a coroutine inside `async with rt.atransaction()`. It cannot wait without blocking
    the loop, so where the core says Wait it raises (before anything is recorded)."""

    def __init__(self, base: Driver, tool: str) -> None:
        super().__init__(base.timeout, base.attempts, base.clock)
        self.tool = tool

    def new_signal(self) -> ThreadSignal:
        raise AtomixError(
            f"tool {self.tool!r} must wait for an earlier transaction on its scopes, and a sync "
            "call made directly from a coroutine cannot wait without blocking the event loop: "
            "inside `async with rt.atransaction() as tx:` call it as "
            "`await tx.call(tool, ...)`, which waits and runs it in a worker thread"
        )

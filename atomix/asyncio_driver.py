"""The asyncio driver: carries out a session's instructions on an event loop's task.

A Block awaits an `asyncio.Event` (woken thread-safely, since a transaction may settle on
another thread), so a waiting transaction never blocks its loop; a sync tool function can run
in a worker thread, in a copy of the task's context; and a durable log's writes (which fsync)
always run in one, each awaited before the next step.
"""

from __future__ import annotations

import asyncio
from typing import Any

from atomix.instructions import ApplyAbort, ApplyCommit, Block, Driver, Run, Steps
from atomix.settle import acarry_out_abort, acarry_out_commit


class AsyncSignal:
    """A waiter's wake-up for an asyncio task: setting it (from any thread) wakes the task on
    its own loop; once that loop is closed there is no one left to wake, and it does nothing."""

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


class AsyncDriver(Driver):
    """Drives steps to their end on the running task, awaiting where they wait.

    Guarantees: as `SyncDriver.drive`, but a Block never blocks the event loop, and a
    CancelledError at one is thrown back into the steps (the transaction aborts with source
    `cancelled`). A driver being closed with its loop (GeneratorExit) carries out nothing:
    its transaction expires at its deadline.
    """

    def new_signal(self) -> AsyncSignal:
        return AsyncSignal()

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
            # As in SyncDriver.drive: a CancelledError at a Block goes back into the steps.
            # Not GeneratorExit: this coroutine is being closed (its loop is gone) and can no
            # longer await anything; its transaction expires at its deadline.
            try:
                if isinstance(instr, Block):
                    assert isinstance(instr.signal, AsyncSignal)
                    try:
                        await asyncio.wait_for(instr.signal.event.wait(), instr.timeout)
                        send = True
                    except TimeoutError:
                        send = False
                elif isinstance(instr, Run):
                    # A durable log write may fsync: never on the loop. Awaited before the
                    # next instruction, so the log's records keep their order.
                    send = await asyncio.to_thread(instr.fn) if threaded or instr.log else instr.fn()
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

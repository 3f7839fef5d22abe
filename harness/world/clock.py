"""A discrete-event virtual clock: agents are coroutines, time is simulated milliseconds.

Tasks await `Sleep`, or `Park` on a `VSignal` with an optional time-out. Events at the same
instant run in the order they were scheduled (a sequence number breaks ties), so a run is
deterministic for a given program and seed, and seconds of simulated waiting cost nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any


class _Command:
    def __await__(self) -> Generator[_Command, Any, Any]:
        return (yield self)


@dataclass(slots=True)
class Sleep(_Command):
    """Advance this task's time by `ms` (0 yields to other tasks at the same instant)."""

    ms: float


@dataclass(slots=True)
class Park(_Command):
    """Block until `signal` is set (result True) or `timeout` ms pass (result False)."""

    signal: VSignal
    timeout: float | None = None


@dataclass(slots=True, eq=False)
class _Task:
    name: str
    coro: Coroutine[Any, Any, Any]
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    token: int = 0  # invalidates a pending time-out once the task was woken
    parked_on: VSignal | None = None


@dataclass(slots=True, eq=False)
class VSignal:
    """A one-shot wake-up on the virtual clock; setting it before anyone parks is remembered."""

    clock: VirtualClock
    is_set: bool = False
    waiter: _Task | None = field(default=None, repr=False)

    def set(self) -> None:
        if self.is_set:
            return
        self.is_set = True
        if self.waiter is not None:
            task, self.waiter = self.waiter, None
            task.token += 1
            self.clock._schedule(self.clock.now, task, True)


class VirtualClock:
    """Runs coroutines against simulated time, deterministically."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, _Task, Any, int]] = []
        self._seq = 0
        self.tasks: list[_Task] = []

    def signal(self) -> VSignal:
        return VSignal(self)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> _Task:
        task = _Task(name or f"task{len(self.tasks)}", coro)
        self.tasks.append(task)
        self._schedule(self.now, task, None)
        return task

    def _schedule(self, when: float, task: _Task, value: Any, token: int | None = None) -> None:
        self._seq += 1
        heapq.heappush(
            self._queue, (when, self._seq, task, value, task.token if token is None else token)
        )

    def run(self, *, until: float | None = None) -> None:
        """Run until no task can make progress (or simulated time passes `until`)."""
        while self._queue:
            when, _, task, value, token = heapq.heappop(self._queue)
            if task.done or token != task.token:
                continue
            if until is not None and when > until:
                heapq.heappush(self._queue, (when, 0, task, value, token))
                break
            self.now = when
            if task.parked_on is not None:
                # Woken (or timed out): detach, so a later set cannot wake it spuriously.
                if task.parked_on.waiter is task:
                    task.parked_on.waiter = None
                task.parked_on = None
            self._step(task, value)

    def _step(self, task: _Task, value: Any) -> None:
        try:
            command = task.coro.send(value)
        except StopIteration as stop:
            task.done, task.result = True, stop.value
            return
        except BaseException as exc:  # noqa: BLE001 - kept on the task, re-raised by the caller
            task.done, task.error = True, exc
            return
        if isinstance(command, Sleep):
            self._schedule(self.now + max(0.0, command.ms), task, None)
        elif isinstance(command, Park):
            signal = command.signal
            if signal.is_set:
                self._schedule(self.now, task, True)
                return
            signal.waiter = task
            task.parked_on = signal
            if command.timeout is not None:
                self._schedule(self.now + max(0.0, command.timeout), task, False)
        else:
            task.done = True
            task.error = TypeError(f"task {task.name} awaited {command!r}, not a clock command")

    def stuck(self) -> list[_Task]:
        """Tasks that never finished: parked forever on a signal nobody set."""
        return [t for t in self.tasks if not t.done]

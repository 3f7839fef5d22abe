"""What passes between a session and its driver.

A session's step generators (see `atomix.session`) yield these instructions whenever
something must happen outside the core, and the driver sends back the result: block until
woken, run a tool function, carry out a settlement plan. `DriverHooks` is what a session
needs from a driver to wait; `Driver` holds the settings the runtime's own drivers share.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from atomix.decisions import AbortPlan, CommitPlan
from atomix.settle import CompensationHook, StepHook


class Signal(Protocol):
    """Something a waiter blocks on and a settling transaction sets."""

    def set(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Block:
    """Wait on `signal` for at most `timeout` driver time units (None: forever); send back
    True if it was set, False on time-out. If the wait is interrupted (CancelledError,
    KeyboardInterrupt, ...), throw that exception in: the session aborts the transaction
    (source `cancelled`), has its plan carried out, and re-raises it. Never GeneratorExit:
    a driver being closed can carry out nothing (its transaction expires at its deadline)."""

    signal: Signal
    timeout: float | None


@dataclass(frozen=True, slots=True)
class Run:
    """Run this tool function now and send back its result (or throw its exception in).
    `log`: it is a durable log write (it may fsync), which a driver with an event loop runs
    off the loop; the steps wait for it either way, so log records keep their order."""

    fn: Callable[[], Any]
    log: bool = False


@dataclass(frozen=True, slots=True)
class ApplyCommit:
    """Carry out a commit plan; call `on_step` (if set: a durable log) after each step."""

    plan: CommitPlan
    on_step: StepHook | None = None


@dataclass(frozen=True, slots=True)
class ApplyAbort:
    """Carry out an abort plan; call `on_compensated` (if set) after each compensation."""

    plan: AbortPlan
    on_compensated: CompensationHook | None = None


Instruction = Block | Run | ApplyCommit | ApplyAbort
Steps = Generator[Instruction, Any, Any]


class DriverHooks(Protocol):
    """What a session needs from its driver to wait: signals, a clock and a time-out."""

    timeout: float | None

    def new_signal(self) -> Signal: ...

    def now(self) -> float: ...


class Driver:
    """The settings of one of the runtime's drivers: how long a transaction waits before it
    aborts (`timeout`, None: forever), how often a commit's apply is tried (`attempts`), and
    the clock both are measured by. Drivers hold no per-transaction state, so one serves
    every transaction with these settings."""

    def __init__(self, timeout: float | None, attempts: int, clock: Callable[[], float]) -> None:
        self.timeout = timeout
        self.attempts = attempts
        self.clock = clock

    def now(self) -> float:
        return self.clock()

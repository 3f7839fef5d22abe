"""SIGINT and SIGTERM without tracebacks, at any moment of a command.

* From the first line of `cli.py` (before the heavy imports) until a run starts, a signal
  ends the process with one line and exit 128 + signal (130 SIGINT, 143 SIGTERM):
  `install_startup_handlers`. What that line says (nothing written yet, or the run is
  complete and only the report was cut short) is set with `set_note`.
* While a run runs, `SignalGuard` turns a signal into `Interrupted` (a KeyboardInterrupt,
  so every `except KeyboardInterrupt` handles it) in the main thread; inside a `critical()`
  section the signal is held until the section ends, so a run directory is never left half
  created. A second signal while the first is being handled is ignored, so the clean-up
  (stopping workers, marking the manifest) is not itself interrupted.

Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_note = "interrupted before the run started; nothing was written"


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM; `exit_code` is 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code(exc: BaseException) -> int:
    """130 for Ctrl-C (a plain KeyboardInterrupt), 128 + signal for `Interrupted`."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


def set_note(text: str) -> None:
    """What the start-up handler says if a signal arrives now."""
    global _note
    _note = text


def _startup_handler(signum: int, frame: FrameType | None) -> None:
    for s in SIGNALS:  # a second signal must not interrupt the exit itself
        signal.signal(s, signal.SIG_IGN)
    try:
        sys.stdout.flush()
        sys.stderr.write(f"atomix: {_note} ({signal.Signals(signum).name})\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    # os._exit, not SystemExit: an exception raised here can land anywhere, and some places
    # wrap it (a signal during a class body's __set_name__, e.g. while a dataclass is built
    # at import, turns SystemExit into a RuntimeError with a traceback; seen in CI). Nothing
    # needs unwinding: no run has started, or its records are complete and closed.
    os._exit(128 + signum)


def _is_cli() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return os.path.basename(sys.argv[0]) == "atomix" or getattr(spec, "name", None) == "cli"


def install_startup_handlers(force: bool = False) -> None:
    """Install the start-up handlers when this process is the `atomix` command (not when
    the CLI module is merely imported, e.g. by tests)."""
    if (force or _is_cli()) and threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            if signal.getsignal(s) is not signal.SIG_IGN:  # e.g. nohup, a background job
                signal.signal(s, _startup_handler)


class SignalGuard:
    """While active (a `with` block in the main thread), SIGINT/SIGTERM raise `Interrupted`
    once; inside `critical()` it is raised when the section ends. Restores the previous
    handlers on exit. Elsewhere than the main thread it does nothing (signals go there)."""

    def __init__(self) -> None:
        self.fired: int | None = None
        self._raised = False
        self._depth = 0
        self._old: dict[int, object] = {}

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:  # ignored on purpose: keep it
                    self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)  # type: ignore[arg-type]
        self._old.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.fired is not None:
            return  # already stopping
        self.fired = signum
        if self._depth == 0:
            self._raised = True
            raise Interrupted(signum)

    @contextmanager
    def critical(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.fired is not None and not self._raised:
            self._raised = True
            raise Interrupted(self.fired)

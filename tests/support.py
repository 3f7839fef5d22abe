"""Helpers shared by the test files (the fixtures built on them are in conftest.py).

Two rules the process helpers keep, so that a test passes however the suite is started and
however loaded the machine is:

* A child's SIGINT and SIGTERM dispositions are explicit (the default action, so the child
  installs its own handlers). A shell starts a background job (`pytest ... &`, `nohup`) with
  SIGINT ignored, every child inherits that, and `atomix run` deliberately keeps a signal it
  finds ignored; a test that sends SIGINT would then see it ignored.
* No wait is a guess. A test waits for what it needs (a file, a lock naming a pid, a count of
  records, a handler installed, a process stopped) with a deadline that only bounds a hang;
  where a check and a signal must see the same moment, the child is frozen (SIGSTOP) between
  them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
BIN = Path(sys.executable).parent

#: Seconds: how long a test waits for something that must happen before calling it a hang.
#: Generous on purpose (a loaded 2-core machine can take seconds to start a Python program);
#: a passing test never waits this long.
HANG_S = 120.0

T = TypeVar("T")


# --------------------------------------------------------------------------- waiting


def wait_until(
    predicate: Callable[[], T], what: str, timeout: float = HANG_S, interval: float = 0.01
) -> T:
    """Poll `predicate` until it returns something true and return that; AssertionError
    naming `what` if it has not after `timeout` seconds (a hang, not a slow machine)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(interval)


def _runqueue_wait_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat; 0
    where the kernel does not keep it, so that a Stopwatch measures plain wall time)."""
    try:
        stat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text()
        return int(stat.split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Stopwatch:
    """`with Stopwatch() as took: ...; took.seconds`: the wall time of the block in this
    thread less the time the thread waited for a CPU (runnable while the machine was busy
    with other work). What is left is the block's own time, computing or blocked (asleep,
    on I/O, waiting for another thread), so a bound on it means the same on an idle machine
    and on a loaded one."""

    seconds: float = 0.0

    def __enter__(self) -> Stopwatch:
        self._wall, self._queued = time.perf_counter(), _runqueue_wait_s()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._wall
        self.seconds = wall - (_runqueue_wait_s() - self._queued)


async def await_until(
    predicate: Callable[[], T], what: str, timeout: float = HANG_S, interval: float = 0.001
) -> T:
    """`wait_until` in a coroutine: polls without blocking its event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        await asyncio.sleep(interval)


# --------------------------------------------------------------------------- processes

# Run in the child between fork and the real program: the signals a test sends get their
# default action (the program then installs its own handlers), and the ones Python ignores
# at start-up are restored as `subprocess`'s restore_signals does for a direct child.
_EXEC_WITH_DEFAULT_SIGNALS = (
    "import os, signal, sys\n"
    "for name in ('SIGINT', 'SIGTERM', 'SIGPIPE', 'SIGXFZ', 'SIGXFSZ'):\n"
    "    if hasattr(signal, name):\n"
    "        signal.signal(getattr(signal, name), signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def with_default_signals(argv: Sequence[str | os.PathLike[str]]) -> list[str]:
    """`argv`, started with SIGINT and SIGTERM at their default action whatever this
    process inherited (SIG_IGN in a background job). The same pid runs `argv` (exec).

    (A trampoline rather than `preexec_fn`: that runs Python in the forked child, which can
    deadlock when the test process has threads, as it does once dask has run.)"""
    return [sys.executable, "-S", "-c", _EXEC_WITH_DEFAULT_SIGNALS, *map(str, argv)]


def cli_argv(*args: Any) -> list[str]:
    """`python -m cli ARGS`: the `atomix` command as a user runs it."""
    return [sys.executable, "-m", "cli", *map(str, args)]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI child: this project first on the path, a wide terminal."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", **extra}


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    new_session: bool = False,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    **kw: Any,
) -> subprocess.Popen[Any]:
    """Start `argv` with explicit (default) SIGINT/SIGTERM dispositions; in its own session
    (and process group, whose id is its pid) if `new_session`. Other keywords go to Popen."""
    return subprocess.Popen(
        with_default_signals(argv),
        cwd=cwd,
        env=cli_env() if env is None else env,
        start_new_session=new_session,
        **kw,
    )


def start_cli(*args: Any, new_session: bool = False) -> subprocess.Popen[str]:
    """`python -m cli ARGS` as its own process (what a user runs), stdout and stderr piped."""
    return spawn(
        cli_argv(*args),
        new_session=new_session,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (R, S, D, T, Z, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def proc_done(pid: int) -> bool:
    """Whether `pid` has exited (a zombie counts: it has finished, only not been reaped)."""
    return proc_state(pid) in (None, "Z", "X")


def group_members(pgid: int) -> list[int]:
    """Processes of a process group that are still running (zombies do not count)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(stat.parent.name))
    return out


def wait_group_gone(pgid: int, timeout: float = HANG_S) -> list[int]:
    """Wait (up to `timeout`) until no process of the group runs; those still running."""
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return group_members(pgid)


def catches(pid: int, signum: int) -> bool:
    """Whether `pid` has a handler installed for `signum` (the kernel's SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@contextmanager
def frozen(pid: int, *, group: bool = False) -> Iterator[None]:
    """`pid` (or its whole process group) stopped with SIGSTOP for the block, and continued
    after it. While frozen nothing it has written can change, so a test can check where it
    is and then send a signal that lands at exactly that point (it is delivered on SIGCONT)."""
    send = os.killpg if group else os.kill
    send(pid, signal.SIGSTOP)
    try:
        members = (lambda: group_members(pid)) if group else (lambda: [pid])
        wait_until(
            lambda: all(proc_state(m) in (None, "T", "Z", "X") for m in members()),
            f"{'the group of ' if group else ''}pid {pid} stopped",
        )
        yield
    finally:
        try:
            send(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def stop(proc: subprocess.Popen[Any], *, group: bool = False) -> None:
    """End a process a test started if it still runs, and reap it (SIGCONT in case it is
    frozen, then SIGKILL); with `group` (it was started in a new session) also whatever of
    its process group outlived it."""
    if proc.poll() is None:  # still our unreaped child: its pid is its own
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                (os.killpg if group else os.kill)(proc.pid, signum)
            except ProcessLookupError:
                pass
    if proc.returncode is None or any(
        p is not None and not p.closed for p in (proc.stdin, proc.stdout, proc.stderr)
    ):
        try:
            proc.communicate(timeout=HANG_S)
        except (subprocess.TimeoutExpired, ValueError):
            pass
    if group and group_members(proc.pid):  # members of the group it led, still running
        for signum in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass


# --------------------------------------------------------------------------- the CLI in-process


def invoke(*args: Any) -> Any:
    """`atomix ARGS` through typer's CliRunner, in this process."""
    from typer.testing import CliRunner

    from cli import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


# --------------------------------------------------------------------------- configs and runs


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    """Write `data` as a YAML config at `path` (its directory created); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run_dirs(out: Path) -> list[Path]:
    """The run directories under a results directory (each has a manifest.json)."""
    return sorted(p.parent for p in out.glob("*/*/manifest.json"))


def manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))


def count_records(path: Path) -> int:
    """Whole lines of a trials.jsonl (0 while it does not exist)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def without_timings(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records without their wall `timings`, sorted by key (what two runs of one config must
    agree on, whatever order their workers finished in)."""
    return sorted(
        ({k: v for k, v in r.items() if k != "timings"} for r in records), key=lambda r: r["key"]
    )

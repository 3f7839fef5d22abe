"""The program the crash-window experiment kills (paper Table 19): run as its own process,
`python -m harness.workloads.crash_child DIR WINDOW PRIOR`, it commits PRIOR transactions of
one SQLite row each through the Atomix runtime with a durable log in DIR, then starts one more
and SIGKILLs itself at WINDOW of that transaction's commit. It imports only `atomix`, so a
child starts in a fraction of a second.

The windows, in the order our durable log (atomix.log) writes a one-row commit:

- `before_intent`: the row is staged in the open transaction; nothing of it is logged.
- `after_intent`: the intent (the pending-log record: the effect and its key) is written;
  no committed mark.
- `after_commit_mark`: the committed mark is durable; the row is not applied yet.
- `after_apply`: the row is applied in SQLite (with its key, in one SQLite transaction); the
  log has not marked it settled.
- `after_settled_mark`: the row is marked settled in the log; the transaction's done mark (which
  deletes its log rows) is not written.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import atomix.log as atomix_log

#: Window -> the log's crash point (atomix.log.crash_hook) right after which the child dies;
#: None: it dies in the transaction body, before commit starts.
WINDOWS: dict[str, str | None] = {
    "before_intent": None,
    "after_intent": "intent.written",
    "after_commit_mark": "commit.marked",
    "after_apply": "step.applied",
    "after_settled_mark": "step.marked",
}
TABLE = "ledger"
#: The row of the transaction in flight when the child dies; earlier ones are `prior<i>`.
IN_FLIGHT = "inflight"
#: Exit status when the crash point was never reached (the child must die before it).
NOT_REACHED = 3


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run(base: Path, window: str, prior: int) -> None:
    """The program under test; it never returns normally: it is killed at `window`."""
    from atomix import Runtime
    from atomix.adapters import SQLiteStore, sqlite_tools

    if window not in WINDOWS:
        raise ValueError(f"unknown window {window!r}; allowed: {', '.join(WINDOWS)}")
    rt = Runtime(log=base / "log", recover=False)
    rows = sqlite_tools(rt, SQLiteStore(base / "db.sqlite"))
    for i in range(prior):
        with rt.transaction():
            rows.put(TABLE, f"prior{i}", {"n": i})
    point = WINDOWS[window]

    def hook(at: str, detail: str) -> None:
        if at == point:
            _die()

    atomix_log.crash_hook = hook
    with rt.transaction():
        rows.put(TABLE, IN_FLIGHT, {"n": prior})
        if point is None:
            _die()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m harness.workloads.crash_child DIR WINDOW PRIOR", file=sys.stderr)
        return 2
    run(Path(argv[0]), argv[1], int(argv[2]))
    print(f"crash point of window {argv[1]!r} never reached", file=sys.stderr)
    return NOT_REACHED


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""A child process of tests/test_coordinator_log.py: a runtime whose durable log is in the
coordinator's PostgreSQL database (``log="coordinator"``), run from a working directory of its
own.

    python tests/coordinator_log_child.py CONFIG_JSON

Roles:
- ``victim``: a reversible user tool (``reserve``: appends ``do ID`` to the shared
  ``effects.txt``; its compensation appends ``undo ID``) runs in a transaction another thread
  keeps open; then a second transaction stages a SQLite row (adapter, bufferable) and a user
  bufferable tool (``note``: appends ``KEY TEXT`` to ``notes.txt``, with no key check of its
  own), and the process SIGKILLs itself at that transaction's committed mark, before either
  is applied. It prints its log's location, run and member first.
- ``survivor``: defines the same tools, waits for `go`, then until a recoverer (its own or
  another's) has recovered a dead member (or `wait` seconds pass), lingers `linger` seconds,
  and prints what it recovered.

Every file the test counts lives in `data` (shared); the child's own directory is `cwd`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import atomix.log as atomix_log
from atomix import Runtime
from atomix.adapters.sqlite import SQLiteStore
from atomix.adapters.tools import sqlite_tools
from atomix.coordinator import CoordinatorSettings


def tools(rt: Runtime, data: Path) -> tuple[Any, Any, Any]:
    """The program's tools, the same in every role (recovery finds them by name)."""
    effects = data / "effects.txt"
    notes = data / "notes.txt"

    def _append(path: Path, line: str) -> None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def undo(call: Any) -> None:
        _append(effects, f"undo {call.args['ident']}")

    @rt.tool(effect="reversible", writes="res:{ident}", compensate=undo)
    def reserve(ident: str) -> str:
        _append(effects, f"do {ident}")
        return ident

    @rt.tool(effect="bufferable", writes="notes:{text}")
    def note(text: str, idempotency_key: str) -> None:
        _append(notes, f"{idempotency_key} {text}")

    return reserve, note, sqlite_tools(rt, SQLiteStore(data / "rows.db"))


def victim(rt: Runtime, data: Path) -> None:
    reserve, note, db = tools(rt, data)
    assert rt.log is not None and rt.membership is not None
    print(json.dumps({"log": rt.log.location, "run": rt.coordinator.run_id,
                      "member": rt.membership.member}), flush=True)
    ran = threading.Event()

    def open_forever() -> None:
        with rt.transaction():
            reserve("A")
            ran.set()
            time.sleep(600)  # uncommitted when the process dies

    threading.Thread(target=open_forever, daemon=True).start()
    assert ran.wait(60)

    def hook(at: str, detail: str) -> None:
        if at == "commit.marked":
            os.kill(os.getpid(), signal.SIGKILL)

    atomix_log.crash_hook = hook
    with rt.transaction():
        db.put("t", "k", "committed")
        note("B")
    raise SystemExit(4)  # the crash point was never reached


def survivor(rt: Runtime, data: Path, cfg: dict[str, Any]) -> None:
    tools(rt, data)
    assert rt.membership is not None
    print("READY", flush=True)
    go = Path(cfg["go"])
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    deadline = time.monotonic() + cfg.get("wait", 60.0)
    store = rt.membership.store
    # Until some recoverer (this one or another) has recovered the dead member.
    while time.monotonic() < deadline and not any(m.status == "recovered" for m in store.members()):
        time.sleep(0.05)
    if cfg.get("linger"):  # let another recoverer's round come and find nothing left
        time.sleep(cfg["linger"])
    found = [
        {"member": r.member, "txids": r.txids, "compensated": r.compensated, "log": r.log}
        for r in rt.membership.recovered
    ]
    errors = [repr(e) for e in rt.membership.errors]
    rt.close()
    print(json.dumps({"recovered": found, "errors": errors, "log": None}), flush=True)


def main(cfg: dict[str, Any]) -> int:
    os.chdir(cfg["cwd"])  # its own working directory: nothing of another process's is here
    settings = CoordinatorSettings(cfg["url"], lease=cfg.get("lease", 1.0), heartbeat=cfg.get("heartbeat", 0.2))
    rt = Runtime(coordinator=settings, log="coordinator", timeout=60.0)
    data = Path(cfg["data"])
    if cfg["role"] == "victim":
        victim(rt, data)
    else:
        survivor(rt, data, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))

"""`atomix recover --coordinator URL` and `atomix mcp-proxy --coordinator URL`, through the
CLI: a killed process's transaction is taken over from its log; two proxies on one
coordinator isolate their calls against each other's; bad input is refused, saying why."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_mcp_proxy import NOTES_POLICY, _atomix, _call, _policy, _upstream, proxied

from atomix.adapters.sqlite import SQLiteStore
from atomix.coordinator import open_store

ROOT = Path(__file__).resolve().parent.parent

# A process that stages a SQLite write in a transaction, commits nothing, and waits to be killed.
_VICTIM = """
import sys, time
from atomix import Runtime
from atomix.adapters.sqlite import SQLiteStore
from atomix.adapters.tools import sqlite_tools
from atomix.coordinator import CoordinatorSettings
rt = Runtime(coordinator=CoordinatorSettings(sys.argv[1], lease=0.5, heartbeat=0.1), log=sys.argv[2])
db = sqlite_tools(rt, SQLiteStore(sys.argv[3]))
tx = rt.transaction()
tx.__enter__()
db.put("t", "k", "never")
print("READY", flush=True)
time.sleep(600)
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_atomix(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_recover_coordinator_takes_over_a_killed_process(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/coordinator.db"
    idle = _cli("recover", "--coordinator", url)
    assert idle.returncode == 0 and "no dead process" in idle.stdout, idle.stderr
    victim = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, url, str(tmp_path / "log"), str(tmp_path / "rows.db")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert victim.stdout is not None and victim.stdout.readline().strip() == "READY"
    # Alive (its log is held): however short the lease, it is not taken over.
    time.sleep(0.8)
    alive = _cli("recover", "--coordinator", url, "--lease", "0.5")
    assert alive.returncode == 0 and "no dead process" in alive.stdout, alive.stdout + alive.stderr
    victim.send_signal(signal.SIGKILL)
    victim.wait(30)
    time.sleep(0.8)
    done = _cli("recover", "--coordinator", url, "--lease", "0.5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 transaction(s) settled (its log recovered)" in done.stdout
    store = open_store(url)
    try:
        statuses = [m.status for m in store.members()]
    finally:
        store.close()
    assert "recovered" in statuses
    rows = SQLiteStore(tmp_path / "rows.db")
    try:
        assert rows.get("t", "k") is None  # never committed: nothing landed
    finally:
        rows.close()
    again = _cli("recover", "--coordinator", url, "--lease", "0.5")
    assert again.returncode == 0 and "no dead process" in again.stdout  # not done twice


def test_recover_coordinator_bad_input(tmp_path: Path) -> None:
    both = _cli("recover", str(tmp_path), "--coordinator", f"sqlite://{tmp_path}/c.db")
    assert both.returncode == 2 and "goes without LOGDIR" in both.stderr
    neither = _cli("recover")
    assert neither.returncode == 2 and "missing LOGDIR" in neither.stderr
    bad = _cli("recover", "--coordinator", "mysql://x")
    assert bad.returncode == 2 and "allowed are" in bad.stderr
    lease = _cli("recover", "--coordinator", f"sqlite://{tmp_path}/c.db", "--lease", "0")
    assert lease.returncode == 2 and "--lease" in lease.stderr


def test_two_proxies_on_one_coordinator_isolate_their_calls(tmp_path: Path) -> None:
    """Proxy B's write of a note proxy A wrote in its open transaction waits until A commits,
    then runs: the two proxies see one order."""
    work = tmp_path / "work"
    url = f"sqlite://{tmp_path}/coordinator.db"
    policy = _policy(tmp_path, NOTES_POLICY)
    options = ("--coordinator", url)

    async def scenario() -> None:
        async with proxied(policy, _upstream(work), tmp_path / "err-a", options=options) as a, \
                proxied(policy, _upstream(work), tmp_path / "err-b", options=options) as b:
            await _call(a, "write_note", name="x", text="A")
            later = asyncio.ensure_future(_call(b, "write_note", name="x", text="B"))
            await asyncio.sleep(1.5)
            assert not later.done()  # B waits for A's unsettled write
            assert (work / "notes" / "x").read_text() == "A"
            await _call(a, "atomix_commit")
            await asyncio.wait_for(later, 60)
            await _call(b, "atomix_commit")
            assert (work / "notes" / "x").read_text() == "B"

    asyncio.run(scenario())


def test_mcp_proxy_refuses_a_bad_coordinator(tmp_path: Path) -> None:
    policy = _policy(tmp_path, NOTES_POLICY)
    run = subprocess.run(
        [*_atomix(), "mcp-proxy", "--policy", str(policy), "--coordinator", "mysql://x", "--",
         *_upstream(tmp_path / "up")],
        input="", capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert run.returncode == 2 and "--coordinator" in run.stderr and "allowed are" in run.stderr


def test_mcp_proxy_log_in_the_coordinator_needs_a_postgresql_one(tmp_path: Path) -> None:
    """`--log coordinator` keeps the proxy's log in a PostgreSQL coordinator's database; with
    an SQLite coordinator it is refused, saying what to do instead (no traceback)."""
    policy = _policy(tmp_path, NOTES_POLICY)
    run = subprocess.run(
        [*_atomix(), "mcp-proxy", "--policy", str(policy), "--log", "coordinator",
         "--coordinator", f"sqlite://{tmp_path}/c.db", "--", *_upstream(tmp_path / "up")],
        input="", capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    assert "--log coordinator" in run.stderr and "postgresql://" in run.stderr
    assert "Traceback" not in run.stderr

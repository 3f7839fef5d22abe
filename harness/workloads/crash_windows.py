"""Crash windows of the SQLite-backed adapter (paper Table 19).

Each trial runs a real program in its own process (`harness.workloads.crash_child`): it
commits 0-2 transactions of one SQLite row each through the Atomix runtime with a durable log,
then starts one more and is killed with SIGKILL at one window of that transaction's commit
(`params.window`). Recovery then runs in the trial's process (`atomix.recovery.recover`, what
`atomix recover DIR` does), and the trial is judged from the SQLite file itself: is the row of
the transaction in flight there (else it is *lost*), was any row applied twice (the store's
applied-key rows per row), are the earlier committed rows intact; and, read before recovery,
was the row applied and was the committed mark in the log at the kill. Lost and duplicated
rows are judged from the file alone; what recovery reports (transactions finished, aborted)
is recorded beside them.

Our log writes the committed mark BEFORE the first apply, so a row is never applied without
it: a transaction killed before its mark is aborted by recovery (its row was never applied and
never will be: "lost" in the paper's sense, an atomic abort in ours), and one killed after it is
finished by recovery, exactly once by its key.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from atomix.log import LOG_FILE
from atomix.recovery import recover
from harness.agents.task import AgentOutcome
from harness.workloads.base import Scenario, WorkloadParams
from harness.workloads.crash_child import IN_FLIGHT, NOT_REACHED, TABLE, WINDOWS
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolDef

Window = Literal["before_intent", "after_intent", "after_commit_mark", "after_apply", "after_settled_mark"]
ROOT = Path(__file__).resolve().parents[2]
#: A child that has not died after this long is stuck: the trial fails.
CHILD_TIMEOUT_S = 60.0
EXTRA = "crash_windows"


class CrashWindowParams(WorkloadParams):
    """`params` of crash_windows: where in the commit the program is killed."""

    window: Window = "after_commit_mark"


class CrashError(RuntimeError):
    """The child did not die by SIGKILL at its window (a broken experiment, not a result)."""


def _kill_and_recover(base: Path, window: str, prior: int) -> dict[str, Any]:
    """Run the child until it is killed at `window`, read what it left, then recover."""
    base.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "harness.workloads.crash_child", str(base), window, str(prior)],
        capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env, cwd=base, check=False,
    )
    if proc.returncode != -signal.SIGKILL:
        why = "its crash point was never reached" if proc.returncode == NOT_REACHED else "it failed"
        raise CrashError(
            f"crash child at window {window!r} exited with status {proc.returncode} ({why}): "
            f"{proc.stderr.strip()[-2000:]}"
        )
    at_kill = {"commit_marked": _commit_marked(base), "applied": IN_FLIGHT in _rows(base)}
    report = recover(base / "log")
    return {
        **at_kill,
        "recovered_finished": len(report.finished),
        "recovered_aborted": len(report.aborted),
        "recovery_clean": report.clean,
    }


def _commit_marked(base: Path) -> bool:
    """Whether the log held the in-flight transaction's committed mark when the child died
    (the earlier transactions finished, so their rows are gone from the log)."""
    path = base / "log" / LOG_FILE
    if not path.exists():
        return False
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT 1 FROM txs WHERE state = 'committed'").fetchone() is not None
    finally:
        conn.close()


def _rows(base: Path) -> dict[str, Any]:
    """The ledger rows in the SQLite file (k -> value)."""
    path = base / "db.sqlite"
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (TABLE,)).fetchone() is None:
            return {}
        return {k: json.loads(v) for k, v in conn.execute(f'SELECT k, v FROM "{TABLE}"')}
    finally:
        conn.close()


def _applications(base: Path) -> dict[str, int]:
    """How many times the store applied a write to each ledger row (one applied-key row per
    application, written in the same SQLite transaction as the row)."""
    path = base / "db.sqlite"
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        counts: dict[str, int] = {}
        for (k,) in conn.execute("SELECT k FROM _atomix_applied WHERE tbl = ?", (TABLE,)):
            counts[k] = counts.get(k, 0) + 1
        return counts
    finally:
        conn.close()


def judge(base: Path, prior: int, at_kill: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's metrics, from the SQLite file after recovery (and what it held at the kill)."""
    rows, applied = _rows(base), _applications(base)
    present = IN_FLIGHT in rows
    expected = {f"prior{i}": {"n": i} for i in range(prior)}
    return {
        # Paper Table 19's "lost effect": the in-flight transaction's row is not there.
        "lost": not present,
        "duplicated_rows": sum(n - 1 for n in applied.values() if n > 1),
        "commit_marked": bool(at_kill["commit_marked"]),
        "applied_at_kill": bool(at_kill["applied"]),
        # The protocol's own promise: a row is there after recovery iff its mark was durable.
        "lost_committed": bool(at_kill["commit_marked"]) and not present,
        "applied_uncommitted": not at_kill["commit_marked"] and present,
        "prior_intact": all(rows.get(k) == v and applied.get(k) == 1 for k, v in expected.items()),
        "recovered_finished": int(at_kill["recovered_finished"]),
        "recovered_aborted": int(at_kill["recovered_aborted"]),
        "recovery_clean": bool(at_kill["recovery_clean"]),
    }


class CrashWindowsWorkload:
    """A program SIGKILLed at one window of a commit, then recovered and judged from its store."""

    name = "crash_windows"
    probes_mechanism = True  # its verdict does not depend on the agent's task
    description = "SIGKILL a real program at one window of a SQLite commit, recover, count lost/duplicated rows"
    tools: Mapping[str, ToolDef] = {}
    Params = CrashWindowParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        window = CrashWindowParams.model_validate(params).window
        prior = rng.randint(0, 2)  # earlier committed transactions recovery must leave alone

        def setup(env: TrialEnv) -> None:
            base = env.workdir / "crash"
            env.extra[EXTRA] = {"base": base, **_kill_and_recover(base, window, prior)}

        def metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
            state = env.extra[EXTRA]
            return judge(state["base"], prior, state)

        return Scenario(tasks=[], setup=setup, metrics=metrics,
                        info={"window": window, "prior": prior, "crash_point": WINDOWS[window]})

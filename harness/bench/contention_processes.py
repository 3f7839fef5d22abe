"""`python -m harness.bench.contention_processes [--coordinator sqlite|URL] [--agents N] [--trials K]`:
tau_contention's agents as separate OS processes on one coordinator, on the real clock.

A benchmark and a demonstration, not a replacement for the deterministic (virtual-clock)
runs of ``configs/tau_contention.yaml``. For each trial it builds the same scenario as the
virtual-clock run (the workload's own `scenario`, seeded from the config's seed and the trial
number): the same tasks (each agent reads a pending order, thinks for a seeded plan delay,
then rewrites the order's address from what it read), the same forced overlap on the
contended orders, the same tau2 tool semantics. Each agent runs in its own OS process with
its own `Runtime`; every agent runs the same tasks, the same tools and the same retry policy
(abort, back off, re-read, up to the scenario's `max_attempts`).

The retail DB of the virtual-clock run is an in-memory, copy-on-write structure of one
process, so the records the agents share (the scenario's orders) live here in a real SQLite
file, one row per order (`atomix.adapters.sqlite.SQLiteStore`, table ``orders``), read and
written through the runtime's shimmed SQLite tools; a tool call runs tau2's own tool function
on the order read from that row. After the trial the rows are laid over a fresh copy of the
retail DB and the scenario's own invariants oracle (the one the virtual-clock run uses) judges
the final state.

Modes:
- ``tx-full``: every process's `Runtime(coordinator=URL)` on one coordinator: one set of
  epochs, frontiers and conflict decisions across the processes.
- ``tx-full, no coordinator`` (the control): the same agents, each process with its own
  in-process `Runtime()`: every guarantee stops at the process boundary, so concurrent
  read-modify-writes of one order can lose updates.

Printed per mode: trials, invariant violations, commits, aborts, the measured waits per task
(real ms that the runtime spent waiting, p50 and p99) and the wall time per trial (from the
first agent's start to the last agent's end). Then, for reference, the same trials of the same
config in the experiment runner (mode tx-full on the virtual clock). Every figure depends on
the machine and its load.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomix import Runtime
from atomix.adapters.sqlite import SQLiteStore
from atomix.adapters.tools import SQLiteTools, sqlite_tools
from atomix.errors import TransactionAborted
from harness.agents.task import AgentOutcome, Task
from harness.experiment.config import load_config
from harness.experiment.trial import derive_rng
from harness.workloads.base import Scenario
from harness.workloads.retail.tools import TOOLS, RetailToolError, call_tool
from harness.workloads.retail.workload import TauContentionWorkload
from harness.world.substrates import TrialEnv

# Relative to the working directory, as every command of the README runs from a checkout
# (an installed package carries no configs/).
CONFIG = Path("configs") / "tau_contention.yaml"
TABLE = "orders"
#: The tools whose whole state is one order record: the ones tau_contention's tasks call
#: (without `notify`). Another tool would need records this module does not share.
ORDER_TOOLS = frozenset({"get_order_details", "modify_pending_order_address"})
MODES = ("tx-full", "tx-full, no coordinator")
#: Seconds a mode's processes may take over all their trials before the run is called stuck.
HANG_S = 600.0


@dataclass
class AgentRun:
    """What one agent (one process) did in one trial; times are real seconds."""

    trial: int
    agent: int
    committed: bool = False
    attempts: int = 0
    aborts: int = 0
    waited: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    error: str = ""


@dataclass
class ModeResult:
    """One mode's trials: per trial, its invariant violations and its agents' runs."""

    mode: str
    coordinator: str | None
    violations: list[int] = field(default_factory=list)
    runs: list[list[AgentRun]] = field(default_factory=list)

    @property
    def commits(self) -> int:
        return sum(r.committed for trial in self.runs for r in trial)

    @property
    def aborts(self) -> int:
        return sum(r.aborts for trial in self.runs for r in trial)

    @property
    def waits_ms(self) -> list[float]:
        return [r.waited * 1e3 for trial in self.runs for r in trial]

    @property
    def walls(self) -> list[float]:
        return [max(r.finished for r in t) - min(r.started for r in t) for t in self.runs if t]

    @property
    def errors(self) -> list[str]:
        return [r.error for trial in self.runs for r in trial if r.error]


def contention_params(agents: int, config: Path = CONFIG) -> tuple[dict[str, Any], int]:
    """The config's params (agents replaced) and seed: the virtual-clock run's scenario."""
    cfg = load_config(config)
    if cfg.workload != TauContentionWorkload.name:
        raise ValueError(f"{config}: workload must be {TauContentionWorkload.name!r}, got {cfg.workload!r}")
    params = {**cfg.params, "agents": agents}
    if params.get("notify"):
        raise ValueError(f"{config}: params.notify: true is not supported here (no shared mailbox)")
    TauContentionWorkload.Params.model_validate(params)  # a clear error before any process starts
    return params, cfg.seed


def scenario(params: Mapping[str, Any], seed: int, trial: int) -> Scenario:
    """The trial's scenario, drawn as the experiment runner draws it."""
    return TauContentionWorkload().scenario(derive_rng(seed, "scenario", trial), trial, params)


def _orders(sc: Scenario) -> list[str]:
    return sorted(set(sc.info["orders"]))


def seed_rows(path: Path, sc: Scenario) -> None:
    """A fresh rows DB holding the scenario's orders as the retail DB has them."""
    env = TrialEnv(None)
    try:
        sc.setup(env)
        db = env.extra["retail"].db
        with SQLiteStore(path, durable=False) as store:
            store.put_many([(TABLE, o, db["orders"][o]) for o in _orders(sc)])
    finally:
        env.close()


def judge(path: Path, sc: Scenario, runs: Sequence[AgentRun]) -> int:
    """The scenario's invariants on the retail DB with the rows' orders laid over it."""
    env = TrialEnv(None)
    try:
        sc.setup(env)
        db = env.extra["retail"].db
        with SQLiteStore(path, durable=False) as store:
            for order_id, record in store.snapshot().get(TABLE, {}).items():
                db["orders"][order_id] = record
        outcomes = [
            AgentOutcome(agent=f"a{r.agent}", task_id=f"rmw{r.agent}", committed=r.committed,
                         attempts=r.attempts)
            for r in runs
        ]
        assert sc.invariants is not None
        return int(sc.invariants(env, outcomes))
    finally:
        env.close()


# -- one agent, in its own process -----------------------------------------------------------
def _call(db: SQLiteTools, name: str, args: dict[str, Any]) -> Any:
    """Retail tool `name` with tau2's semantics on the order held in the shared row."""
    if name not in ORDER_TOOLS:
        raise ValueError(f"tool {name!r}: only {sorted(ORDER_TOOLS)} run across processes here")
    order_id = args["order_id"]
    record = db.get(TABLE, order_id)  # a read of the order's scope, in the transaction
    mini = {"orders": {} if record is None else {order_id: record}}
    result = call_tool(mini, name, args)
    if TOOLS[name].writes:
        db.put(TABLE, order_id, mini["orders"][order_id])
    return result


def _attempt(rt: Runtime, db: SQLiteTools, task: Task, rng: random.Random,
             plan_delay: tuple[float, float]) -> None:
    memory: dict[str, Any] = {}
    with rt.transaction():
        for index, step in enumerate(task.steps):
            lo, hi = plan_delay
            if hi > 0:
                time.sleep(rng.uniform(lo, hi) / 1e3)  # the agent thinks, as in the virtual run
            args = step.args(memory) if callable(step.args) else dict(step.args)
            memory[step.save_as or f"step{index}"] = _call(db, step.tool, args)


def run_agent(rt: Runtime, rows: Path, sc: Scenario, trial: int, agent: int, seed: int) -> AgentRun:
    """Agent `agent`'s task of the trial: attempts until one commits or the policy's budget
    of attempts runs out; an abort backs off (the policy's re-plan backoff) and starts over."""
    policy = sc.policy
    rng = derive_rng(seed, "agent", trial, agent)
    run = AgentRun(trial, agent, started=time.time())
    before = len(rt.settlements)
    store = SQLiteStore(rows, durable=False)
    try:
        db = sqlite_tools(rt, store)
        while run.attempts < policy.max_attempts:
            run.attempts += 1
            try:
                _attempt(rt, db, sc.tasks[agent], rng, policy.plan_delay_ms)
            except TransactionAborted:
                run.aborts += 1
                time.sleep(policy.replan_backoff_ms * rng.uniform(0.5, 1.5) / 1e3)
                continue
            except RetailToolError as exc:  # tau2 refused: the agent gives up, as it would
                run.error = f"tool refused: {exc}"
                break
            run.committed = True
            break
    except Exception as exc:  # noqa: BLE001 - reported with the trial, never lost
        run.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    finally:
        store.close()
    run.finished = time.time()
    run.waited = sum(s.waited for s in rt.settlements[before:])
    return run


def _process(url: str | None, agent: int, trials: list[tuple[int, str]], params: dict[str, Any],
             seed: int, start: Any, out: Any) -> None:  # pragma: no cover - a child process
    rt: Runtime | None = None
    # A stuck agent says where it is stuck (on stderr) before the parent gives up on it.
    faulthandler.dump_traceback_later(HANG_S - 30, exit=False)
    try:
        rt = Runtime(coordinator=url, timeout=120, keep_settlements=True) if url else Runtime(
            keep_settlements=True)
        scenarios = [(t, Path(rows), scenario(params, seed, t)) for t, rows in trials]
        for trial, rows, sc in scenarios:
            start.wait(timeout=HANG_S)  # every agent of the trial starts at once
            out.put(run_agent(rt, rows, sc, trial, agent, seed))
    except BaseException as exc:  # the parent must hear of it, or it would wait for ever
        out.put(AgentRun(-1, agent, error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
    finally:
        if rt is not None:
            rt.close()


def run_mode(url: str | None, agents: int, trials: int, *, workdir: Path,
             params: Mapping[str, Any] | None = None, seed: int | None = None) -> ModeResult:
    """`trials` trials of `agents` processes; `url` None is the control (no coordinator)."""
    if params is None or seed is None:
        params, seed = contention_params(agents)
    params = dict(params)
    mode = MODES[0] if url else MODES[1]
    scenarios = [scenario(params, seed, t) for t in range(trials)]
    plan: list[tuple[int, str]] = []
    for t, sc in enumerate(scenarios):
        rows = workdir / f"trial{t}" / "rows.db"
        rows.parent.mkdir(parents=True, exist_ok=True)
        seed_rows(rows, sc)
        plan.append((t, str(rows)))
    ctx = mp.get_context("spawn")  # nothing inherited: each agent is a process of its own
    start = ctx.Barrier(agents)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_process, args=(url, i, plan, params, seed, start, out), daemon=True)
        for i in range(agents)
    ]
    for p in procs:
        p.start()
    result = ModeResult(mode, url)
    by_trial: dict[int, list[AgentRun]] = {t: [] for t in range(trials)}
    deadline = time.monotonic() + HANG_S
    try:
        got = 0
        while got < agents * trials:
            try:
                run: AgentRun = out.get(timeout=1.0)
            except queue.Empty:
                dead = [f"a{i} (exit {p.exitcode})" for i, p in enumerate(procs) if p.exitcode]
                if dead or time.monotonic() > deadline:
                    missing = {t: sorted(set(range(agents)) - {r.agent for r in runs})
                               for t, runs in by_trial.items() if len(runs) < agents}
                    raise RuntimeError(
                        f"{mode}: agent processes {'died: ' + ', '.join(dead) if dead else 'stuck'}; "
                        f"trials without every agent's result (trial: agents): {missing}"
                    ) from None
                continue
            if run.trial < 0:
                raise RuntimeError(f"agent process a{run.agent} failed: {run.error}")
            by_trial[run.trial].append(run)
            got += 1
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    for t, sc in enumerate(scenarios):
        runs = sorted(by_trial[t], key=lambda r: r.agent)
        result.runs.append(runs)
        result.violations.append(judge(Path(plan[t][1]), sc, runs))
    return result


def virtual_run(agents: int, trials: int, config: Path = CONFIG) -> ModeResult:
    """The deterministic reference: the same trials of the same config in the experiment
    runner, mode tx-full, on the virtual clock (waits in simulated ms)."""
    from harness.experiment.runner import run  # the whole runner only when this is asked for

    cfg = load_config(config, overrides={"trials": trials, "modes": ["tx-full"]},
                      grid={"params.agents": [agents]})
    with tempfile.TemporaryDirectory(prefix="atomix-contention-virtual-") as tmp:
        records = [json.loads(line) for line in run(cfg, out=Path(tmp)).records_path.read_text().splitlines()]
    result = ModeResult("tx-full, virtual clock", None)
    for rec in sorted(records, key=lambda r: r["trial"]):
        result.violations.append(int(rec["metrics"]["invariant_violations"]))
        result.runs.append([
            AgentRun(rec["trial"], i, committed=a["committed"], attempts=a["attempts"],
                     aborts=len(a["aborts"]), waited=a["blocked_ms"] / 1e3, started=0.0,
                     finished=rec["metrics"]["makespan_ms"] / 1e3)
            for i, a in enumerate(rec["agents"])
        ])
    return result


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def report(results: Sequence[ModeResult]) -> list[str]:
    """The printed table, one row per mode."""
    lines = [
        f"{'mode':<24} {'trials':>6} {'violations':>10} {'viol/trial':>10} {'commits':>7} "
        f"{'aborts':>6} {'blocked':>7} {'wait p50 ms':>11} {'wait p99 ms':>11} {'wall s/trial':>12}"
    ]
    for r in results:
        waits = r.waits_ms
        trials = len(r.violations)
        blocked = sum(w > 0 for w in waits)
        wall = sum(r.walls) / len(r.walls) if r.walls else float("nan")
        lines.append(
            f"{r.mode:<24} {trials:>6} {sum(r.violations):>10} "
            f"{sum(r.violations) / max(trials, 1):>10.2f} {r.commits:>7} {r.aborts:>6} "
            f"{blocked:>3}/{len(waits):<3} {_pct(waits, 0.5):>11.1f} {_pct(waits, 0.99):>11.1f} "
            f"{wall:>12.3f}"
        )
        for error in sorted(set(r.errors))[:3]:
            lines.append(f"    agent error: {error.splitlines()[0][:300]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.contention_processes")
    parser.add_argument("--coordinator", default="sqlite",
                        help="'sqlite' (a new file in a temporary directory), sqlite:///PATH or "
                             "postgresql://...")
    parser.add_argument("--agents", type=int, default=4, help="agent processes per trial")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--config", type=Path, default=CONFIG,
                        help="a tau_contention config (its params and seed)")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the control run without a coordinator")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.trials < 1:
        parser.error("--agents and --trials must be >= 1")
    coordinator: str = args.coordinator
    if coordinator != "sqlite" and not coordinator.startswith(("sqlite://", "postgresql://", "postgres://")):
        parser.error(f"--coordinator: 'sqlite', sqlite:///PATH or postgresql://..., got {coordinator!r}")
    try:
        params, seed = contention_params(args.agents, args.config)
    except Exception as exc:  # noqa: BLE001 - a bad config: say which, exit non-zero
        parser.error(f"--config {args.config}: {exc}")
    tmp = Path(tempfile.mkdtemp(prefix="atomix-contention-procs-"))
    try:
        url = f"sqlite://{tmp}/coordinator.db" if coordinator == "sqlite" else coordinator
        print(f"tau_contention as OS processes: {args.agents} agents, {args.trials} trials, "
              f"params {params}, seed {seed}")
        print(f"coordinator {url.split('@')[-1]}; {os.cpu_count()} CPUs, load average {_load()}")
        try:
            results = [run_mode(url, args.agents, args.trials, workdir=tmp / "tx-full",
                                params=params, seed=seed)]
            if not args.no_control:
                results.append(run_mode(None, args.agents, args.trials, workdir=tmp / "control",
                                        params=params, seed=seed))
        except RuntimeError as exc:  # an agent process failed or hung: say so, exit non-zero
            print(f"error: {exc}", file=sys.stderr)
            return 1
        results.append(virtual_run(args.agents, args.trials, args.config))
        for line in report(results):
            print(line)
        print(f"load average after: {_load()}")
        print("waits: ms per task that the runtime spent waiting (real ms; simulated ms on the "
              "virtual clock, whose wall column is the simulated makespan); blocked: tasks that "
              "waited at all")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How the wait path scales: CPU per run against the number of contending agents, on a
log-log fit, for tx-full and the global-frontier ablation, on the harness's tau_contention
and on the runtime's core alone (driven by a small discrete-event simulation here)."""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atomix.decisions import PROCEED, AbortPlan, CommitPlan, Wait
from atomix.effects import REVERSIBLE, Effect
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.transaction import TxState
from harness.bench.figures import Figure, fit_exponent
from harness.bench.trials import configs_dir
from harness.experiment.config import load_config
from harness.experiment.runner import plan
from harness.experiment.trial import run_trial

# ------------------------------------------------------------------ (f) the wait path, with targets
SCALING_NS = (64, 128, 256, 512, 1024)


SCALING_TARGETS = {"tx-full": 1.3, "tx-global-frontier": 1.5}


@dataclass(frozen=True)
class ContentionRun:
    """What one simulated contention run did, and the CPU it cost."""

    agents: int
    commits: int
    aborts: int
    waits: int
    wakes: int
    cpu_s: float


def simulate_contention(
    agents: int,
    *,
    resources: int = 2,
    frontier: str = "per-resource",
    attempts: int = 6,
    seed: int = 2026,
) -> ContentionRun:
    """The core alone, driven on a discrete-event clock (no harness, no threads): `agents`
    read-modify-write one of `resources` scopes each (agent i on scope i mod resources, so
    `resources >= agents` is disjoint). An attempt begins, reads its scope, thinks 20-120
    simulated ms (seeded), then in one step reads and rewrites the scope with a reversible
    effect (5 ms), and commits; a stale abort retries, up to `attempts` attempts. A Wait
    parks the agent until `finish` lists it. Returns the CPU time of the whole run."""
    options = RuntimeOptions(frontier=frontier)  # type: ignore[arg-type]
    mgr = TransactionManager(options)
    rng = random.Random(seed)
    scopes = [mgr.scope(f"bench:r{i}") for i in range(resources)]
    queue: list[tuple[float, int, int]] = []
    seq = itertools.count()
    phase = ["begin"] * agents
    txs: list[Any] = [None] * agents
    tried = [0] * agents
    by_tx: dict[int, int] = {}
    commits = aborts = waits = wakes = 0

    def at(when: float, agent: int) -> None:
        heapq.heappush(queue, (when, next(seq), agent))

    def settle(agent: int, now: float, committed: bool) -> None:
        nonlocal wakes, aborts
        tx = txs[agent]
        _, woken = mgr.finish(tx.txid, forget=True)
        del by_tx[tx.txid]
        wakes += len(woken)
        for txid in woken:
            at(now, by_tx[txid])
        if not committed:
            aborts += 1
            if tried[agent] < attempts:
                phase[agent] = "begin"
                at(now, agent)
                return
        phase[agent] = "done"

    for agent in range(agents):
        at(rng.uniform(0.0, 1.0), agent)
    cpu = time.process_time()
    while queue:
        now, _, agent = heapq.heappop(queue)
        step = phase[agent]
        scope = scopes[agent % resources]
        if step == "begin":
            tried[agent] += 1
            tx = txs[agent] = mgr.begin()
            by_tx[tx.txid] = agent
            step = phase[agent] = "read"
        tx = txs[agent]
        if step == "read":
            decision: Any = mgr.read(tx.txid, (scope,))
            if decision is PROCEED:
                phase[agent] = "write"
                at(now + rng.uniform(20.0, 120.0), agent)
        elif step == "write":
            decision = mgr.externalize(tx.txid, (scope,), (scope,))
            if decision is PROCEED:
                effect = Effect("bench.rmw", REVERSIBLE, (scope,), f"{tx.txid}", compensate=_noop)
                decision = mgr.stage(tx.txid, effect)
                phase[agent] = "commit"
                at(now + 5.0, agent)
        else:  # commit
            if tx.state is TxState.OPEN:
                mgr.seal(tx.txid)
            decision = mgr.try_commit(tx.txid)
            if decision.__class__ is CommitPlan:
                commits += 1
                settle(agent, now, True)
                continue
        if decision.__class__ is Wait:
            waits += 1  # parked: `finish` of what it waits for schedules it again
        elif decision.__class__ is AbortPlan:
            settle(agent, now, False)
    cpu = time.process_time() - cpu
    if commits + aborts == 0 or any(p != "done" for p in phase):
        raise AssertionError("the simulated agents did not all finish")
    return ContentionRun(agents, commits, aborts, waits, wakes, cpu)


def _noop() -> None:
    return None


def core_scaling(
    ns: Sequence[int], *, frontier: str, resources: int = 2, reps: int = 3
) -> list[tuple[int, float]]:
    """CPU per simulated run (median of `reps`) against the number of agents."""
    simulate_contention(16, resources=resources, frontier=frontier)  # warm-up
    points = []
    for n in ns:
        runs = [
            simulate_contention(n, resources=resources, frontier=frontier).cpu_s
            for _ in range(reps)
        ]
        points.append((n, statistics.median(runs)))
    return points


def harness_scaling(
    ns: Sequence[int], *, mode: str, config: str = "tau_contention", trials: int = 1
) -> list[tuple[int, float]] | None:
    """CPU per trial (median over `trials` trials) of a harness config against its
    `params.agents`, in this process; None when the harness is not importable (the runtime
    installed on its own)."""
    path = configs_dir() / f"{config}.yaml"

    def cpu_per_trial(n: int, count: int) -> float:
        loaded = load_config(
            path, overrides={"trials": count, "modes": [mode]}, grid={"params.agents": [n]},
            limits=None,
        )
        costs = []
        for spec in plan(loaded):
            cpu = time.process_time()
            run_trial(spec)
            costs.append(time.process_time() - cpu)
        return statistics.median(costs)

    cpu_per_trial(8, 1)  # warm-up: the retail data, imports, caches
    return [(n, cpu_per_trial(n, trials)) for n in ns]


def scaling_figures(quick: bool = True, *, tiny: bool = False) -> list[Figure]:
    """The wait path's scaling: CPU per run against n on a log-log fit, for tx-full and the
    global-frontier ablation: on the harness's tau_contention (when the harness is here)
    and on the core alone (always)."""
    ns = (8, 16, 32) if tiny else SCALING_NS
    figures: list[Figure] = []
    for mode, frontier in (("tx-full", "per-resource"), ("tx-global-frontier", "global")):
        target = SCALING_TARGETS[mode]
        points = harness_scaling(ns, mode=mode, trials=1 if (quick or tiny) else 3)
        if points is not None:
            slope = fit_exponent(points)
            costs = ", ".join(f"{n}: {cpu:.2f}" for n, cpu in points)
            figures.append(Figure(
                f"{mode} on tau_contention: CPU per trial ~ n^k (s at n = {costs})",
                round(slope, 2), "k", f"<= {target:g}", slope <= target,
            ))
        core = core_scaling(ns, frontier=frontier, reps=1 if tiny else 3)
        slope = fit_exponent(core)
        costs = ", ".join(f"{n}: {cpu * 1000:.0f}" for n, cpu in core)
        figures.append(Figure(
            f"{mode}, core alone (2 contended scopes): CPU per run ~ n^k (ms at n = {costs})",
            round(slope, 2), "k", f"<= {target:g}", slope <= target,
        ))
    return figures

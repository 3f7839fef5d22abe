"""Resource-granularity throughput (paper Table 13): n agents, one transaction each over S
SQLite rows, a fraction o of which are drawn from a pool that all agents share.

Agent i's transaction touches S rows of the `rows` table: round(o * S) shared rows, drawn
without replacement from a pool of `params.pool` rows (`shared-0` ...; default S, so at
o = 1 every agent touches every shared row) from the scenario seed, and the rest private
rows of its own (`a<i>-j`). The order of its S accesses is shuffled from the same seed. Two
transactions conflict when they drew a common shared row, so as o grows more pairs conflict,
and at o = 1 (pool = S) all do. `params.access` says what an access is:

- `write` (default): a blind write of the agent's own tag (`db_put`): conflicts are
  write-write, so they are ordered, never stale;
- `read_modify_write`: read the row, then write what was read plus one: the lost-update
  pattern, where a transaction that read a row another one then wrote is stale.

All agents start at virtual time 0 and think before each call for a time drawn uniformly
from `params.plan_delay_ms` (default [20, 120] ms, tau_contention's agent model); with a tool
latency L (config `tool.latency_ms`, jitter 0) every delivery of a call costs exactly L.

Throughput, in transactions per step. A **step** is the virtual time one transaction's own
work takes: the median, over the trial's transactions that committed on their first
attempt, of (finish time - start time - time parked on a lock or a frontier), in simulated
ms. With jitter 0 and no faults that is (S for `write`, 2S for `read_modify_write`) * L in
every mode, each call being delivered once (buffered writes are delivered at commit), so a
step is one transaction run alone. Then `throughput` = committed transactions * step /
makespan: n when all n transactions overlap completely, 1 when they run one after another.
The makespan is when the last agent finished (as the record's `makespan_ms`).

Correctness beside speed (`invariant_violations`): for `read_modify_write`, each row not at
its initial value plus one per committed transaction that touched it (a lost update); for
`write`, 1 when no serial order of the committed transactions leaves the rows as they are
(some row's last writer is ordered before another row's, and the other way round). That is
how `no-tx` earns its throughput.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.base import DelayRange, Scenario, WorkloadParams
from harness.workloads.synthetic import TOOLS
from harness.world.oracle import has_cycle
from harness.world.substrates import TrialEnv

TABLE = "rows"
INITIAL = 100
Access = Literal["write", "read_modify_write"]


class GranularityParams(WorkloadParams):
    """`params` of the granularity workload (see the module docstring)."""

    agents: int = Field(8, ge=1, le=64)
    scopes: int = Field(4, ge=1, le=32)
    overlap: float = Field(0.0, ge=0.0, le=1.0)
    pool: int | None = Field(None, ge=1, le=1024)  # None: `scopes`
    access: Access = "write"
    max_attempts: int = Field(10, ge=1, le=100)
    # Think time before each call (simulated ms, drawn uniformly per call): the agent model
    # of tau_contention, whose defaults these are.
    plan_delay_ms: DelayRange = Field(default_factory=lambda: [20.0, 120.0])

    @model_validator(mode="after")
    def _whole_scopes(self) -> GranularityParams:
        shared = self.overlap * self.scopes
        if abs(shared - round(shared)) > 1e-9:
            raise ValueError(
                f"overlap: overlap * scopes must be a whole number of scopes, got "
                f"{self.overlap} * {self.scopes} = {shared:g}; e.g. overlap 0, 0.25, 0.5, 0.75 "
                f"or 1 with scopes 4"
            )
        if round(shared) > self.shared_pool:
            raise ValueError(
                f"pool: must hold the {round(shared)} shared rows each agent draws, got "
                f"{self.shared_pool}"
            )
        return self

    @property
    def shared(self) -> int:
        """Shared rows per transaction."""
        return round(self.overlap * self.scopes)

    @property
    def shared_pool(self) -> int:
        return self.scopes if self.pool is None else self.pool


def rows_of(agent: int, p: GranularityParams, rng: random.Random) -> list[str]:
    """The rows agent `agent` touches, in the order it touches them."""
    pool = [f"shared-{j}" for j in range(p.shared_pool)]
    rows = rng.sample(pool, p.shared) + [f"a{agent}-{j}" for j in range(p.scopes - p.shared)]
    rng.shuffle(rows)
    return rows


def _incremented(row: str, slot: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def args(memory: dict[str, Any]) -> dict[str, Any]:
        return {"table": TABLE, "k": row, "value": memory[slot] + 1}

    return args


def _plan(agent: int, rows: list[str], access: Access) -> tuple[Step, ...]:
    if access == "write":
        return tuple(Step("db_put", {"table": TABLE, "k": row, "value": f"a{agent}"}) for row in rows)
    steps: list[Step] = []
    for j, row in enumerate(rows):
        # The write is computed from what the agent read: the lost-update pattern.
        steps.append(Step("db_get", {"table": TABLE, "k": row}, save_as=f"v{j}"))
        steps.append(Step("db_put", _incremented(row, f"v{j}")))
    return tuple(steps)


def _committed(outcomes: list[AgentOutcome]) -> list[int]:
    return [int(o.agent.removeprefix("a")) for o in outcomes if o.committed]


def lost_updates(env: TrialEnv, rows: list[list[str]], committed: list[int]) -> int:
    """Rows not at their initial value plus one per committed transaction that touched them."""
    want = {row: INITIAL for agent_rows in rows for row in agent_rows}
    for agent in committed:
        for row in rows[agent]:
            want[row] += 1
    return sum(env.db.get(TABLE, row) != value for row, value in want.items())


def torn_writes(env: TrialEnv, rows: list[list[str]], committed: list[int]) -> int:
    """1 when no serial order of the committed blind writers leaves the rows as they are:
    every other committed writer of a row must come before the row's last writer."""
    done = set(committed)
    edges: set[tuple[int, int]] = set()
    for row in {row for agent in committed for row in rows[agent]}:
        last = env.db.get(TABLE, row)
        owner = int(last.removeprefix("a")) if isinstance(last, str) else None
        if owner not in done:
            return 1  # the row holds no committed writer's value
        edges |= {(w, owner) for w in done if w != owner and row in rows[w]}
    return int(has_cycle(edges))


def step_ms(outcomes: list[AgentOutcome]) -> float | None:
    """The module docstring's step: the median own-work time of first-attempt commits."""
    # Every agent starts at virtual time 0 (no start offsets), so finish time is elapsed time.
    work = [o.finished_at_ms - o.blocked_ms for o in outcomes if o.committed_attempt == 1]
    return statistics.median(work) if work else None


def throughput(outcomes: list[AgentOutcome]) -> dict[str, float]:
    """`step_ms`, the makespan in steps, and committed transactions per step."""
    committed = sum(o.committed for o in outcomes)
    makespan = max((o.finished_at_ms for o in outcomes), default=0.0)
    step = step_ms(outcomes)
    if step is None or step <= 0.0 or makespan <= 0.0:
        return {"step_ms": 0.0, "makespan_steps": 0.0, "throughput": 0.0}
    return {"step_ms": step, "makespan_steps": makespan / step,
            "throughput": committed * step / makespan}


class GranularityWorkload:
    """n agents' transactions over private rows and rows drawn from a shared pool."""

    name = "granularity"
    description = "n agents write S rows each, a fraction o drawn from a pool all agents share"
    tools = TOOLS
    Params = GranularityParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = GranularityParams.model_validate(params)
        rows = [rows_of(i, p, rng) for i in range(p.agents)]
        tasks = [Task(f"t{trial}-a{i}", _plan(i, r, p.access)) for i, r in enumerate(rows)]
        check = lost_updates if p.access == "read_modify_write" else torn_writes

        def setup(env: TrialEnv) -> None:
            every = sorted({row for agent_rows in rows for row in agent_rows})
            env.db.put_many([(TABLE, row, INITIAL) for row in every])

        return Scenario(
            tasks=tasks,
            setup=setup,
            invariants=lambda env, outcomes: check(env, rows, _committed(outcomes)),
            # A throughput client: a transaction the mechanism aborts is tried again.
            policy=AgentPolicy(step_retries=2, max_attempts=p.max_attempts,
                               plan_delay_ms=(p.plan_delay_ms[0], p.plan_delay_ms[1])),
            metrics=lambda env, outcomes: throughput(outcomes),
            info={"agents": p.agents, "scopes": p.scopes, "shared": p.shared, "access": p.access},
        )

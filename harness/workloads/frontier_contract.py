"""Frontier-contract negative control on one resource (paper Table 18).

n agents (`params.agents`, default 2) each append one line, their own name, to one shared
append-only log file (`ledger.log`, a real file of the trial): a blind, bufferable append,
so the runtime applies it at commit and the file's line order is the order the appends
were applied. Agent i starts at `i * params.stagger_ms` (default 10 ms), so the agents begin
their transactions, and get their epochs, in index order. Each thinks before every call for a
time drawn from `params.plan_delay_ms` (default [20, 20] ms), appends first, then makes
`n - 1 - i` read-only "review" calls that touch no resource: the earlier an agent began,
the longer it works after staging its append, so the earliest epoch is ready to commit last.
Every append is staged before any later agent reaches its commit (stagger and think time
see to it), so a correct frontier makes each later transaction wait at commit until every
earlier one on the log has settled, and the log ends in epoch order.

What is measured, from ground truth the workload reads itself:

- `out_of_order` (and `out_of_order_pairs`): from the operation log, written by the file
  store below every mechanism: the applied appends on the log in application order, with the
  epoch each carried (its agent's begin order where a mode has no epochs), are not in
  increasing epoch order (pairs applied in the wrong order).
- `invariant_violations` (the record's, through `Scenario.invariants`): from the file
  itself: pairs of lines that are not in the agents' begin order, i.e. the log is not what
  the serial execution in epoch order leaves. Liveness is not part of it: a transaction that
  never committed leaves no line and breaks no order.
- `frontier_blocked`: an agent's transaction never committed because it waited until its
  deadline (`settings.timeout_ms`) and aborted with `timeout` (progress blocked);
  `waited`: some agent waited at all (a correct frontier makes the later agents wait a
  little); `log_lines`: lines in the log.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atomix.effects import AbortSource
from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.base import DelayRange, Scenario, WorkloadParams
from harness.workloads.synthetic import TOOLS as SYNTHETIC_TOOLS
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

LOG = "ledger.log"


def _no_scopes(env: TrialEnv, args: dict[str, Any]) -> list[str]:
    return []


def _review(env: TrialEnv, args: dict[str, Any], delivery: Delivery) -> str:
    return f"reviewed {args['what']}"


TOOLS: dict[str, ToolDef] = {
    "fs_append": SYNTHETIC_TOOLS["fs_append"],
    # Work that touches no resource: it keeps an agent busy after it staged its append.
    "review": ToolDef("review", None, _no_scopes, _no_scopes, _review),
}


class FrontierContractParams(WorkloadParams):
    """`params` of the frontier_contract workload (see the module docstring)."""

    agents: int = Field(2, ge=2, le=16)
    stagger_ms: float = Field(10.0, gt=0.0, le=1e6)
    plan_delay_ms: DelayRange = Field(default_factory=lambda: [20.0, 20.0])
    max_attempts: int = Field(3, ge=1, le=100)


def agent_index(name: str) -> int:
    """0 for "a0": the agent's begin order."""
    return int(name.removeprefix("a"))


def inverted_pairs(order: list[int]) -> int:
    """Pairs (i before j in `order`) with order[i] > order[j]."""
    return sum(1 for i, a in enumerate(order) for b in order[i + 1 :] if a > b)


def applied_epochs(env: TrialEnv) -> list[int]:
    """The epoch of each append applied to the log, in the order the file store applied them
    (from its operation log); an op without an epoch counts by its agent's begin order."""
    scope = env.files.scope(LOG)
    order: list[int] = []
    for op in env.oplog.ops():
        if op.scope != scope or op.kind in ("read", "dedup") or op.meta.get("undo"):
            continue
        if "agent" not in op.meta:  # the setup's empty file, not an agent's append
            continue
        epoch = op.meta.get("epoch")
        order.append(int(epoch) if epoch is not None else agent_index(str(op.meta["agent"])))
    return order


def log_lines(env: TrialEnv) -> list[str]:
    """The log file's lines as they are on disk."""
    text = env.files.read_text(LOG) or ""
    return [line for line in text.splitlines() if line]


def order_violations(env: TrialEnv) -> int:
    """Pairs of lines in the log that are not in the agents' begin (epoch) order."""
    return inverted_pairs([agent_index(line) for line in log_lines(env)])


def frontier_metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
    """The module docstring's measures of one trial."""
    pairs = inverted_pairs(applied_epochs(env))
    timeout = AbortSource.TIMEOUT.value
    return {
        "out_of_order": pairs > 0,
        "out_of_order_pairs": pairs,
        "frontier_blocked": any(not o.committed and timeout in o.aborts for o in outcomes),
        "waited": any(o.blocked_ms > 0 for o in outcomes),
        "log_lines": len(log_lines(env)),
    }


def plan(agent: int, agents: int) -> tuple[Step, ...]:
    """Append first, then review once for each agent that begins after this one."""
    steps = [Step("fs_append", {"path": LOG, "line": f"a{agent}"})]
    steps += [Step("review", {"what": f"a{agent}-{j}"}) for j in range(agents - 1 - agent)]
    return tuple(steps)


class FrontierContractWorkload:
    """Staggered agents append to one shared log; the earliest epoch commits last."""

    name = "frontier_contract"
    probes_mechanism = True  # its verdict does not depend on the agent's task
    description = "agents append to one shared log; the earliest epoch is ready last"
    tools = TOOLS
    Params = FrontierContractParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = FrontierContractParams.model_validate(params)
        tasks = [Task(f"t{trial}-a{i}", plan(i, p.agents)) for i in range(p.agents)]

        def setup(env: TrialEnv) -> None:
            env.files.write(LOG, "")

        return Scenario(
            tasks=tasks,
            setup=setup,
            invariants=lambda env, outcomes: order_violations(env),
            policy=AgentPolicy(
                step_retries=2,
                max_attempts=p.max_attempts,
                plan_delay_ms=(p.plan_delay_ms[0], p.plan_delay_ms[1]),
            ),
            start_offsets_ms=[i * p.stagger_ms for i in range(p.agents)],
            metrics=frontier_metrics,
            final=lambda env: {"log": log_lines(env)},
            info={"agents": p.agents, "stagger_ms": p.stagger_ms},
        )

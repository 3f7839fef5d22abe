"""Speculation contamination (paper Table 12): K branches of one step, one wins, the rest
must leave nothing behind.

Each trial is one speculative group of `params.branches` (K) alternative plans for the same
step, run concurrently by K agents. Branch i drafts its own proposal and acts on it, one
effect per class and substrate:

- buffer (bufferable): `proposal-i` in the in-memory buffer;
- files (bufferable): `proposals/branch-i.md` on disk;
- db (bufferable): row `proposals:i` in SQLite;
- booking (reversible): a hold on option i (`slots:i` in SQLite, one seat each);
- mailbox (irreversible): a mail to the one customer, subject `proposal i`.

A selector keeps one branch, drawn per trial from the scenario seed (the same for every
mode), and drops every other branch just before it commits (`Task.abort_source` =
`losing_speculation`, as the leakage workload's losing-speculation source does). A mode
without native speculation thus runs the K branches as K transactions and aborts the
losers, which is what a real system on it would do; the harness's `tx-full` does the same
(it does not use the runtime's `branch`/`resolve` groups), so its branches on the shared
mail scope are ordered by epoch like any other transactions: a loser of an earlier epoch
that reaches that scope after the winner committed there is aborted by the runtime as stale
before the selector drops it, which leaves the same nothing behind.

Ground truth is read from the substrates themselves after the trial: a loser's effect
persists when its proposal is still in the buffer, its file on disk, its row in SQLite, its
hold in the booking table, or its mail in the mailbox file. The metrics count those per
class (`loser_effects_<class>`) and as a rate per 1,000 losing transactions
(`contamination_<class>`: each loser makes exactly one effect of each class, so 1,000 means
every loser left that effect). `winner_complete` says whether all five of the winner's
effects are there; the oracle's goal state is the winner's plan alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field

from atomix.effects import AbortSource
from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.base import DelayRange, Scenario, WorkloadParams
from harness.workloads.synthetic import TOOLS
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery

#: The effect classes measured, in the order tables show them.
CLASSES: tuple[str, ...] = ("buffer", "files", "db", "booking", "mailbox")
CUSTOMER = "customer@example.com"
TABLE = "proposals"


class SpeculationParams(WorkloadParams):
    """`params` of the speculation workload: K, the branches of the speculative group."""

    branches: int = Field(2, ge=2, le=64)
    # Think time before each call, simulated ms drawn uniformly per call: branches then
    # interleave differently from trial to trial.
    plan_delay_ms: DelayRange = Field(default_factory=lambda: [0.0, 20.0])


def _path(i: int) -> str:
    return f"proposals/branch-{i}.md"


def _subject(i: int) -> str:
    return f"proposal {i}"


def _holder(i: int) -> str:
    return f"branch-{i}"


def branch_plan(i: int) -> tuple[Step, ...]:
    """Branch i's plan: one effect of each class, each tagged with i."""
    return (
        Step("buf_put", {"name": f"proposal-{i}", "value": f"plan {i}"}),
        Step("fs_write", {"path": _path(i), "text": f"# Proposal {i}\n"}),
        Step("db_put", {"table": TABLE, "k": i, "value": {"branch": i, "price": 100 + i}}),
        Step("book", {"slot": i, "who": _holder(i)}),
        Step("send", {"to": CUSTOMER, "subject": _subject(i), "body": f"we hold option {i} for you"}),
    )


def _setup_for(branches: int) -> Callable[[TrialEnv], None]:
    def setup(env: TrialEnv) -> None:
        # One seat per option: every branch can hold its own, so no branch is refused.
        env.db.put_many([("slots", i, {"left": 1, "holders": []}) for i in range(branches)])

    return setup


def goal_state(plan: tuple[Step, ...], setup: Callable[[TrialEnv], None]) -> dict[str, Any]:
    """The winner's plan applied once on fresh substrates, with no mode and no faults."""
    env = TrialEnv.create()
    try:
        setup(env)
        for step in plan:
            TOOLS[step.tool].run(env, dict(step.args), Delivery(None, {}))  # type: ignore[arg-type]
        return env.snapshot()
    finally:
        env.close()


def persisted(env: TrialEnv, i: int) -> dict[str, bool]:
    """Which of branch i's effects the substrates hold now (read from them, not the modes)."""
    slot = env.db.get("slots", i) or {"holders": []}
    return {
        "buffer": env.buffer.get(f"proposal-{i}") is not None,
        "files": env.files.exists(_path(i)),
        "db": env.db.get(TABLE, i) is not None,
        "booking": _holder(i) in slot["holders"],
        "mailbox": any(m["subject"] == _subject(i) for m in env.messages()),
    }


def _metrics_for(branches: int, winner: int) -> Any:
    def metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        counts = dict.fromkeys(CLASSES, 0)
        for i in range(branches):
            if i == winner:
                continue
            for cls, there in persisted(env, i).items():
                counts[cls] += there
        losers = branches - 1
        out: dict[str, Any] = {"branches": branches, "losers": losers}
        for cls in CLASSES:
            out[f"loser_effects_{cls}"] = counts[cls]
            out[f"contamination_{cls}"] = 1000.0 * counts[cls] / losers
        out["loser_effects"] = sum(counts.values())
        out["winner_complete"] = all(persisted(env, winner).values())
        return out

    return metrics


class SpeculationWorkload:
    """K concurrent branches of one step, each with an effect of every class; one wins."""

    name = "speculation"
    description = "K speculative branches, one effect per class each; losers must leave nothing"
    tools = TOOLS
    Params = SpeculationParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = SpeculationParams.model_validate(params)
        k = p.branches
        winner = rng.randrange(k)
        tasks = [
            Task(
                f"t{trial}-branch{i}",
                branch_plan(i),
                abort_source=None if i == winner else AbortSource.LOSING_SPECULATION,
            )
            for i in range(k)
        ]
        setup = _setup_for(k)
        plan = tasks[winner].steps
        return Scenario(
            tasks=tasks,
            setup=setup,
            expected=lambda: goal_state(plan, setup),
            # One attempt: a selector's drop is final, and a failed branch is just a loser.
            policy=AgentPolicy(step_retries=1, max_attempts=1,
                               plan_delay_ms=(p.plan_delay_ms[0], p.plan_delay_ms[1])),
            metrics=_metrics_for(k, winner),
            info={"branches": k, "winner": winner},
        )

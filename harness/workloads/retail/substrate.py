"""The tau2 retail DB as a trial substrate, and its tools as harness tools.

Every retail call of every mode goes through `RetailStore.call`, which runs the tool with
tau2's semantics on the trial's own DB (copy-on-write over the shared pristine one, see
`data.cow_db`), deduplicates by idempotency key, and writes the op log (reads and writes per
scope) below all mechanisms.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from atomix.effects import EffectClass
from harness.workloads.retail.tools import (
    TOOLS,
    RetailTool,
    RetailToolError,
    call_tool,
    order_key,
    restore,
    snapshot,
)
from harness.workloads.tau2_store import Tau2Store, store_tool_parts
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, Reread, ToolDef

SUBSTRATE = "retail"
# Writes that set fields to given values: applying one twice leaves the same DB.
_BLIND_OVERWRITES = frozenset({"modify_pending_order_address", "modify_user_address"})


class RetailStore(Tau2Store):
    """One trial's retail DB (a `Tau2Store`); a refused call (tau2's own error) changes nothing.
    A write's before-image is a snapshot of the records it writes, put back by `restore`."""

    substrate = SUBSTRATE
    tools = TOOLS
    tool_error = RetailToolError
    run_tool = staticmethod(call_tool)

    def before(self, write_scopes: list[str]) -> dict[str, Any]:
        return snapshot(self.db, write_scopes)

    def restore(self, before: dict[str, Any], meta: Mapping[str, Any]) -> None:
        restore(self.db, before)
        self._sha = None
        for scope in _scopes_of(before):
            self._log(scope, "write", None, meta)


def _scopes_of(before: dict[str, Any]) -> list[str]:
    kinds = {"orders": "order", "users": "user"}
    out = []
    for key in before:
        table, record_id = key if isinstance(key, tuple) else (None, None)
        if table in kinds:
            out.append(f"retail:{kinds[table]}:{record_id}")
    return out


_REASONS = ("no longer needed", "ordered by mistake")


def plausible_alternative(
    db: dict[str, Any], name: str, args: Mapping[str, Any], rng: Any
) -> dict[str, Any] | None:
    """Arguments an agent might try instead after a failed call: one argument changed to
    another value that exists in the DB (another of the user's payment methods or orders,
    another variant of the same product, the other cancel reason). None when there is none.

    This is the "retry with changed arguments" of an LLM agent: a plausible wrong action,
    which the tool may refuse or, worse, carry out.
    """
    order = db["orders"].get(args.get("order_id")) if isinstance(args.get("order_id"), str) else None
    user = db["users"].get(order["user_id"]) if order else None
    if user is None and isinstance(args.get("user_id"), str):
        user = db["users"].get(args["user_id"])
    options: list[tuple[str, Any]] = []
    method = args.get("payment_method_id")
    if user is not None and isinstance(method, str):
        options += [("payment_method_id", m) for m in sorted(user["payment_methods"]) if m != method]
    if user is not None and order is not None:
        options += [("order_id", o) for o in user.get("orders", []) if o != args.get("order_id")][:3]
    if args.get("reason") in _REASONS:
        options += [("reason", r) for r in _REASONS if r != args["reason"]]
    new_ids = args.get("new_item_ids")
    if order is not None and isinstance(new_ids, list) and new_ids:
        for position, item_id in enumerate(args.get("item_ids") or []):
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            product = db["products"].get(item["product_id"]) if item else None
            if product is None or position >= len(new_ids):
                continue
            for variant_id, variant in sorted(product["variants"].items()):
                if variant["available"] and variant_id not in (item_id, new_ids[position]):
                    changed = list(new_ids)
                    changed[position] = variant_id
                    options.append(("new_item_ids", changed))
                    break
    if not options:
        return None
    key, value = options[rng.randrange(len(options))]
    return {**args, key: copy.deepcopy(value)}


def _same_address(args: Mapping[str, Any]) -> Callable[[Any], bool]:
    fields = ("address1", "address2", "city", "state", "country", "zip")
    wanted = {k: args.get(k) for k in fields}
    return lambda record: isinstance(record, dict) and isinstance(record.get("address"), dict) and all(
        record["address"].get(k) == v for k, v in wanted.items())


def _ids(value: Any) -> list[Any]:
    return sorted(value, key=str) if isinstance(value, list) else []


def _landed_test(name: str, args: Mapping[str, Any]) -> Callable[[Any], bool] | None:
    """What an agent reading the object back looks for to see that write `name` with `args`
    landed: the change it asked for (a status the write sets, the values it wrote)."""
    if name == "cancel_pending_order":
        return lambda o: o.get("status") == "cancelled" and o.get("cancel_reason") == args.get("reason")
    if name in ("modify_pending_order_address", "modify_user_address"):
        return _same_address(args)
    if name == "modify_pending_order_items":
        def items(o: dict[str, Any]) -> bool:
            have = [i.get("item_id") for i in o.get("items") or [] if isinstance(i, dict)]
            wanted = _ids(args.get("new_item_ids"))
            return (o.get("status") == "pending (item modified)" and bool(wanted)
                    and all(have.count(i) >= wanted.count(i) for i in wanted))
        return items
    if name == "modify_pending_order_payment":
        method = args.get("payment_method_id")
        return lambda o: any(
            isinstance(p, dict) and p.get("transaction_type") == "payment" and p.get("payment_method_id") == method
            for p in (o.get("payment_history") or [])[1:])
    if name == "exchange_delivered_order_items":
        return lambda o: (o.get("status") == "exchange requested"
                          and o.get("exchange_items") == _ids(args.get("item_ids"))
                          and o.get("exchange_new_items") == _ids(args.get("new_item_ids")))
    if name == "return_delivered_order_items":
        return lambda o: (o.get("status") == "return requested"
                          and o.get("return_items") == _ids(args.get("item_ids"))
                          and o.get("return_payment_method_id") == args.get("payment_method_id"))
    return None


def reread(name: str, args: Mapping[str, Any]) -> Reread | None:
    """The read-back of retail write `name`: get_order_details of its order (get_user_details
    for a user's address), and the change the write asked for. None for a call that names no
    object (an agent has nothing to look up)."""
    test = _landed_test(name, args)
    if test is None:
        return None
    if name == "modify_user_address":
        key, tool = "user_id", "get_user_details"
    else:
        key, tool = "order_id", "get_order_details"
    if not isinstance(args.get(key), str):
        return None

    def landed(record: Any) -> bool:
        return isinstance(record, dict) and bool(test(record))

    return Reread(tool, {key: args[key]}, landed)


def store(env: TrialEnv) -> RetailStore:
    return env.extra["retail"]


def _tooldef(rt: RetailTool) -> ToolDef:
    name = rt.name
    reads, writes, run = store_tool_parts(rt, store)
    if not rt.writes:
        return ToolDef(name, None, reads, lambda env, a: [], run)
    return ToolDef(
        name,
        EffectClass.REVERSIBLE,
        reads,
        writes,
        run,
        before=lambda env, a: store(env).before(writes(env, a)),
        undo=lambda env, a, before, d: store(env).restore(before, d.meta),
        check=lambda env, a: store(env).check(name, a),
        key=lambda a: order_key(name, a),
        idempotent=name in _BLIND_OVERWRITES,
        alternatives=lambda env, a, rng: plausible_alternative(store(env).db, name, a, rng),
        reread=lambda a: reread(name, a),
    )


def _mail_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.mailbox.scope(a["to"])]


def _notify(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.mailbox.send(a["to"], a["subject"], a["body"], key=d.key, meta=d.meta)


# A shop's customer notification after each change: a real append-only mailbox, irreversible
# (a sent mail cannot be unsent). Not a tau2 tool; the `notify` workload param adds it.
NOTIFY = ToolDef(
    "notify_customer", EffectClass.IRREVERSIBLE, lambda env, a: [], _mail_scope, _notify,
    key=lambda a: f"{a['to']}:{a['subject']}",
)

RETAIL_TOOLS: dict[str, ToolDef] = {
    **{name: _tooldef(rt) for name, rt in TOOLS.items()},
    NOTIFY.name: NOTIFY,
}

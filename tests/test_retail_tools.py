"""The tau2 retail workload on the real bundled data: loading, tools, scopes, tasks, goals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.workloads.retail import (
    TOOLS,
    RetailDataError,
    RetailToolError,
    call_tool,
    db_sha256,
    fresh_db,
    goal_db,
    gold_actions,
    load_retail,
    order_key,
    records_for_scopes,
    restore,
    select_tasks,
    snapshot,
)
from harness.workloads.retail.data import DB_FILE, SPLIT_FILE, TASKS_FILE

# Real ids from db.json / tasks.json.
ORDER0 = "#W2378156"  # task 0: delivered, Yusuf Rossi, paid by credit_card_9513926
USER0 = "yusuf_rossi_9620"
GC_PAID_PENDING = "#W6779827"  # pending, paid by gift_card_7219486 (ethan_lopez_6291)
PENDING_POOR_GC = "#W2443586"  # pending 591.95 by paypal; user's gift_card_2742113 holds 22.0
PENDING_RICH_GC = "#W1080318"  # pending 53.43 by credit card; user's gift_card_3749819 holds 91.0
DELIVERED_GC = "#W9077205"  # delivered, paid by gift_card_7108145; user also has paypal_4101143
PENDING_T21 = "#W9911714"  # task 21: modify two items with gift_card_4332117 (86.0)
PENDING_T64 = "#W7464385"  # task 64: pending
ADDRESS = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX",
           "country": "USA", "zip": "78701"}


@pytest.fixture(scope="module")
def data():
    return load_retail()


@pytest.fixture
def db(data):
    return fresh_db(data)


# --- data -------------------------------------------------------------------------------------


def test_load_bundled_data_is_cached_and_complete(data):
    assert {k: len(v) for k, v in data.db.items()} == {"products": 50, "users": 500, "orders": 1000}
    assert len(data.tasks) == 114
    assert {k: len(v) for k, v in data.split.items()} == {"train": 74, "test": 40, "base": 114}
    assert load_retail() is data
    assert load_retail(data.source) is data
    assert (data.source / DB_FILE).is_file()


def test_fresh_db_is_an_independent_deep_copy(data):
    before = db_sha256(data.db)
    one, two = fresh_db(data), fresh_db(data)
    assert one == data.db and one is not data.db
    one["orders"][ORDER0]["items"][0]["price"] = 0.0
    one["users"].clear()
    assert two == data.db
    assert db_sha256(data.db) == before


def test_db_sha256_is_canonical_and_sensitive(data, db):
    digest = db_sha256(db)
    assert digest == db_sha256(fresh_db(data)) and len(digest) == 64
    reordered = {k: dict(reversed(list(db[k].items()))) for k in reversed(list(db))}
    assert db_sha256(reordered) == digest
    db["users"][USER0]["address"]["zip"] = "00000"
    assert db_sha256(db) != digest


def _copy_data_dir(data, target: Path) -> Path:
    target.mkdir()
    for name in (DB_FILE, TASKS_FILE, SPLIT_FILE):
        shutil.copy(data.source / name, target / name)
    return target


def test_missing_directory_names_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(RetailDataError, match="nope"):
        load_retail(missing)


def test_malformed_db_names_the_path(data, tmp_path):
    folder = _copy_data_dir(data, tmp_path / "bad_json")
    (folder / DB_FILE).write_text('{"products": {', encoding="utf-8")
    with pytest.raises(RetailDataError, match="invalid JSON") as info:
        load_retail(folder)
    assert str(folder / DB_FILE) in str(info.value)


def test_missing_top_level_key_and_missing_file(data, tmp_path):
    folder = _copy_data_dir(data, tmp_path / "no_orders")
    (folder / DB_FILE).write_text(json.dumps({"products": {}, "users": {}}), encoding="utf-8")
    with pytest.raises(RetailDataError, match="orders") as info:
        load_retail(folder)
    assert str(folder / DB_FILE) in str(info.value)
    folder = _copy_data_dir(data, tmp_path / "no_tasks")
    (folder / TASKS_FILE).unlink()
    with pytest.raises(RetailDataError, match="missing") as info:
        load_retail(folder)
    assert str(folder / TASKS_FILE) in str(info.value)


# --- registry ---------------------------------------------------------------------------------

WRITE_TOOLS = {
    "cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
    "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
    "return_delivered_order_items",
}
READ_TOOLS = {
    "calculate", "find_user_id_by_email", "find_user_id_by_name_zip", "get_item_details",
    "get_order_details", "get_product_details", "get_user_details", "list_all_product_types",
    "transfer_to_human_agents",
}


def test_registry_has_the_16_upstream_tools():
    assert set(TOOLS) == WRITE_TOOLS | READ_TOOLS and len(TOOLS) == 16
    assert {n for n, t in TOOLS.items() if t.writes} == WRITE_TOOLS
    assert all(t.name == n for n, t in TOOLS.items())


# --- read-only tools --------------------------------------------------------------------------


def test_read_tools_on_real_ids(db):
    before = db_sha256(db)
    assert call_tool(db, "find_user_id_by_email", {"email": "Yusuf.Rossi7301@example.com"}) == USER0
    assert call_tool(db, "find_user_id_by_name_zip",
                     {"first_name": "yusuf", "last_name": "ROSSI", "zip": "19122"}) == USER0
    order = call_tool(db, "get_order_details", {"order_id": ORDER0})
    assert order["status"] == "delivered" and len(order["items"]) == 5
    product = call_tool(db, "get_product_details", {"product_id": "1656367028"})
    assert product["name"] == "Mechanical Keyboard" and "1151293680" in product["variants"]
    item = call_tool(db, "get_item_details", {"item_id": "1151293680"})
    assert item["item_id"] == "1151293680" and item["options"]["switch type"] == "linear"
    assert call_tool(db, "get_user_details", {"user_id": USER0})["orders"][-1] == ORDER0
    types = json.loads(call_tool(db, "list_all_product_types", {}))
    assert len(types) == 50 and types["Mechanical Keyboard"] == "1656367028"
    assert list(types) == sorted(types)
    assert call_tool(db, "calculate", {"expression": "652.61 + 473.43"}) == "1126.04"
    assert call_tool(db, "calculate", {"expression": "(10 - 4) / 4"}) == "1.5"
    assert call_tool(db, "transfer_to_human_agents", {"summary": "wants a human"}) == (
        "Transfer successful")
    assert db_sha256(db) == before


def test_results_are_copies(db):
    before = db_sha256(db)
    call_tool(db, "get_order_details", {"order_id": ORDER0})["items"].clear()
    call_tool(db, "get_user_details", {"user_id": USER0})["payment_methods"].clear()
    call_tool(db, "get_product_details", {"product_id": "1656367028"})["variants"].clear()
    assert db_sha256(db) == before


# --- write tools ------------------------------------------------------------------------------


def test_exchange_task0(db):
    old = db["orders"][ORDER0]
    prices = {i["item_id"]: i["price"] for i in old["items"]}
    new_price = (db["products"]["1656367028"]["variants"]["7706410293"]["price"]
                 + db["products"]["4896585277"]["variants"]["7747408585"]["price"])
    user_before = json.dumps(db["users"][USER0], sort_keys=True)
    out = call_tool(db, "exchange_delivered_order_items", {
        "order_id": ORDER0, "item_ids": ["4983901480", "1151293680"],
        "new_item_ids": ["7747408585", "7706410293"], "payment_method_id": "credit_card_9513926"})
    assert out["status"] == "exchange requested" == db["orders"][ORDER0]["status"]
    assert out["exchange_items"] == ["1151293680", "4983901480"]
    assert out["exchange_new_items"] == ["7706410293", "7747408585"]
    assert out["exchange_payment_method_id"] == "credit_card_9513926"
    assert out["exchange_price_difference"] == round(
        new_price - prices["1151293680"] - prices["4983901480"], 2)
    assert len(out["payment_history"]) == 1  # an exchange only records the request
    assert json.dumps(db["users"][USER0], sort_keys=True) == user_before


def test_return_to_original_method_and_to_gift_card(db):
    out = call_tool(db, "return_delivered_order_items", {
        "order_id": ORDER0, "item_ids": ["9408160950", "4202497723"],
        "payment_method_id": "credit_card_9513926"})
    assert out["status"] == "return requested"
    assert out["return_items"] == ["4202497723", "9408160950"]
    assert out["return_payment_method_id"] == "credit_card_9513926"
    out = call_tool(db, "return_delivered_order_items", {
        "order_id": DELIVERED_GC, "item_ids": ["9370300555"],
        "payment_method_id": "gift_card_7108145"})
    assert out["status"] == "return requested"


def test_cancel_refunds_gift_card_at_once(db):
    card = db["users"]["ethan_lopez_6291"]["payment_methods"]["gift_card_7219486"]
    balance = card["balance"]
    out = call_tool(db, "cancel_pending_order",
                    {"order_id": GC_PAID_PENDING, "reason": "ordered by mistake"})
    assert out["status"] == "cancelled" and out["cancel_reason"] == "ordered by mistake"
    assert out["payment_history"][-1] == {
        "transaction_type": "refund", "amount": 4079.45, "payment_method_id": "gift_card_7219486"}
    assert card["balance"] == round(balance + 4079.45, 2)


def test_modify_items_task21_pays_per_item_but_copies_the_last_variant(db):
    out = call_tool(db, "modify_pending_order_items", {
        "order_id": PENDING_T21, "item_ids": ["9791469541", "1340995114"],
        "new_item_ids": ["4107812777", "1421289881"], "payment_method_id": "gift_card_4332117"})
    assert out["status"] == "pending (item modified)"
    # Task 21's user is told the remaining balance: $44.08.
    card = db["users"]["ethan_garcia_1261"]["payment_methods"]["gift_card_4332117"]
    assert card["balance"] == 44.08
    last = out["payment_history"][-1]
    assert last["transaction_type"] == "payment"
    assert last["payment_method_id"] == "gift_card_4332117"
    assert round(last["amount"], 2) == 41.92
    items = {i["item_id"]: i for i in out["items"]}
    # Upstream tau2 (leaked loop variable, kept on purpose): the payment used per-item prices,
    # but BOTH items get the last new variant's (the keyboard's) price and options; only the
    # item id is per item, and the name and product stay the shoes'.
    keyboard = {"switch type": "linear", "backlight": "none", "size": "80%"}
    assert items["4107812777"]["name"] == "Running Shoes"
    assert items["4107812777"]["price"] == 268.77 and items["4107812777"]["options"] == keyboard
    assert items["1421289881"]["price"] == 268.77 and items["1421289881"]["options"] == keyboard
    # Options are copied per item, not shared with the catalog or with each other.
    stored = {i["item_id"]: i for i in db["orders"][PENDING_T21]["items"]}
    stored["1421289881"]["options"]["size"] = "x"
    assert db["products"]["1656367028"]["variants"]["1421289881"]["options"]["size"] == "80%"
    assert stored["4107812777"]["options"] == keyboard


def test_modify_payment_to_gift_card_and_address_after_item_change(db):
    card = db["users"]["omar_kim_3528"]["payment_methods"]["gift_card_3749819"]
    out = call_tool(db, "modify_pending_order_payment",
                    {"order_id": PENDING_RICH_GC, "payment_method_id": "gift_card_3749819"})
    assert out["payment_history"][1:] == [
        {"transaction_type": "payment", "amount": 53.43, "payment_method_id": "gift_card_3749819"},
        {"transaction_type": "refund", "amount": 53.43, "payment_method_id": "credit_card_3577130"},
    ]
    assert card["balance"] == round(91.0 - 53.43, 2)
    with pytest.raises(RetailToolError, match="^There should be exactly one payment for a pending"):
        call_tool(db, "modify_pending_order_payment",
                  {"order_id": PENDING_RICH_GC, "payment_method_id": "credit_card_3577130"})
    call_tool(db, "modify_pending_order_items", {
        "order_id": PENDING_T21, "item_ids": ["9791469541"], "new_item_ids": ["4107812777"],
        "payment_method_id": "paypal_3798357"})
    # "pending (item modified)" still counts as pending for the address (substring test) ...
    out = call_tool(db, "modify_pending_order_address", {"order_id": PENDING_T21, **ADDRESS})
    assert out["address"] == {k: ADDRESS[k] for k in
                              ("address1", "address2", "city", "country", "state", "zip")}
    # ... but not for cancelling or modifying items again.
    with pytest.raises(RetailToolError, match="^Non-pending order cannot be cancelled$"):
        call_tool(db, "cancel_pending_order",
                  {"order_id": PENDING_T21, "reason": "no longer needed"})


def test_modify_user_address(db):
    out = call_tool(db, "modify_user_address", {"user_id": USER0, **ADDRESS})
    assert out["address"]["city"] == "Austin" == db["users"][USER0]["address"]["city"]


ERROR_CASES = [
    ("cancel_pending_order", {"order_id": ORDER0, "reason": "no longer needed"},
     "Non-pending order cannot be cancelled"),
    ("cancel_pending_order", {"order_id": PENDING_T64, "reason": "too slow"}, "Invalid reason"),
    ("cancel_pending_order", {"order_id": "#W0000000", "reason": "no longer needed"},
     "Order not found"),
    ("modify_pending_order_items", {"order_id": ORDER0, "item_ids": ["1151293680"],
     "new_item_ids": ["7706410293"], "payment_method_id": "credit_card_9513926"},
     "Non-pending order cannot be modified"),
    ("modify_pending_order_items", {"order_id": PENDING_T21, "item_ids": ["1151293680"],
     "new_item_ids": ["7706410293"], "payment_method_id": "paypal_3798357"},
     "1151293680 not found"),
    ("modify_pending_order_items", {"order_id": PENDING_T21, "item_ids": ["1340995114"],
     "new_item_ids": ["1340995114"], "payment_method_id": "paypal_3798357"},
     "The new item id should be different from the old item id"),
    ("modify_pending_order_items", {"order_id": PENDING_T21, "item_ids": ["1340995114"],
     "new_item_ids": [], "payment_method_id": "paypal_3798357"},
     "The number of items to be exchanged should match"),
    ("modify_pending_order_items", {"order_id": PENDING_T21, "item_ids": ["1340995114"],
     "new_item_ids": ["4107812777"], "payment_method_id": "paypal_3798357"}, "Variant not found"),
    ("modify_pending_order_items", {"order_id": "#W5918442", "item_ids": ["1725100896"],
     "new_item_ids": ["1002370030"], "payment_method_id": "credit_card_5051208"},
     "New item 1002370030 not found or available"),
    ("modify_pending_order_items", {"order_id": PENDING_T21, "item_ids": ["1340995114"],
     "new_item_ids": ["1421289881"], "payment_method_id": "credit_card_9513926"},
     "Payment method not found"),
    ("modify_pending_order_items", {"order_id": PENDING_POOR_GC, "item_ids": ["9690244451"],
     "new_item_ids": ["7706410293"], "payment_method_id": "gift_card_2742113"},
     "Insufficient gift card balance to pay for the new item"),
    ("modify_pending_order_payment",
     {"order_id": ORDER0, "payment_method_id": "credit_card_9513926"},
     "Non-pending order cannot be modified"),
    ("modify_pending_order_payment", {"order_id": PENDING_RICH_GC,
     "payment_method_id": "credit_card_3577130"},
     "The new payment method should be different from the current one"),
    ("modify_pending_order_payment", {"order_id": PENDING_POOR_GC,
     "payment_method_id": "gift_card_2742113"},
     "Insufficient gift card balance to pay for the order"),
    ("modify_pending_order_address", {"order_id": ORDER0, **ADDRESS},
     "Non-pending order cannot be modified"),
    ("exchange_delivered_order_items", {"order_id": PENDING_T64, "item_ids": ["1810466394"],
     "new_item_ids": ["6700049080"], "payment_method_id": "paypal_1261484"},
     "Non-delivered order cannot be exchanged"),
    ("exchange_delivered_order_items",
     {"order_id": ORDER0, "item_ids": ["1151293680", "1151293680"],
     "new_item_ids": ["7706410293", "7706410293"], "payment_method_id": "credit_card_9513926"},
     "Number of 1151293680 not found."),
    ("exchange_delivered_order_items", {"order_id": ORDER0, "item_ids": ["1151293680"],
     "new_item_ids": [], "payment_method_id": "credit_card_9513926"},
     "The number of items to be exchanged should match."),
    ("exchange_delivered_order_items", {"order_id": "#W4316152", "item_ids": ["7292993796",
     "7292993796"], "new_item_ids": ["3761330360", "9647374798"],
     "payment_method_id": "gift_card_7245904"},
     "Insufficient gift card balance to pay for the price difference"),
    ("return_delivered_order_items", {"order_id": PENDING_T64, "item_ids": ["1810466394"],
     "payment_method_id": "paypal_1261484"}, "Non-delivered order cannot be returned"),
    ("return_delivered_order_items", {"order_id": DELIVERED_GC, "item_ids": ["9370300555"],
     "payment_method_id": "paypal_4101143"},
     "Payment method should be the original payment method"),
    ("return_delivered_order_items", {"order_id": ORDER0, "item_ids": ["0000000000"],
     "payment_method_id": "credit_card_9513926"}, "Some item not found"),
    ("modify_user_address", {"user_id": "nobody_0", **ADDRESS}, "User not found"),
    ("get_item_details", {"item_id": "0000000000"}, "Item not found"),
    ("get_product_details", {"product_id": "1151293680"}, "Product not found"),
    ("find_user_id_by_email", {"email": "nobody@example.com"}, "User not found"),
    ("find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19123"},
     "User not found"),
    ("calculate", {"expression": "2 + x"}, "Invalid characters in expression"),
    ("calculate", {"expression": "1 / 0"}, "division by zero"),
    ("calculate", {"expression": "9 ** 9 ** 9"}, "exponent too large"),
]


@pytest.mark.parametrize(("tool", "args", "message"), ERROR_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(ERROR_CASES)])
def test_refusals_carry_tau2_message_and_change_nothing(data, tool, args, message):
    db = fresh_db(data)
    with pytest.raises(RetailToolError) as info:
        call_tool(db, tool, args)
    assert str(info.value) == message
    assert db == data.db


def test_call_tool_validates_arguments(db):
    with pytest.raises(RetailToolError, match="not found"):
        call_tool(db, "delete_everything", {})
    with pytest.raises(RetailToolError, match="missing arguments"):
        call_tool(db, "get_order_details", {})
    with pytest.raises(RetailToolError, match="unknown"):
        call_tool(db, "get_order_details", {"order_id": ORDER0, "verbose": True})
    with pytest.raises(RetailToolError, match="list"):
        call_tool(db, "return_delivered_order_items",
                  {"order_id": ORDER0, "item_ids": "1151293680", "payment_method_id": "x"})


# --- scopes, snapshots, keys ------------------------------------------------------------------

WRITE_CALLS = {
    "cancel_pending_order": {"order_id": GC_PAID_PENDING, "reason": "no longer needed"},
    "exchange_delivered_order_items": {"order_id": ORDER0, "item_ids": ["1151293680"],
                                       "new_item_ids": ["7706410293"],
                                       "payment_method_id": "credit_card_9513926"},
    "modify_pending_order_address": {"order_id": PENDING_T64, **ADDRESS},
    "modify_pending_order_items": {"order_id": PENDING_T21,
                                   "item_ids": ["9791469541", "1340995114"],
                                   "new_item_ids": ["4107812777", "1421289881"],
                                   "payment_method_id": "gift_card_4332117"},
    "modify_pending_order_payment": {"order_id": PENDING_RICH_GC,
                                     "payment_method_id": "gift_card_3749819"},
    "modify_user_address": {"user_id": USER0, **ADDRESS},
    "return_delivered_order_items": {"order_id": ORDER0, "item_ids": ["1151293680"],
                                     "payment_method_id": "credit_card_9513926"},
}


def test_write_scopes_cover_every_changed_record(data):
    assert set(WRITE_CALLS) == WRITE_TOOLS
    for name, args in WRITE_CALLS.items():
        db = fresh_db(data)
        reads, writes = TOOLS[name].scopes(db, args)
        subject = (f"retail:user:{USER0}" if name == "modify_user_address"
                   else f"retail:order:{args['order_id']}")
        assert subject in writes and subject in reads, name
        call_tool(db, name, args)
        changed = {(t, k) for t in ("orders", "users", "products") for k in db[t]
                   if db[t][k] != data.db[t][k]}
        assert changed == set(records_for_scopes(db, writes)), name


def test_scope_details():
    db = load_retail().db
    reads, writes = TOOLS["modify_pending_order_items"].scopes(db, WRITE_CALLS[
        "modify_pending_order_items"])
    assert writes == [f"retail:order:{PENDING_T21}", "retail:user:ethan_garcia_1261"]
    assert {"retail:product:1656367028", "retail:product:6938111410"} <= set(reads)
    _, writes = TOOLS["modify_pending_order_items"].scopes(
        db, {**WRITE_CALLS["modify_pending_order_items"], "payment_method_id": "paypal_3798357"})
    assert writes == [f"retail:order:{PENDING_T21}"]  # no gift card: the user is not written
    assert TOOLS["get_order_details"].scopes(db, {"order_id": ORDER0}) == (
        ["retail:order:#W2378156"], [])
    assert TOOLS["list_all_product_types"].scopes(db, {}) == (["retail:product"], [])
    assert TOOLS["find_user_id_by_email"].scopes(db, {"email": "x"}) == (["retail:user"], [])
    assert TOOLS["get_item_details"].scopes(db, {"item_id": "1151293680"}) == (
        ["retail:product:1656367028"], [])
    assert TOOLS["get_item_details"].scopes(db, {"item_id": "0"}) == (["retail:product"], [])
    assert TOOLS["calculate"].scopes(db, {"expression": "1"}) == ([], [])


def test_scopes_never_raise_nor_mutate(data):
    db = data.db
    before = db_sha256(db)
    odd_args = [{}, {"order_id": "#W0000000"}, {"order_id": ["x"], "item_ids": "abc"},
                {"order_id": ORDER0, "item_ids": [1, None], "payment_method_id": {"a": 1}},
                {"user_id": None, "item_id": ["x"], "product_id": 3}]
    for tool in TOOLS.values():
        for args in odd_args:
            reads, writes = tool.scopes(db, args)
            assert all(isinstance(s, str) for s in reads + writes)
        assert tool.scopes(db, None)  # type: ignore[arg-type]
    assert TOOLS["cancel_pending_order"].scopes(db, {"order_id": "#W0000000"}) == (
        ["retail:order:#W0000000"], ["retail:order:#W0000000"])
    assert db_sha256(db) == before


def test_snapshot_restore_round_trip(data):
    initial = db_sha256(data.db)
    for name, args in WRITE_CALLS.items():
        db = fresh_db(data)
        _, writes = TOOLS[name].scopes(db, args)
        snap = snapshot(db, writes)
        call_tool(db, name, args)
        assert db_sha256(db) != initial, name
        restore(db, snap)
        assert db_sha256(db) == initial, name
        restore(db, snap)  # a snapshot can be restored twice
        assert db_sha256(db) == initial, name


def test_restore_removes_records_that_were_absent(db):
    initial = db_sha256(db)
    snap = snapshot(db, ["retail:order:#W0000001", "retail:user:new_user_1"])
    assert snap == {("orders", "#W0000001"): None, ("users", "new_user_1"): None}
    db["orders"]["#W0000001"] = {"order_id": "#W0000001"}
    db["users"]["new_user_1"] = {"user_id": "new_user_1"}
    restore(db, snap)
    assert db_sha256(db) == initial
    with pytest.raises(ValueError, match="not a retail record scope"):
        records_for_scopes(db, ["retail:user"])


def test_order_key_is_stable_and_specific():
    args = WRITE_CALLS["modify_pending_order_items"]
    key = order_key("modify_pending_order_items", args)
    assert key.startswith(f"modify_pending_order_items:{PENDING_T21}:")
    assert key == order_key("modify_pending_order_items", dict(reversed(list(args.items()))))
    assert key != order_key("modify_pending_order_items", {**args, "payment_method_id": "x"})
    assert order_key("modify_user_address", WRITE_CALLS["modify_user_address"]).startswith(
        f"modify_user_address:{USER0}:")


# --- tasks ------------------------------------------------------------------------------------


def test_gold_actions(data):
    tasks = {t["id"]: t for t in data.tasks}
    actions = gold_actions(tasks["0"])
    assert [a["name"] for a in actions][-1] == "exchange_delivered_order_items"
    assert actions[1] == {"name": "get_order_details", "arguments": {"order_id": ORDER0}}
    assert gold_actions(tasks["24"]) == [] and gold_actions({"id": "x"}) == []


def test_select_tasks_is_deterministic(data):
    first = select_tasks(data, "test", 30, seed=0)
    assert [t["id"] for t in first] == [t["id"] for t in select_tasks(data, "test", 30, seed=0)]
    assert len(first) == 30 and len({t["id"] for t in first}) == 30
    assert {t["id"] for t in first} <= set(data.split["test"])
    order = {tid: i for i, tid in enumerate(data.split["test"])}
    assert [order[t["id"]] for t in first] == sorted(order[t["id"]] for t in first)
    assert [t["id"] for t in select_tasks(data, "test", 30, seed=1)] != [t["id"] for t in first]
    assert [t["id"] for t in select_tasks(data, "train", "all")] == data.split["train"]
    assert select_tasks(data, "train", 0) == []
    with pytest.raises(ValueError, match="'test' of size 40"):
        select_tasks(data, "test", 41)
    with pytest.raises(ValueError, match="unknown split"):
        select_tasks(data, "dev", 1)


def _goal_summary(data) -> dict[str, tuple]:
    # Keep only hashes and verdicts: holding 114 DBs alive would slow the GC for the rest.
    out = {}
    for task in data.tasks:
        g = goal_db(data, task)
        out[task["id"]] = (g.sha256, g.succeeded, g.failed_action, g.error, g.failures)
    return out


def test_goal_db_for_all_tasks(data, capsys):
    first, second = _goal_summary(data), _goal_summary(data)
    assert first == second  # deterministic
    counts = {}
    for split in ("train", "test", "base"):
        ids = data.split[split]
        counts[split] = (sum(first[i][1] for i in ids), sum(not first[i][4] for i in ids), len(ids))
    with capsys.disabled():
        print(f"\ngoal_db (complete goal, all actions ok, size): {counts}")
    # Measured on the bundled data and reported: the goal is complete for all but tasks 64 and
    # 105 (a gold write is refused); every gold action succeeds in 99 of 114 tasks.
    assert counts == {"train": (73, 64, 74), "test": (39, 35, 40), "base": (112, 99, 114)}
    assert {i for i, v in first.items() if not v[1]} == {"64", "105"}
    assert first["105"][2] == 0 and "Insufficient gift card balance" in first["105"][3]
    initial = db_sha256(data.db)
    assert first["0"][0] != initial and first["24"][0] == initial and first["24"][1]

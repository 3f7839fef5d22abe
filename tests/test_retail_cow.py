"""Copy-on-write retail DBs: isolation between trials, tau2 semantics, exact hashes, generated
pending orders, and the throwaway/durable trial stores."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atomix.adapters import SQLiteStore
from harness.experiment.config import config_hash, load_config
from harness.experiment.trial import TrialSpec, run_trial
from harness.workloads.retail import (
    TOOLS,
    RetailToolError,
    call_tool,
    db_sha256,
    fresh_db,
    goal_db,
    load_retail,
    restore,
    snapshot,
)
from harness.workloads.retail.cow import (
    FrozenDict,
    FrozenList,
    RecordTable,
    cow_db,
    fork_db,
    pristine,
)
from harness.workloads.retail.data import (
    GENERATED_ORDER_PREFIX,
    full_sha256,
    pending_orders,
    with_pending_orders,
)
from harness.workloads.retail.substrate import RetailStore
from harness.workloads.retail.workload import (
    GENERATED_SUBSTRATE,
    _gold_replay,
    _money,
    _pending_orders,
)
from harness.world.substrates import MemorySQLiteStore, TrialEnv, ram_dir

DATA = load_retail()
PRISTINE_SHA = full_sha256(DATA.db)
PENDING = pending_orders(DATA.db)
DELIVERED = tuple(sorted(o for o, r in DATA.db["orders"].items() if r["status"] == "delivered"))
USERS = tuple(sorted(DATA.db["users"]))
ADDRESS = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX",
           "country": "USA", "zip": "78701"}


def _plain(db: dict[str, Any]) -> dict[str, Any]:
    """A cow_db's state as plain dicts (what a plain-dict DB would hold)."""
    return json.loads(json.dumps(db, default=lambda t: dict(t.items())))


# --- isolation ---------------------------------------------------------------------------------


def test_a_trials_writes_reach_neither_the_pristine_db_nor_another_trial() -> None:
    one, two = cow_db(DATA), cow_db(DATA)
    assert all(isinstance(table, RecordTable) for table in one.values())
    order = PENDING[0]
    call_tool(one, "modify_pending_order_address", {"order_id": order, **ADDRESS})
    call_tool(one, "cancel_pending_order", {"order_id": PENDING[1], "reason": "no longer needed"})
    one["users"][USERS[0]]["name"]["first_name"] = "Changed"  # a direct, in-place change
    assert one["orders"][order]["address"] == ADDRESS
    assert two["orders"][order]["address"] == DATA.db["orders"][order]["address"] != ADDRESS
    assert two["users"][USERS[0]]["name"] == DATA.db["users"][USERS[0]]["name"]
    assert db_sha256(two) == PRISTINE_SHA == pristine(DATA).sha256_hex
    assert db_sha256(cow_db(DATA)) == PRISTINE_SHA
    assert full_sha256(DATA.db) == PRISTINE_SHA
    assert db_sha256(one) != PRISTINE_SHA


def test_records_reached_by_iteration_are_shared_and_refuse_changes() -> None:
    db = cow_db(DATA)
    record = next(iter(db["orders"].values()))
    assert isinstance(record, FrozenDict) and isinstance(record["items"], FrozenList)
    with pytest.raises(TypeError, match="read-only"):
        record["status"] = "cancelled"
    with pytest.raises(TypeError, match="read-only"):
        record["payment_history"].append({})
    with pytest.raises(TypeError, match="read-only"):
        record["address"].update(ADDRESS)
    own = db["orders"][record["order_id"]]  # looked up by key: the trial's own plain copy
    assert type(own) is dict and own == record and own is not record
    own["status"] = "cancelled"
    assert dict(db["orders"].items())[record["order_id"]]["status"] == "cancelled"
    assert pristine(DATA).tables["orders"][record["order_id"]]["status"] != "cancelled"
    # Copies of shared records are plain and mutable.
    for clone in (copy.deepcopy(record), json.loads(json.dumps(record))):
        assert type(clone) is dict and type(clone["items"]) is list
        clone["items"].append({})
    assert type(copy.copy(record)) is dict


def test_a_table_behaves_like_a_plain_dict_of_records() -> None:
    db, plain = cow_db(DATA), fresh_db(DATA)
    for table in (db["users"], plain["users"]):
        first = next(iter(table))
        del table[first]
        table["zz_new"] = {"user_id": "zz_new"}
        table[first] = {"user_id": first}  # re-added: now iterates last, as in a dict
        table.pop(USERS[5])
        table.setdefault("aa_new", {"user_id": "aa_new"})
        with pytest.raises(KeyError):
            del table["missing"]
    assert list(db["users"]) == list(plain["users"])
    assert len(db["users"]) == len(plain["users"])
    assert dict(db["users"].items()) == plain["users"] and db["users"] == plain["users"]
    assert USERS[5] not in db["users"] and "zz_new" in db["users"]
    assert db["users"].get(USERS[5]) is None and db["users"].get("zz_new") == {"user_id": "zz_new"}
    assert db_sha256(db) == full_sha256(plain)  # records added and removed: the full path


def test_fork_is_independent_of_its_origin() -> None:
    db = cow_db(DATA)
    call_tool(db, "modify_pending_order_address", {"order_id": PENDING[2], **ADDRESS})
    twin = fork_db(db)
    assert db_sha256(twin) == db_sha256(db)
    call_tool(twin, "cancel_pending_order", {"order_id": PENDING[2], "reason": "no longer needed"})
    assert db["orders"][PENDING[2]]["status"] == "pending"
    assert twin["orders"][PENDING[2]]["address"] == ADDRESS


def test_a_tcc_check_never_changes_the_trials_db() -> None:
    store = RetailStore(cow_db(DATA))
    before = store.snapshot()
    store.check("cancel_pending_order", {"order_id": PENDING[3], "reason": "no longer needed"})
    assert store.snapshot() == before
    assert store.db["orders"][PENDING[3]]["status"] == "pending"


# --- the same semantics and hashes as a plain-dict DB -------------------------------------------


def _draw_call(draw: Any, plain: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A retail call with arguments taken from the current DB (so that writes mostly succeed;
    some are refused, as an agent's calls are)."""
    orders = plain["orders"]
    order_id = draw(st.sampled_from(PENDING[:40] + DELIVERED[:40]))
    order = orders[order_id]
    user = plain["users"][order["user_id"]]
    methods = sorted(user["payment_methods"])
    method = draw(st.sampled_from(methods))
    items = [i["item_id"] for i in order["items"]]
    item = draw(st.sampled_from(items))
    product = next(i["product_id"] for i in order["items"] if i["item_id"] == item)
    variant = draw(st.sampled_from(sorted(plain["products"][product]["variants"])))
    name = draw(st.sampled_from(sorted(TOOLS)))
    args_by_tool: dict[str, dict[str, Any]] = {
        "calculate": {"expression": "2 * 3.5"},
        "cancel_pending_order": {"order_id": order_id,
                                 "reason": draw(st.sampled_from(["no longer needed", "bored"]))},
        "exchange_delivered_order_items": {"order_id": order_id, "item_ids": [item],
                                           "new_item_ids": [variant], "payment_method_id": method},
        "find_user_id_by_email": {"email": user["email"].upper()},
        "find_user_id_by_name_zip": {**{k: user["name"][k] for k in ("first_name", "last_name")},
                                     "zip": user["address"]["zip"]},
        "get_item_details": {"item_id": variant},
        "get_order_details": {"order_id": order_id},
        "get_product_details": {"product_id": product},
        "get_user_details": {"user_id": user["user_id"]},
        "list_all_product_types": {},
        "modify_pending_order_address": {"order_id": order_id, **ADDRESS,
                                         "zip": draw(st.sampled_from(["1", "2"]))},
        "modify_pending_order_items": {"order_id": order_id, "item_ids": [item],
                                       "new_item_ids": [variant], "payment_method_id": method},
        "modify_pending_order_payment": {"order_id": order_id, "payment_method_id": method},
        "modify_user_address": {"user_id": user["user_id"], **ADDRESS},
        "return_delivered_order_items": {"order_id": order_id, "item_ids": [item],
                                         "payment_method_id": method},
        "transfer_to_human_agents": {"summary": "help"},
    }
    return name, args_by_tool[name]


def _outcome(db: dict[str, Any], name: str, args: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", call_tool(db, name, copy.deepcopy(args))
    except RetailToolError as exc:
        return "refused", str(exc)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_tool_sequences_match_a_plain_db_and_its_full_hash(data: Any) -> None:
    cow, plain = cow_db(DATA), fresh_db(DATA)
    undo: list[dict[Any, Any]] = []
    for _ in range(data.draw(st.integers(1, 8), label="calls")):
        name, args = _draw_call(data.draw, plain)
        _, writes = TOOLS[name].scopes(plain, args)
        assert TOOLS[name].scopes(cow, args) == TOOLS[name].scopes(plain, args)
        if writes and data.draw(st.booleans(), label="take a before-image"):
            undo.append((snapshot(cow, writes), snapshot(plain, writes)))
        assert _outcome(cow, name, args) == _outcome(plain, name, args), name
        if undo and data.draw(st.booleans(), label="restore a before-image"):
            cow_image, plain_image = undo.pop(data.draw(st.integers(0, len(undo) - 1)))
            restore(cow, cow_image)
            restore(plain, plain_image)
        touched = {(t, k) for t in ("orders", "users", "products") for k, _ in cow[t].local_items()}
        assert all(cow[t][k] == plain[t][k] for t, k in touched)
    assert db_sha256(cow) == full_sha256(plain) == full_sha256(_plain(cow))
    assert _plain(cow) == plain
    assert db_sha256(cow_db(DATA)) == PRISTINE_SHA  # nothing leaked into the shared DB


def test_gold_replay_matches_goal_db_for_every_task() -> None:
    for task in DATA.tasks:
        goal = goal_db(DATA, task)
        sha, failed = _gold_replay(DATA, task["id"])
        assert sha == goal.sha256, task["id"]
        assert failed == {index for index, _ in goal.failures}, task["id"]


def test_a_cached_final_state_is_still_the_exact_hash() -> None:
    for _ in range(2):  # the second time the state is answered from the cache
        db, plain = cow_db(DATA), fresh_db(DATA)
        for d in (db, plain):
            call_tool(d, "modify_pending_order_payment",
                      {"order_id": "#W1080318", "payment_method_id": "gift_card_3749819"})
        assert db_sha256(db) == full_sha256(plain)


# --- generated pending orders ------------------------------------------------------------------


def test_generated_pending_orders_are_valid_consistent_and_deterministic() -> None:
    generated = with_pending_orders(DATA, 1024)
    db = generated.db
    pool = pending_orders(db)
    assert len(pool) == 1024 and set(PENDING) <= set(pool)
    again = with_pending_orders.__wrapped__(DATA, 1024).db  # built anew: the same DB, same order
    assert json.dumps(again) == json.dumps(db)
    for order_id, record in DATA.db["orders"].items():
        assert db["orders"][order_id] == record  # the real orders are untouched
    new = [o for o in pool if o.startswith(GENERATED_ORDER_PREFIX)]
    assert len(new) == 1024 - len(PENDING)
    for order_id in new:
        order = db["orders"][order_id]
        assert order["order_id"] == order_id and order["status"] == "pending"
        user = db["users"][order["user_id"]]
        assert user["orders"].count(order_id) == 1
        assert order["address"] == user["address"]
        (payment,) = order["payment_history"]
        method = user["payment_methods"][payment["payment_method_id"]]
        assert method["source"] in ("credit_card", "paypal")
        assert payment["amount"] == round(sum(i["price"] for i in order["items"]), 2)
        for item in order["items"]:
            assert item["item_id"] in db["products"][item["product_id"]]["variants"]
    assert _money(db) == (_money(DATA.db)[0], 0)  # gift-card money unchanged, all consistent
    assert with_pending_orders(DATA, 10) is DATA  # enough real ones: the real data itself


def test_generated_orders_work_with_the_tools_and_the_hash() -> None:
    generated = with_pending_orders(DATA, 1024)
    cow, plain = cow_db(generated), fresh_db(generated)
    order_id = f"{GENERATED_ORDER_PREFIX}0000007"
    for d in (cow, plain):
        call_tool(d, "modify_pending_order_address", {"order_id": order_id, **ADDRESS})
        call_tool(d, "cancel_pending_order", {"order_id": f"{GENERATED_ORDER_PREFIX}0000008",
                                              "reason": "ordered by mistake"})
    assert db_sha256(cow) == full_sha256(plain)


def _contention(mode: str, agents: int, disjoint: bool = True, **extra: Any) -> dict[str, Any]:
    params = {"agents": agents, "disjoint": disjoint, **extra}
    return run_trial(TrialSpec("c", "tau_contention", mode, f"n={agents}", {}, 0, 5, params=params))


def test_disjoint_runs_past_the_real_pool_use_generated_orders_and_say_so() -> None:
    big = _contention("no-tx", 600)
    assert big["final"]["substrate"] == GENERATED_SUBSTRATE
    assert big["metrics"]["invariant_violations"] == 0 and big["metrics"]["committed"] == 600
    small = _contention("no-tx", 8)
    assert set(small["final"]) == {"db_sha256"}  # the real DB: records as before
    contended = _contention("workflow-lock", 600, disjoint=False)  # 2 contended orders: real DB
    assert set(contended["final"]) == {"db_sha256"}
    assert contended["metrics"]["invariant_violations"] == 0
    assert len(_pending_orders(DATA)) == len(PENDING) == 423


def test_contention_params_accept_up_to_1024_agents() -> None:
    from harness.workloads.retail.workload import TauContentionParams

    assert TauContentionParams.model_validate({"agents": 1024, "disjoint": True}).agents == 1024
    with pytest.raises(ValueError, match="less than or equal to 1024"):
        TauContentionParams.model_validate({"agents": 1025})
    with pytest.raises(ValueError, match="contended: must be at most 1024"):
        TauContentionParams.model_validate({"agents": 4, "contended": 1025})


# --- throwaway and durable trial stores --------------------------------------------------------


def test_throwaway_stores_keep_sqlite_in_memory_and_the_directory_in_ram(tmp_path: Path) -> None:
    env = TrialEnv.create()
    assert env._workdir is None  # nothing made until a store is used
    env.db.put("t", 1, {"v": 1})
    env.files.write("a.txt", "x")
    env.mailbox.send("a@example.com", "s", "b", key="k")
    assert isinstance(env.db, MemorySQLiteStore)
    assert not env.db.path.exists()  # the path names the database in scopes only
    if ram_dir() is not None:
        assert env.workdir.parent == ram_dir()
    snap = env.snapshot()
    assert snap["db"] == {"t": {"1": {"v": 1}}} and snap["files"] == {"a.txt": "x"}
    workdir = env.workdir
    env.close()
    assert not workdir.exists()
    durable = TrialEnv.create(tmp_path, durable=True)
    durable.db.put("t", 1, {"v": 1})
    assert type(durable.db) is SQLiteStore and durable.db.path.is_file()
    durable.close()
    assert durable.workdir.parent == tmp_path and durable.workdir.exists()  # a given parent: kept


def test_memory_sqlite_store_keeps_the_sqlite_store_guarantees(tmp_path: Path) -> None:
    from atomix.adapters.sqlite import row_effect

    for store in (MemorySQLiteStore(tmp_path / "m.sqlite"), SQLiteStore(tmp_path / "f.sqlite")):
        assert store.put("rows", 42, {"v": 1}, key="k1") is True
        assert store.put("rows", "42", {"v": 2}, key="k1") is False  # applied once per key
        effects = [row_effect(store, "rows", n, {"n": n}, key=f"e{n}") for n in range(3)]
        with pytest.raises(RuntimeError):
            store.apply_batch(effects, _fail_after_rows=True)  # all or nothing
        assert store.snapshot() == {"rows": {"42": {"v": 1}}}
        store.apply_batch(effects)
        assert store.get("rows", 2) == {"n": 2} and "e2" in store.applied_keys()
        assert store.scope("rows", 42).endswith(":rows:42")
        store.close()


@pytest.mark.parametrize("workload", ["synthetic", "leakage"])
def test_durable_and_throwaway_stores_give_the_same_records(workload: str) -> None:
    def record(durable: bool) -> dict[str, Any]:
        spec = TrialSpec("probe", workload, "mutex-wal", "c", {}, 1, 3, durable=durable)
        out = run_trial(spec)
        out.pop("timings")
        return out

    assert record(True) == record(False)


def test_durable_key_is_left_out_of_the_config_hash_while_false() -> None:
    path = Path(__file__).resolve().parents[1] / "configs" / "leakage.yaml"
    plain = load_config(path)
    assert not plain.durable and "durable" not in plain.model_dump(mode="json")
    assert config_hash(load_config(path, overrides={"durable": False})) == config_hash(plain)
    durable = load_config(path, overrides={"durable": True})
    assert durable.model_dump(mode="json")["durable"] is True
    assert config_hash(durable) != config_hash(plain)

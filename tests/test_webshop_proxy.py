"""The web-shop PROXY workload (paper Table 5's WebArena columns, not WebArena): its shop on
real SQLite and a real mailbox, its page and element scopes, the settlement metadata of its
actions (keys, undo), its task bank and goal states, and whole trials under real modes."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError
from support import CONFIGS

from atomix.effects import EffectClass
from atomix.scope_parsing import parse_scope
from harness.agents.policies import AgentConfig
from harness.experiment.config import load_config
from harness.experiment.trial import TrialSpec, run_trial
from harness.workloads import get_workload
from harness.workloads.webshop import WebshopParams, shop
from harness.workloads.webshop.tasks import KINDS, goal_state, task_bank
from harness.workloads.webshop.tools import TOOLS
from harness.world.faults import FaultConfig
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolError


@pytest.fixture
def env() -> Any:
    e = TrialEnv.create()
    shop.setup(e)
    yield e
    e.close()


def _run(env: TrialEnv, tool: str, key: str | None = None, **args: Any) -> Any:
    return TOOLS[tool].run(env, args, Delivery(key, {"agent": "a0", "attempt": 1, "op": f"op-{tool}"}))


# --------------------------------------------------------------------------- scopes


def test_a_page_covers_its_elements_and_elements_do_not_overlap_each_other() -> None:
    cart = parse_scope(shop.page_scope("cart", "alice"))
    qty3 = parse_scope(shop.scope("cart", "alice", "qty-sku3"))
    qty4 = parse_scope(shop.scope("cart", "alice", "qty-sku4"))
    assert str(cart) == "web:shop.local:cart:alice"
    assert cart.covers(qty3) and cart.overlaps(qty4)
    assert not qty3.overlaps(qty4)
    assert not cart.overlaps(parse_scope(shop.page_scope("cart", "bob")))  # a session page per user
    catalog = parse_scope(shop.page_scope("catalog", "alice"))
    assert catalog.covers(parse_scope(shop.page_scope("product", "bob", "sku7")))


def test_actions_declare_element_scopes_and_checkout_names_the_mailbox(env: TrialEnv) -> None:
    add = TOOLS["add_to_cart"]
    assert add.writes(env, {"user": "alice", "sku": "sku3"}) == ["web:shop.local:cart:alice:qty-sku3"]
    assert add.reads(env, {"user": "alice", "sku": "sku3"}) == ["web:shop.local:product:sku3"]
    order = TOOLS["place_order"].writes(env, {"user": "alice"})
    assert "mail:alice@example.com" in order and "web:shop.local:cart:alice" in order
    assert TOOLS["save_address"].writes(env, {"user": "bob"}) == ["web:shop.local:account:bob"]
    assert TOOLS["open_page"].effect is None
    assert TOOLS["place_order"].effect is EffectClass.IRREVERSIBLE
    assert TOOLS["book_pickup"].effect is EffectClass.REVERSIBLE


def test_unknown_pages_users_and_products_are_refused_as_a_site_would(env: TrialEnv) -> None:
    with pytest.raises(ToolError, match="no page 'basket'"):
        _run(env, "open_page", user="alice", page="basket")
    with pytest.raises(ToolError, match="no signed-in user"):
        _run(env, "open_page", user="mallory", page="cart")
    with pytest.raises(ToolError, match="no product"):
        _run(env, "add_to_cart", user="alice", sku="sku99")


# --------------------------------------------------------------------------- the shop itself


def test_checkout_places_an_order_takes_stock_empties_the_cart_and_mails_once(env: TrialEnv) -> None:
    _run(env, "add_to_cart", user="alice", sku="sku3")
    _run(env, "add_to_cart", user="alice", sku="sku3")
    _run(env, "apply_coupon", user="alice", code="SAVE10")
    assert "qty-sku3=2" in _run(env, "open_page", user="alice", page="cart")
    result = _run(env, "place_order", key="k-order", user="alice")
    assert result == {"order": "alice-1", "total_cents": 8100}  # 2 x 45.00 less 10%
    db = env.db.snapshot()
    assert db["orders"]["alice-1"]["lines"] == {"sku3": 2}
    assert db["products"]["sku3"]["stock"] == 2
    assert shop.cart_lines(env, "alice") == {}
    # The mailbox's own file holds the confirmation.
    lines = (env.workdir / "mailbox.jsonl").read_text().splitlines()
    assert [json.loads(x)["subject"] for x in lines] == ["Order alice-1 confirmed"]
    # The same delivery again (its key): nothing more is placed, taken or mailed.
    assert _run(env, "place_order", key="k-order", user="alice") == {"status": "already applied"}
    assert env.db.snapshot() == db and len(env.messages()) == 1
    # Without a key, a second click finds the cart empty.
    with pytest.raises(ToolError, match="cart is empty"):
        _run(env, "place_order", user="alice")


def test_a_keyed_redelivery_changes_nothing_and_an_unkeyed_one_applies_twice(env: TrialEnv) -> None:
    _run(env, "add_to_cart", key="k1", user="carol", sku="sku1")
    _run(env, "add_to_cart", key="k1", user="carol", sku="sku1")
    assert shop.cart_lines(env, "carol") == {"sku1": 1}
    _run(env, "add_to_cart", user="carol", sku="sku1")
    _run(env, "add_to_cart", user="carol", sku="sku1")
    assert shop.cart_lines(env, "carol") == {"sku1": 3}
    _run(env, "book_pickup", key="k2", user="carol", slot="mon-pm")
    assert _run(env, "book_pickup", key="k2", user="carol", slot="mon-pm") == ["carol"]  # no 409
    with pytest.raises(ToolError, match="already holds"):
        _run(env, "book_pickup", user="carol", slot="mon-pm")


def test_the_address_form_keeps_a_draft_until_it_is_saved(env: TrialEnv) -> None:
    _run(env, "fill_field", user="erin", field="city", value="Lakeside")
    assert env.db.get("profiles", "erin")["city"] == "Springfield"
    assert "addr-city=Lakeside" in _run(env, "open_page", user="erin", page="account")
    _run(env, "save_address", user="erin")
    assert env.db.get("profiles", "erin")["city"] == "Lakeside"
    assert shop.draft(env, "erin") == {}
    with pytest.raises(ToolError, match="no field addr-country"):
        _run(env, "fill_field", user="erin", field="country", value="X")


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("add_to_cart", {"user": "bob", "sku": "sku2"}),
        ("set_quantity", {"user": "dave", "sku": "sku9", "qty": 0}),
        ("apply_coupon", {"user": "bob", "code": "KITCHEN20"}),
        ("fill_field", {"user": "alice", "field": "zip", "value": "20001"}),
        ("save_address", {"user": "alice"}),
        ("toggle_newsletter", {"user": "carol"}),
        ("post_review", {"user": "carol", "sku": "sku4", "stars": 5, "text": "ok"}),
        ("book_pickup", {"user": "alice", "slot": "mon-am"}),
    ],
)
def test_undo_restores_every_row_a_revocable_action_wrote(env: TrialEnv, tool: str, args: dict[str, Any]) -> None:
    _run(env, "fill_field", user="alice", field="street", value="9 Dock St")  # a draft to save
    start = env.snapshot()
    t = TOOLS[tool]
    assert t.before is not None and t.undo is not None
    before = t.before(env, args)
    t.run(env, args, Delivery("k", {"op": tool}))
    assert env.snapshot() != start
    t.undo(env, args, before, Delivery(None, {"op": tool, "undo": True}))
    assert env.snapshot() == start


def test_tcc_checks_refuse_without_any_effect(env: TrialEnv) -> None:
    start = env.snapshot()
    with pytest.raises(ToolError, match="only 3 of sku12"):
        TOOLS["set_quantity"].check(env, {"user": "alice", "sku": "sku12", "qty": 4})  # type: ignore[misc]
    with pytest.raises(ToolError, match="not valid"):
        TOOLS["apply_coupon"].check(env, {"user": "alice", "code": "FREE"})  # type: ignore[misc]
    with pytest.raises(ToolError, match="already holds"):
        TOOLS["book_pickup"].check(env, {"user": "carol", "slot": "mon-am"})  # type: ignore[misc]
    assert env.snapshot() == start


# --------------------------------------------------------------------------- tasks and goals


def test_the_task_bank_is_a_pure_function_of_size_and_seed() -> None:
    a, b = task_bank(30, 0), task_bank(30, 0)
    assert [(t.kind, t.task) for t in a] == [(t.kind, t.task) for t in b]
    assert [t.task.steps for t in task_bank(30, 1)] != [t.task.steps for t in a]
    assert Counter(t.kind for t in a) == dict.fromkeys(KINDS, 5)
    assert len({t.task.task_id for t in a}) == 30


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_gold_plan_runs_without_refusal_and_changes_the_shop(seed: int) -> None:
    initial = TrialEnv.create()
    try:
        shop.setup(initial)
        start = initial.snapshot()
    finally:
        initial.close()
    for scripted in task_bank(40, seed):
        goal = goal_state(scripted.task)  # raises if a gold step is refused
        assert goal != start, scripted.task.task_id
        buys = any(s.tool == "place_order" for s in scripted.task.steps)
        assert (len(goal["mailbox"]) == 1) == buys
        assert len(goal["db"].get("orders", {})) == int(buys)


def test_params_are_checked_strictly() -> None:
    assert WebshopParams.model_validate({}).tasks == 30
    for bad in ({"tasks": 19}, {"tasks": 41}, {"tasks": "30"}, {"task": 30}):
        with pytest.raises(ValidationError):
            WebshopParams.model_validate(bad)


# --------------------------------------------------------------------------- whole trials


def _spec(mode: str, trial: int, faults: FaultConfig | None = None, kind: str = "gold") -> TrialSpec:
    return TrialSpec("probe", "webshop", mode, "c", {}, trial, 5, faults=faults or FaultConfig(),
                     params={"tasks": 30}, agent=AgentConfig(kind=kind, max_steps=30))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["tx-full", "checkpoint-replay", "tcc", "saga", "mutex-wal"])
def test_without_faults_every_mode_ends_clean_on_every_kind_of_task(mode: str) -> None:
    for trial in range(len(KINDS)):
        record = run_trial(_spec(mode, trial))
        assert record["metrics"]["clean"], (mode, record["final"], record["agents"])
        assert record["final"]["kind"] == KINDS[trial]


def test_duplicate_deliveries_are_absorbed_by_keys_under_tx_full_and_doubled_under_saga() -> None:
    every_call_twice = FaultConfig(rate=1.0, classes="F4")
    trial = 0  # a "buy" task: add_to_cart is not idempotent
    tx = run_trial(_spec("tx-full", trial, every_call_twice))
    saga = run_trial(_spec("saga", trial, every_call_twice))
    assert tx["metrics"]["clean"] and tx["metrics"]["duplicates"] == 0
    assert tx["metrics"]["orders_placed"] == 1 and tx["metrics"]["confirmations"] == 1
    assert not saga["metrics"]["clean"] and saga["metrics"]["duplicates"] > 0


def test_a_trial_is_reproducible_from_its_spec() -> None:
    spec = _spec("saga", 7, FaultConfig(rate=0.3, classes="mixed"), kind="llm-like")
    a, b = run_trial(spec), run_trial(spec)
    a.pop("timings"), b.pop("timings")
    assert a == b


def test_the_config_is_labelled_a_proxy_and_maps_table_5() -> None:
    config = load_config(CONFIGS / "webshop_proxy.yaml")
    assert "proxy" in config.name and "PROXY" in config.description and "not WebArena" in config.description
    assert all("PROXY" in t.title for t in config.report.tables)
    (entry,) = config.paper
    assert entry.table == 5 and not entry.variant  # the proxy is how Table 5 is reproduced here
    assert get_workload("webshop").description.startswith("PROXY for WebArena")

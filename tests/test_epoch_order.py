"""The epoch_order workload: first come, first served on the last unit of stock, on real
SQLite rows and the real mailbox, judged from the substrates by the workload's own arrival
order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harness.experiment.config import load_config
from harness.experiment.runner import run
from harness.experiment.trial import TrialSpec, derive_rng, run_trial
from harness.workloads import WORKLOADS, get_workload
from harness.workloads.epoch_order import (
    TOOLS,
    EpochOrderParams,
    Request,
    draw_requests,
    earliest,
    earliest_slower,
    invariant_count,
    judge_order,
    mail_text,
    plan,
)
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "epoch_order.yaml"

# Three requests for one item, arriving in the order c2, c0, c1 (not index order).
REQUESTS = [
    Request(0, "c0", "customer0@example.com", "item0", 40.0, 0),
    Request(1, "c1", "customer1@example.com", "item0", 70.0, 1),
    Request(2, "c2", "customer2@example.com", "item0", 10.0, 3),
]


def _env(holders: list[str], answers: dict[str, str], mails: dict[str, bool]) -> TrialEnv:
    """A trial's substrates as a run might leave them: who holds the unit, each customer's
    request row, and the mail each customer got (True: a confirmation)."""
    env = TrialEnv.create()
    left = 1 - len(holders)
    env.db.put("stock", "item0", {"left": left, "holders": holders})
    for customer, status in answers.items():
        env.db.put("requests", customer, {"item": "item0", "status": status})
    for r in REQUESTS:
        if r.customer in mails:
            m = mail_text(r, mails[r.customer])
            env.mailbox.send(m["to"], m["subject"], m["body"])
    return env


def _judge(holders: list[str], answers: dict[str, str], mails: dict[str, bool]) -> dict[str, int]:
    env = _env(holders, answers, mails)
    try:
        return judge_order(env, REQUESTS, notify=True)
    finally:
        env.close()


def test_first_is_the_earliest_arrival_not_the_lowest_index() -> None:
    assert earliest(REQUESTS)["item0"].customer == "c2"
    assert earliest_slower(REQUESTS)  # c2 arrived first with the most work


def test_the_oracle_counts_a_unit_that_went_to_a_later_arrival() -> None:
    bought = {"c0": "bought", "c1": "sold_out", "c2": "sold_out"}
    counts = _judge(["c0"], bought, {"c0": True, "c1": False, "c2": False})
    assert counts["order_violations"] == 1
    assert (counts["oversold"], counts["inconsistent"], counts["mail_mismatch"]) == (0, 0, 0)
    assert invariant_count(counts) == 1


def test_the_oracle_finds_nothing_wrong_with_first_come_first_served() -> None:
    served = {"c0": "sold_out", "c1": "sold_out", "c2": "bought"}
    counts = _judge(["c2"], served, {"c0": False, "c1": False, "c2": True})
    assert counts == {"order_violations": 0, "unsold": 0, "oversold": 0, "inconsistent": 0,
                      "unanswered": 0, "mail_mismatch": 0}
    assert invariant_count(counts) == 0


def test_the_oracle_counts_oversold_inconsistent_unanswered_and_wrong_mail() -> None:
    # Two holders of one unit (one of them the earliest), c1 told it bought though it holds
    # nothing, c0 never answered, c2 mailed "sold out" although it holds the unit.
    counts = _judge(["c2", "c0"], {"c1": "bought", "c2": "bought"},
                    {"c1": True, "c2": False})
    assert counts["order_violations"] == 1  # c0 holds a unit: someone other than c2 got one
    assert counts["oversold"] == 2  # one holder too many, and the row one below zero
    assert counts["unanswered"] == 1 and counts["inconsistent"] == 2  # c0 holds, unanswered; c1
    assert counts["mail_mismatch"] == 1  # c2
    counts = _judge([], {}, {})
    assert counts["unsold"] == 1 and counts["unanswered"] == 3 and counts["order_violations"] == 0


def test_the_conditional_write_takes_the_unit_only_while_one_is_left() -> None:
    env = TrialEnv.create()
    try:
        env.db.put("stock", "item0", {"left": 1, "holders": []})
        order = TOOLS["place_order"]
        first = order.run(env, {"item": "item0", "customer": "c0", "intent": "buy"}, Delivery(None, {}))
        second = order.run(env, {"item": "item0", "customer": "c1", "intent": "buy"}, Delivery(None, {}))
        assert first == {"bought": True, "status": "bought"}
        assert second == {"bought": False, "status": "sold_out"}
        assert env.db.get("stock", "item0") == {"left": 0, "holders": ["c0"]}
        assert env.db.get("requests", "c1") == {"item": "item0", "status": "sold_out"}
    finally:
        env.close()


def _scenario(seed: int, trial: int = 0, **params: Any) -> Any:
    return get_workload("epoch_order").scenario(derive_rng(seed, "scenario", trial), trial, params)


def _static(scenario: Any) -> list[list[tuple[str, Any]]]:
    return [[(s.tool, None if callable(s.args) else dict(s.args)) for s in t.steps]
            for t in scenario.tasks]


def test_the_scenario_is_a_function_of_its_seed() -> None:
    one, two = _scenario(7, notify=True), _scenario(7, notify=True)
    assert one.start_offsets_ms == two.start_offsets_ms and one.info == two.info
    assert _static(one) == _static(two)
    assert one.expected() == two.expected()
    other = _scenario(8, notify=True)
    assert other.start_offsets_ms != one.start_offsets_ms


def test_arrivals_and_work_are_drawn_within_the_params() -> None:
    p = EpochOrderParams.model_validate({"agents": 5, "arrival_ms": [10, 20], "work_calls": [1, 2]})
    for seed in range(20):
        for r in draw_requests(derive_rng(seed, "x"), p):
            assert 10 <= r.arrival_ms <= 20 and 1 <= r.work_calls <= 2 and r.item == "item0"
            steps = plan(r, notify=False)
            assert [s.tool for s in steps][:2] == ["check_stock", "get_customer"]
            assert sum(s.tool == "get_quote" for s in steps) == r.work_calls
    disjoint = draw_requests(derive_rng(0, "x"), p.model_copy(update={"disjoint": True}))
    assert len({r.item for r in disjoint}) == 5


@pytest.mark.parametrize("bad", [{"work_calls": [3, 1]}, {"work_calls": [0, 99]},
                                 {"agents": 1}, {"arrival_ms": [5, 1]}, {"agnets": 3}])
def test_bad_params_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        EpochOrderParams.model_validate(bad)


def test_the_goal_is_the_serial_run_in_arrival_order() -> None:
    scenario = _scenario(2026, trial=2, notify=True)
    first = min(range(3), key=lambda i: (scenario.start_offsets_ms[i], i))
    goal = scenario.expected()
    assert goal["db"]["stock"]["item0"]["holders"] == [f"c{first}"]
    statuses = {c: row["status"] for c, row in goal["db"]["requests"].items()}
    assert statuses == {f"c{i}": ("bought" if i == first else "sold_out") for i in range(3)}
    assert len(goal["mailbox"]) == 3


def _trial(mode: str, index: int, **params: Any) -> dict[str, Any]:
    spec = TrialSpec("eo-test", "epoch_order", mode, "c", {}, index, 2026,
                     params={"notify": True, **params})
    return run_trial(spec)


def test_the_frontier_serves_the_earliest_arrival_where_commit_at_seal_does_not() -> None:
    # Over a few paired trials: tx-full never gives the unit to a later arrival; no-frontier,
    # the same runtime committing at seal, does whenever a later request reaches commit first.
    full = [_trial("tx-full", i)["metrics"] for i in range(12)]
    bare = [_trial("no-frontier", i)["metrics"] for i in range(12)]
    assert all(m["order_violations"] == 0 and m["clean"] for m in full)
    assert any(m["order_violations"] for m in bare)
    assert all(m["stuck"] == 0 and m["oversold"] == 0 for m in full + bare)
    # Where no-frontier violated the order, the goal state (first come, first served) was missed.
    assert all(not m["goal"] for m in bare if m["order_violations"])


def test_the_disjoint_control_waits_only_under_a_global_frontier() -> None:
    full = [_trial("tx-full", i, disjoint=True)["metrics"] for i in range(6)]
    glob = [_trial("tx-global-frontier", i, disjoint=True)["metrics"] for i in range(6)]
    assert all(m["needless_wait_ms"] == 0.0 and m["clean"] for m in full)
    assert any(m["needless_wait_ms"] > 0 for m in glob)
    assert _trial("tx-full", 0)["metrics"]["needless_wait_ms"] is None  # not the control


def test_the_config_loads_and_a_small_run_completes(tmp_path: Path) -> None:
    assert "epoch_order" in WORKLOADS
    config = load_config(CONFIG)
    assert {"tx-full", "no-frontier", "tx-global-frontier"} <= set(config.modes)
    small = config.model_copy(update={"trials": 2, "modes": ["tx-full", "no-frontier"]})
    result = run(small, out=tmp_path)
    records = [json.loads(line) for line in result.records_path.read_text().splitlines()]
    assert result.total == result.ran == len(records) == 2 * 2 * 3  # trials x modes x cells
    assert all("order_violations" in r["metrics"] for r in records)

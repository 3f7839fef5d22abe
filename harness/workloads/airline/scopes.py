"""What each airline tool reads and writes, as scopes named from its arguments and the DB.

A scope function never mutates and never raises on a bad id or malformed arguments: it names
whatever the arguments name and lets the tool itself fail later. Scopes: one per user, per
reservation, per flight and date (its seat inventory) and per payment method, so that two
agents booking the same flight contend on its seats and two changing one reservation contend
on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.workloads.airline.tools import NEW_RESERVATION_IDS, _next_day, _peek

Scopes = tuple[list[str], list[str]]
USER, RESERVATION, FLIGHT, PAYMENT = "airline:user", "airline:reservation", "airline:flight", "airline:payment"


def flight_scope(flight_number: Any, date: Any) -> str:
    """The seat inventory of one flight on one date (under the flight's own scope)."""
    return f"{FLIGHT}:{flight_number}:{date}"


def _get(mapping: Any, key: Any) -> Any:
    if not isinstance(mapping, Mapping) or not isinstance(key, str):
        return None
    try:
        return _peek(mapping, key) if key in mapping else None
    except (TypeError, KeyError):
        return None


def _uniq(scopes: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(scopes))


def _flight_infos(value: Any) -> list[tuple[Any, Any]]:
    if not isinstance(value, list):
        return []
    return [(f.get("flight_number"), f.get("date")) for f in value if isinstance(f, Mapping)]


def _payment_ids(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [str(p.get("payment_id")) for p in value if isinstance(p, Mapping)]


def _method(db: Any, user_id: Any, payment_id: Any) -> dict | None:
    user = _get(db.get("users") if isinstance(db, Mapping) else None, user_id)
    methods = user.get("payment_methods") if isinstance(user, Mapping) else None
    found = _get(methods, payment_id)
    return found if isinstance(found, Mapping) else None  # type: ignore[return-value]


def _sc_none(db: Any, args: Mapping[str, Any]) -> Scopes:
    return [], []


def _sc_user_read(db: Any, args: Mapping[str, Any]) -> Scopes:
    return [f"{USER}:{args.get('user_id')}"], []


def _sc_reservation_read(db: Any, args: Mapping[str, Any]) -> Scopes:
    return [f"{RESERVATION}:{args.get('reservation_id')}"], []


def _sc_flight_status(db: Any, args: Mapping[str, Any]) -> Scopes:
    return [flight_scope(args.get("flight_number"), args.get("date"))], []


def _candidates(db: Any, date: Any, origin: Any = None, destination: Any = None) -> list[tuple[str, dict]]:
    flights = db.get("flights") if isinstance(db, Mapping) else None
    if not isinstance(flights, Mapping):
        return []
    out = []
    for number, flight in flights.items():
        if ((origin is None or flight.get("origin") == origin)
                and (destination is None or flight.get("destination") == destination)
                and isinstance(date, str) and date in (flight.get("dates") or {})):
            out.append((number, flight))
    return out


def _sc_search_direct(db: Any, args: Mapping[str, Any]) -> Scopes:
    # The seat inventories it reports on: every flight of the route flying that date.
    date = args.get("date")
    found = _candidates(db, date, args.get("origin"), args.get("destination"))
    return [flight_scope(n, date) for n, _ in found], []


def _sc_search_onestop(db: Any, args: Mapping[str, Any]) -> Scopes:
    date = args.get("date")
    reads = []
    for number, flight in _candidates(db, date, args.get("origin")):
        reads.append(flight_scope(number, date))
        arrival = str(flight.get("scheduled_arrival_time_est", ""))
        try:
            date2 = _next_day(date) if "+1" in arrival else date
        except (TypeError, ValueError):
            continue
        reads += [flight_scope(n, date2)
                  for n, _ in _candidates(db, date2, flight.get("destination"), args.get("destination"))]
    return _uniq(reads), []


def _sc_book(db: Any, args: Mapping[str, Any]) -> Scopes:
    user_id = args.get("user_id")
    user = f"{USER}:{user_id}"
    reservations = db.get("reservations") if isinstance(db, Mapping) else None
    # The id it takes is the first of upstream's three that is free: it reads those before.
    probed, new_id = [], None
    for rid in NEW_RESERVATION_IDS:
        probed.append(f"{RESERVATION}:{rid}")
        if not isinstance(reservations, Mapping) or rid not in reservations:
            new_id = rid
            break
    seats = [flight_scope(n, d) for n, d in _flight_infos(args.get("flights"))]
    payments = [f"{PAYMENT}:{p}" for p in _payment_ids(args.get("payment_methods"))]
    writes = [user, *seats, *payments, *([f"{RESERVATION}:{new_id}"] if new_id else [])]
    return [user, *probed, *seats, *payments], writes


def _reservation_user(db: Any, rid: Any) -> Any:
    record = _get(db.get("reservations") if isinstance(db, Mapping) else None, rid)
    return record.get("user_id") if isinstance(record, Mapping) else None


def _sc_cancel(db: Any, args: Mapping[str, Any]) -> Scopes:
    rid = args.get("reservation_id")
    record = _get(db.get("reservations") if isinstance(db, Mapping) else None, rid)
    history = record.get("payment_history") if isinstance(record, Mapping) else None
    refunds = [f"{PAYMENT}:{p}" for p in _payment_ids(history)]
    scope = f"{RESERVATION}:{rid}"
    return [scope], [scope, *refunds]


def _sc_update_paid(extra_reads: Callable[[Any, Mapping[str, Any]], list[str]]) -> Callable[[Any, Mapping[str, Any]], Scopes]:
    """A reservation change that may charge (or refund) `payment_id`: it reads the reservation,
    its user and the payment method, writes the reservation and the payment method, and the
    user too when the method is a gift card (its balance lives in the user's record)."""

    def scopes(db: Any, args: Mapping[str, Any]) -> Scopes:
        rid = args.get("reservation_id")
        user_id = _reservation_user(db, rid)
        scope, payment = f"{RESERVATION}:{rid}", f"{PAYMENT}:{args.get('payment_id')}"
        user = [f"{USER}:{user_id}"] if user_id is not None else []
        method = _method(db, user_id, args.get("payment_id"))
        gift = method is not None and method.get("source") == "gift_card"
        return ([scope, *user, payment, *extra_reads(db, args)],
                [scope, payment, *(user if gift else [])])

    return scopes


def _new_flight_seats(db: Any, args: Mapping[str, Any]) -> list[str]:
    return [flight_scope(n, d) for n, d in _flight_infos(args.get("flights"))]


def _sc_passengers(db: Any, args: Mapping[str, Any]) -> Scopes:
    scope = f"{RESERVATION}:{args.get('reservation_id')}"
    return [scope], [scope]


def _sc_certificate(db: Any, args: Mapping[str, Any]) -> Scopes:
    scope = f"{USER}:{args.get('user_id')}"
    return [scope], [scope]

"""The airline tool table: each upstream tool with whether it writes and what it touches, and
`call_tool`, which refuses a call as upstream's would (same messages) before running it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.workloads.airline.scopes import (
    Scopes,
    _new_flight_seats,
    _sc_book,
    _sc_cancel,
    _sc_certificate,
    _sc_flight_status,
    _sc_none,
    _sc_passengers,
    _sc_reservation_read,
    _sc_search_direct,
    _sc_search_onestop,
    _sc_update_paid,
    _sc_user_read,
    _uniq,
)
from harness.workloads.airline.tools import (
    DB,
    AirlineToolError,
    book_reservation,
    calculate,
    cancel_reservation,
    get_flight_status,
    get_reservation_details,
    get_user_details,
    list_all_airports,
    search_direct_flight,
    search_onestop_flight,
    send_certificate,
    transfer_to_human_agents,
    update_reservation_baggages,
    update_reservation_flights,
    update_reservation_passengers,
)


@dataclass(frozen=True)
class AirlineTool:
    """One airline tool and its Atomix metadata.

    `fn(db, **args)` changes `db` in place as upstream does and returns a copy of what
    upstream returns, or raises AirlineToolError. `scopes(db, args)` returns (read scopes,
    write scopes) from the current DB, without changing it and without raising.
    """

    name: str
    fn: Callable[..., Any]
    writes: bool
    scope_fn: Callable[[Any, Mapping[str, Any]], Scopes] = _sc_none

    def scopes(self, db: Any, args: Any) -> tuple[list[str], list[str]]:
        reads, writes = self.scope_fn(db, args if isinstance(args, Mapping) else {})
        return _uniq(reads), _uniq(writes)


def _t(fn: Callable[..., Any], writes: bool, scope_fn: Callable[..., Scopes]) -> AirlineTool:
    return AirlineTool(fn.__name__, fn, writes, scope_fn)


# In upstream's order of definition.
TOOLS: dict[str, AirlineTool] = {t.name: t for t in (
    _t(book_reservation, True, _sc_book),
    _t(calculate, False, _sc_none),
    _t(cancel_reservation, True, _sc_cancel),
    _t(get_reservation_details, False, _sc_reservation_read),
    _t(get_user_details, False, _sc_user_read),
    _t(list_all_airports, False, _sc_none),
    _t(search_direct_flight, False, _sc_search_direct),
    _t(search_onestop_flight, False, _sc_search_onestop),
    _t(send_certificate, True, _sc_certificate),
    _t(transfer_to_human_agents, False, _sc_none),
    _t(update_reservation_baggages, True, _sc_update_paid(lambda db, a: [])),
    _t(update_reservation_flights, True, _sc_update_paid(_new_flight_seats)),
    _t(update_reservation_passengers, True, _sc_passengers),
    _t(get_flight_status, False, _sc_flight_status),
)}


def _check_args(tool: AirlineTool, args: Mapping[str, Any]) -> None:
    """Missing or unknown arguments, refused as Python refuses upstream's call (TypeError);
    upstream checks no argument's type beyond what its models validate."""
    params = list(inspect.signature(tool.fn).parameters.values())[1:]  # skip db
    names = [p.name for p in params]
    unknown = [a for a in args if a not in names]
    if unknown:
        raise AirlineToolError(f"{tool.name}() got an unexpected keyword argument '{unknown[0]}'")
    missing = [n for n in names if n not in args]
    if missing:
        quoted = " and ".join(", ".join(f"'{m}'" for m in missing).rsplit(", ", 1))
        plural = "s" if len(missing) > 1 else ""
        raise AirlineToolError(
            f"{tool.name}() missing {len(missing)} required positional argument{plural}: {quoted}")


def call_tool(db: DB, name: str, args: Mapping[str, Any]) -> Any:
    """Call tool `name` on `db` with `args`; every refusal is an AirlineToolError carrying
    the message upstream's call raised (its own ValueError, pydantic's validation error, or
    Python's TypeError/KeyError/AttributeError from an argument of the wrong shape)."""
    if name not in TOOLS:
        raise AirlineToolError(f"Tool '{name}' not found.")
    tool = TOOLS[name]
    if not isinstance(args, Mapping):
        raise AirlineToolError(f"{name}: arguments must be an object, got {type(args).__name__}")
    _check_args(tool, args)
    try:
        return tool.fn(db, **args)
    except AirlineToolError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise AirlineToolError(str(exc)) from exc

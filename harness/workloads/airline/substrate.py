"""The tau2 airline DB as a trial substrate, and its tools as harness tools with effect classes.

Every airline call of every mode goes through `AirlineStore.call`: it runs the tool with
upstream's semantics on the trial's own DB, deduplicates by idempotency key, writes the op
log below all mechanisms, and keeps a ledger of what each application did (the reservation
it created, what it charged, the fields it replaced, the certificate it issued), so that a
compensation can undo exactly that application and the oracle can read charges, refunds
and certificates from the substrate itself.

Effect classes, chosen as an airline and a card processor behave (not as the harness would
find convenient):

- `book_reservation` is reversible, and its compensation is a cancellation: the reservation
  stays in the DB with status `cancelled`, a refund (a negated payment) per charge, its seats
  released and gift-card balances and used certificates given back. A charge to a card can be
  refunded but not unmade: the charge and its refund both stay on the record, as on a card
  statement. So a compensated booking leaves a trace in the final DB (and its id is used up:
  a retried booking gets the next of upstream's ids), which the goal comparison sees.
- `update_reservation_flights` and `update_reservation_baggages` are reversible: their
  compensation puts the reservation's previous flights and cabin (or bag counts) back and
  refunds what the change charged (a negated payment; a gift card gets its balance back).
  The fields go back as they were before this application, as an airline's "modify" API
  would set them: a compensation that runs after another agent changed the same fields
  overwrites that change (a lost update, which isolation must prevent).
- `update_reservation_passengers` is reversible with no money involved: its compensation
  puts the previous passenger list back and leaves no trace.
- `cancel_reservation` and `send_certificate` are irreversible: a cancellation sends
  refunds to the customer's payment methods and a certificate is money in the customer's
  hands; neither can be taken back, so a mechanism with a gate holds them until commit,
  and one without a gate leaks them when the attempt does not commit.
- Everything else only reads (or, for `calculate` and `transfer_to_human_agents`, touches
  nothing).

A compensation undoes the applications of the same logical call (agent, attempt, op id) not
yet compensated, newest first, and does nothing when there is none (a call that failed
before its effect): it never restores a before-image it did not itself capture.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atomix.adapters import OpLog
from atomix.effects import EffectClass
from harness.workloads.airline.calls import TOOLS, AirlineTool, call_tool
from harness.workloads.airline.tools import AirlineToolError
from harness.workloads.retail.cow import RecordTable, db_sha256
from harness.workloads.retail.data import canonical
from harness.workloads.tau2_store import Tau2Store, store_tool_parts
from harness.world.substrates import TrialEnv
from harness.world.tooling import Reread, ToolDef, ToolError

SUBSTRATE = "airline"

#: Tools whose second application with the same arguments changes nothing (upstream charges
#: the difference from the current state, which is then zero).
IDEMPOTENT = frozenset({"update_reservation_baggages", "update_reservation_flights",
                        "update_reservation_passengers"})
IRREVERSIBLE = frozenset({"cancel_reservation", "send_certificate"})
#: The reservation fields each reversible change replaces (and its compensation puts back).
_FIELDS = {
    "update_reservation_flights": ("flights", "cabin"),
    "update_reservation_baggages": ("total_baggages", "nonfree_baggages"),
    "update_reservation_passengers": ("passengers",),
}


@dataclass
class Application:
    """What one landed application of a write did, read from the DB around it."""

    tool: str
    who: tuple[str, int, str]  # (agent, attempt, op id)
    scopes: list[str]
    reservation_id: str | None = None
    charges: list[dict[str, Any]] = field(default_factory=list)  # payments appended
    gift: dict[str, float] = field(default_factory=dict)  # gift-card balance taken, per card
    certificates: dict[str, Any] = field(default_factory=dict)  # certificates used up
    fields: dict[str, Any] = field(default_factory=dict)  # the reservation's fields before
    certificate_id: str | None = None  # a certificate issued
    compensated: bool = False
    noop: bool = False  # it changed nothing (same values, nothing charged)


def _who(meta: Mapping[str, Any]) -> tuple[str, int, str]:
    return str(meta.get("agent")), int(meta.get("attempt", -1)), str(meta.get("op"))


def _gift_balances(user: Mapping[str, Any] | None) -> dict[str, float]:
    methods = (user or {}).get("payment_methods") or {}
    return {pid: m["amount"] for pid, m in methods.items() if m.get("source") == "gift_card"}


class AirlineStore(Tau2Store):
    """One trial's airline DB (a `Tau2Store`): every landed write is in `ledger`, in order,
    with what it did."""

    substrate = SUBSTRATE
    tools = TOOLS
    tool_error = AirlineToolError
    run_tool = staticmethod(call_tool)

    def __init__(self, db: dict[str, Any], oplog: OpLog | None = None) -> None:
        super().__init__(db, oplog)
        self.ledger: list[Application] = []

    def _peek_reservation(self, rid: Any) -> dict[str, Any] | None:
        table = self.db["reservations"]
        if not isinstance(rid, str) or rid not in table:
            return None
        return table.peek(rid) if hasattr(table, "peek") else table[rid]

    def _peek_user(self, user_id: Any) -> dict[str, Any] | None:
        table = self.db["users"]
        if not isinstance(user_id, str) or user_id not in table:
            return None
        return table.peek(user_id) if hasattr(table, "peek") else table[user_id]

    def _apply(self, name: str, args: dict[str, Any], writes: list[str], meta: Mapping[str, Any]) -> Any:
        app = self._before(name, args, meta, writes) if TOOLS[name].writes else None
        try:
            result = self._run(self.db, name, args)
        except ToolError:
            self._sha = None  # upstream may have changed something before it failed
            raise
        if app is not None:
            # A no-op application (a change to what was already there) is recorded too, so
            # its compensation is logged; it undoes nothing in the DB.
            app.noop = not self._after(app, args, result)
            self.ledger.append(app)
        return result

    def _before(self, name: str, args: Mapping[str, Any], meta: Mapping[str, Any], writes: list[str]) -> Application:
        app = Application(name, _who(meta), list(writes))
        reservation = self._peek_reservation(args.get("reservation_id"))
        if reservation is not None:
            app.reservation_id = reservation["reservation_id"]
            app.fields = {f: copy.deepcopy(reservation.get(f)) for f in _FIELDS.get(name, ())}
            app.fields["_payments"] = len(reservation["payment_history"])
            app.gift = _gift_balances(self._peek_user(reservation["user_id"]))
        if name == "book_reservation":
            user = self._peek_user(args.get("user_id"))
            app.gift = _gift_balances(user)
            app.certificates = {pid: copy.deepcopy(m) for pid, m in ((user or {}).get("payment_methods") or {}).items()
                                if m.get("source") == "certificate"}
        if name == "send_certificate":
            user = self._peek_user(args.get("user_id"))
            app.certificates = dict.fromkeys((user or {}).get("payment_methods") or {})
        return app

    def _after(self, app: Application, args: Mapping[str, Any], result: Any) -> bool:
        """Fill in what the application did; False when it changed nothing at all."""
        if app.tool == "book_reservation":
            app.reservation_id = result["reservation_id"]
            scope = f"airline:reservation:{app.reservation_id}"
            if scope not in app.scopes:
                app.scopes.append(scope)
            app.charges = copy.deepcopy(result["payment_history"])
            user = self._peek_user(args.get("user_id"))
            after = _gift_balances(user)
            app.gift = {pid: app.gift[pid] - after.get(pid, app.gift[pid]) for pid in app.gift}
            kept = set((user or {}).get("payment_methods") or {})
            app.certificates = {pid: c for pid, c in app.certificates.items() if pid not in kept}
            return True
        if app.tool == "send_certificate":
            user = self._peek_user(args.get("user_id"))
            new = [pid for pid in (user or {}).get("payment_methods") or {} if pid not in app.certificates]
            app.certificate_id = new[0] if new else None
            app.certificates = {}
            return True
        reservation = self._peek_reservation(app.reservation_id)
        if reservation is None:
            return False
        app.charges = copy.deepcopy(reservation["payment_history"][app.fields.pop("_payments"):])
        after = _gift_balances(self._peek_user(reservation["user_id"]))
        app.gift = {pid: app.gift[pid] - after.get(pid, app.gift[pid]) for pid in app.gift}
        app.gift = {pid: v for pid, v in app.gift.items() if v}
        changed = any(reservation.get(f) != v for f, v in app.fields.items())
        return app.tool in IRREVERSIBLE or changed or bool(app.charges)

    def compensate(self, name: str, meta: Mapping[str, Any]) -> None:
        """Undo every not yet compensated application of this logical call, newest first (a
        call delivered twice is undone as one call, as a before-image restore would); nothing
        when it never landed. See the module docstring for what each undo does."""
        who = _who(meta)
        for app in reversed(self.ledger):
            if app.tool == name and app.who == who and not app.compensated:
                if not app.noop:
                    self._undo(app)
                app.compensated = True
                self._sha = None
                for scope in app.scopes:
                    self._log(scope, "write", None, meta)

    def _undo(self, app: Application) -> None:
        db = self.db
        reservation = db["reservations"][app.reservation_id]
        user = db["users"][reservation["user_id"]]
        if app.tool == "book_reservation":
            reservation["status"] = "cancelled"
            for flight in reservation["flights"]:
                seats = db["flights"][flight["flight_number"]]["dates"][flight["date"]]["available_seats"]
                seats[reservation["cabin"]] += len(reservation["passengers"])
            for pid, certificate in app.certificates.items():
                user["payment_methods"][pid] = copy.deepcopy(certificate)
        else:
            for field_name, value in app.fields.items():
                reservation[field_name] = copy.deepcopy(value)
        reservation["payment_history"].extend(
            {"payment_id": c["payment_id"], "amount": -c["amount"]} for c in app.charges)
        for pid, taken in app.gift.items():
            if pid in user["payment_methods"]:
                user["payment_methods"][pid]["amount"] += taken

    def _hash(self) -> str:
        return airline_sha256(self.db)


def airline_sha256(db: Mapping[str, Any]) -> str:
    """`db_sha256(db)`, also fast when a trial added records (a booking adds a reservation):
    the copy-on-write hash covers only changed records, so with added ones the canonical
    text is rebuilt from the pristine text of every untouched record and the canonical JSON
    of the trial's own (one sha256 pass over the text, no re-encoding of the whole DB)."""
    tables = [t for t in db.values() if isinstance(t, RecordTable)]
    if len(tables) != len(db) or not any(t.reshaped for t in tables):
        return db_sha256(db)
    base = tables[0].pristine
    if tuple(db) != base.keys or any(t.pristine is not base for t in tables):
        return db_sha256(db)
    text = memoryview(base._text)
    digest = hashlib.sha256(b"{")
    for t_index, name in enumerate(sorted(db)):
        table: RecordTable = db[name]
        digest.update((("," if t_index else "") + canonical(name) + ":{").encode("utf-8"))
        own = dict(table.local_items())
        spans = base._spans[name]
        for r_index, rid in enumerate(sorted(table)):
            digest.update((("," if r_index else "") + canonical(rid) + ":").encode("utf-8"))
            if rid in own:
                digest.update(canonical(own[rid]).encode("utf-8"))
            else:
                span = spans[rid]
                digest.update(text[span.start:span.end])
        digest.update(b"}")
    digest.update(b"}")
    return digest.hexdigest()


def store(env: TrialEnv) -> AirlineStore:
    return env.extra["airline"]


_CABINS = ("business", "economy", "basic_economy")


def plausible_alternative(db: dict[str, Any], name: str, args: Mapping[str, Any], rng: Any) -> dict[str, Any] | None:
    """Arguments an agent might try instead after a failed call: another of the user's
    payment methods, another cabin, or another of the user's reservations (a plausible wrong
    action, which the tool may refuse or carry out). None when there is none."""
    reservations = db["reservations"]
    rid = args.get("reservation_id")
    record = reservations.peek(rid) if isinstance(rid, str) and rid in reservations else None
    user_id = record["user_id"] if record else args.get("user_id")
    users = db["users"]
    user = users.peek(user_id) if isinstance(user_id, str) and user_id in users else None
    options: list[tuple[str, Any]] = []
    if user is not None and isinstance(args.get("payment_id"), str):
        options += [("payment_id", m) for m in sorted(user["payment_methods"]) if m != args["payment_id"]]
    methods = args.get("payment_methods")
    if user is not None and isinstance(methods, list) and len(methods) == 1 and isinstance(methods[0], dict):
        options += [("payment_methods", [{**methods[0], "payment_id": m}])
                    for m in sorted(user["payment_methods"]) if m != methods[0].get("payment_id")]
    if args.get("cabin") in _CABINS:
        options += [("cabin", c) for c in _CABINS if c != args["cabin"]]
    if user is not None and record is not None:
        options += [("reservation_id", r) for r in user.get("reservations", []) if r != rid][:3]
    if not options:
        return None
    key, value = options[rng.randrange(len(options))]
    return {**args, key: copy.deepcopy(value)}


def _landed_test(name: str, args: Mapping[str, Any]) -> Any:
    if name == "cancel_reservation":
        return lambda r: r.get("status") == "cancelled"
    if name == "update_reservation_baggages":
        return lambda r: (r.get("total_baggages") == args.get("total_baggages")
                          and r.get("nonfree_baggages") == args.get("nonfree_baggages"))
    if name == "update_reservation_flights":
        wanted = [(f.get("flight_number"), f.get("date")) for f in args.get("flights") or [] if isinstance(f, dict)]
        return lambda r: r.get("cabin") == args.get("cabin") and [
            (f.get("flight_number"), f.get("date")) for f in r.get("flights") or []] == wanted
    if name == "update_reservation_passengers":
        return lambda r: r.get("passengers") == args.get("passengers")
    return None


def reread(name: str, args: Mapping[str, Any]) -> Reread | None:
    """The read-back of a reservation change: get_reservation_details and the change it asked
    for. None for a booking or a certificate (nothing tells the agent which record is its own)."""
    test = _landed_test(name, args)
    if test is None or not isinstance(args.get("reservation_id"), str):
        return None
    return Reread("get_reservation_details", {"reservation_id": args["reservation_id"]},
                  lambda record: isinstance(record, dict) and bool(test(record)))


def _tool_key(name: str, args: Mapping[str, Any]) -> str:
    """The tool's part of an idempotency key: tool, the record it targets, an args hash."""
    subject = args.get("reservation_id") or args.get("user_id") or "-"
    canon = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return f"{name}:{subject}:{hashlib.sha256(canon.encode('utf-8')).hexdigest()[:12]}"


def _tooldef(at: AirlineTool) -> ToolDef:
    name = at.name
    reads, writes, run = store_tool_parts(at, store)
    if not at.writes:
        return ToolDef(name, None, reads, lambda env, a: [], run)
    common: dict[str, Any] = {
        "check": lambda env, a: store(env).check(name, a),
        "key": lambda a: _tool_key(name, a),
        "alternatives": lambda env, a, rng: plausible_alternative(store(env).db, name, a, rng),
        "reread": lambda a: reread(name, a),
    }
    if name in IRREVERSIBLE:
        return ToolDef(name, EffectClass.IRREVERSIBLE, reads, writes, run, **common)
    return ToolDef(
        name, EffectClass.REVERSIBLE, reads, writes, run,
        # The compensation finds what to undo in the store's ledger (by the delivery's
        # logical call), so the before-image a mechanism keeps is only the call's name.
        before=lambda env, a: {"tool": name},
        undo=lambda env, a, before, d: store(env).compensate(name, d.meta),
        idempotent=name in IDEMPOTENT,
        **common,
    )


AIRLINE_TOOLS: dict[str, ToolDef] = {name: _tooldef(at) for name, at in TOOLS.items()}

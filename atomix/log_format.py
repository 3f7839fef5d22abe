"""The durable log's record format: what a row says, and how an effect is described.

Statuses and transaction states are the values of the log's `status` and `state` columns
(see `atomix.log` for when each is written). A redo record is a JSON description of one
effect that a new process can act on (`describe_effect`): an adapter's write names its
store and arguments, a user tool's call its name and JSON arguments; anything else is
opaque, and recovery reports it as needing a human.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from atomix.effects import Effect, EffectClass
from atomix.tools import Call

if TYPE_CHECKING:
    from atomix.tools import ToolSpec

FORMAT = "atomix-txlog"
VERSION = 1

#: The attribute by which an adapter's tool function says which store it writes: a pair
#: ``(redo kind, store object)``; the log describes the effect from the store's own paths.
REDO_ATTR = "atomix_redo"

# Effect statuses in the log.
CALLING = "calling"  # reversible: started, may or may not have acted
CALLED = "called"  # reversible: returned, result recorded
STAGED = "staged"  # bufferable / irreversible: in the intent, not yet settled
APPLIED = "applied"
RELEASED = "released"
FAILED = "failed"
COMPENSATED = "compensated"
RESIDUE = "residue"
SETTLED = frozenset({APPLIED, RELEASED, COMPENSATED})
STATUSES = frozenset({CALLING, CALLED, STAGED, APPLIED, RELEASED, FAILED, COMPENSATED, RESIDUE})

# Transaction states in the log (a finished transaction has no rows at all).
TX_OPEN = "open"  # only reversible calls so far
TX_INTENT = "intent"
TX_COMMITTED = "committed"
TX_STATES = frozenset({TX_OPEN, TX_INTENT, TX_COMMITTED})


@dataclass(frozen=True, slots=True)
class LoggedEffect:
    """One effect as the log holds it: its key, class, status and redo record."""

    key: str
    seq: int
    tool: str
    effect_class: EffectClass
    status: str
    redo: dict[str, Any]
    problem: str | None  # why a new process cannot redo it exactly (None: it can)


@dataclass(frozen=True, slots=True)
class LoggedTx:
    """One unfinished transaction as the log holds it."""

    run_id: str
    txid: int
    epoch: int
    trace: str
    state: str
    commit_seq: int | None
    effects: list[LoggedEffect] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.state == TX_COMMITTED

    @property
    def name(self) -> str:
        return f"{self.run_id}/tx{self.txid}"



@dataclass(frozen=True, slots=True)
class Quarantined:
    """A log record that could not be decoded, moved aside: what it was (a "tx" or an
    "effect"), whose it was, why, and the record itself (JSON text of its raw fields)."""

    what: str
    ident: str
    reason: str
    record: str

    def __str__(self) -> str:
        return f"{self.what} {self.ident}: {self.reason}"


class LogSite(Protocol):
    """What the log reads of the coordinator a transaction runs under."""

    @property
    def run_id(self) -> str: ...


class LoggedSession(Protocol):
    """What the log reads of a live transaction to make its records (a `TxSession` is one)."""

    @property
    def co(self) -> LogSite: ...

    @property
    def txid(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def trace(self) -> str: ...

    @property
    def staged(self) -> Mapping[str, Effect]: ...


# --------------------------------------------------------------------------- redo records


def _json(value: Any) -> tuple[Any, bool]:
    """`value` as JSON data, and whether it round-trips exactly (else a repr stands in)."""
    try:
        text = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError):
        try:
            return json.loads(json.dumps(value, default=repr, sort_keys=True)), False
        except (TypeError, ValueError, RecursionError):  # e.g. circular, or non-str dict keys
            return repr(value), False
    back = json.loads(text)
    return back, back == value and _same_shape(back, value)


def _same_shape(a: Any, b: Any) -> bool:
    # json turns tuples into lists, and == between list and tuple is False anyway; a dict's
    # non-str keys become str, which == catches. Only int vs float 1 == 1.0 slips through.
    if isinstance(b, bool) or isinstance(a, bool):
        return type(a) is type(b)
    if isinstance(b, (int, float)):
        return type(a) is type(b)
    if isinstance(b, dict):
        return all(_same_shape(a[k], v) for k, v in b.items())
    if isinstance(b, list):
        return all(_same_shape(x, y) for x, y in zip(a, b, strict=True))
    return True


def tool_redo(
    tool: str, args: Mapping[str, Any], *, before: Any = None, result: Any = None
) -> tuple[str, str | None]:
    """A user tool's redo record: its name and arguments (+ before-image and result, which
    its compensation reads); a problem text if any of them is not exactly JSON."""
    parts = {"args": dict(args), "before": before, "result": result}
    record: dict[str, Any] = {"kind": "tool", "tool": tool}
    inexact = []
    for name, value in parts.items():
        record[name], exact = _json(value)
        if not exact:
            inexact.append(name)
    problem = f"{', '.join(inexact)} not exactly JSON (stored as repr)" if inexact else None
    return json.dumps(record, sort_keys=True), problem


def describe_effect(effect: Effect, tools: Mapping[str, ToolSpec | None]) -> tuple[str, str | None]:
    """An effect's redo record (JSON text) and, if a new process cannot redo it exactly, why.

    Adapter effects are self-contained (store kind, path, arguments; the key is logged beside
    it), so `atomix recover` finishes them without the user's program. A user tool's effect is
    its name and JSON arguments, redone by `Runtime.recover` once the program has defined it.
    Anything else (an Effect built by hand with a closure) is logged as opaque: recovery
    reports it as needing a human instead of guessing.
    """
    payload = effect.payload
    if payload.__class__ is Call:  # a reversible call through the shim
        return tool_redo(payload.tool, payload.args, before=payload.before, result=payload.result)
    fn = getattr(effect.apply, "func", None)  # the shim stages partial(spec.fn, **kwargs)
    target = getattr(fn, REDO_ATTR, None) if fn is not None else None
    if target is not None and isinstance(payload, dict):
        kind, store = target
        if kind == "fs.write":
            record = {"kind": kind, "root": str(store.root), "casefold": store.casefold,
                      "path": str(payload["path"])}
            text = payload["text"]
            if isinstance(text, str):
                record["text"] = text
            else:
                record["data_b64"] = base64.b64encode(bytes(text)).decode()
            return json.dumps(record), None
        if kind == "mail.send":
            record = {"kind": kind, "outbox": os.path.abspath(store.path), "to": payload["to"],
                      "subject": payload["subject"], "body": payload["body"]}
            return json.dumps(record), None
    batch = effect.batch
    if batch is not None and batch.__class__.__name__ == "SQLiteStore":
        # Lazily: the adapters are built on the runtime, which does not load them itself.
        from atomix.adapters.sqlite import RowWrite, SQLiteStore

        if isinstance(payload, RowWrite) and isinstance(batch, SQLiteStore):
            value, exact = _json(payload.value)
            record = {"kind": "sqlite.row", "db": os.path.abspath(batch.path), "table": payload.table,
                      "k": payload.k, "value": value}
            return json.dumps(record), None if exact else "row value not exactly JSON"
    spec = tools.get(effect.tool)
    if spec is not None and fn is spec.fn and isinstance(payload, dict):
        return tool_redo(effect.tool, payload)
    why = (
        f"two tools are named {effect.tool!r}" if effect.tool in tools and spec is None
        else "an effect built by hand (its apply is a closure a new process cannot rebuild)"
    )
    return json.dumps({"kind": "opaque", "tool": effect.tool}), why


#: The store a redo record's kind delivers to, by the record's key naming its path.
_STORE_PATHS = {"fs.write": "root", "sqlite.row": "db", "mail.send": "outbox"}


def store_of(redo: str) -> tuple[str, str] | None:
    """(kind, path) of the adapter store a redo record (JSON text) delivers to, else None."""
    try:
        record = json.loads(redo)
        field_name = _STORE_PATHS.get(record.get("kind"))
        return None if field_name is None else (record["kind"], str(record[field_name]))
    except (ValueError, TypeError, AttributeError, KeyError):
        return None


def error_text(exc: BaseException | None) -> str:
    if exc is None:
        return "the delivery failed (no error was reported)"
    return f"{type(exc).__name__}: {exc}"[:2000]


def record_text(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, default=repr)


def bad_tx(run_id: Any, txid: Any, epoch: Any, trace: Any, state: Any, commit_seq: Any) -> str | None:
    """Why a transaction record cannot be recovered, or None if it can."""
    if not isinstance(run_id, str) or not isinstance(txid, int) or not isinstance(epoch, int):
        return "run, transaction number or epoch is not of its type"
    if not isinstance(trace, str):
        return "trace is not text"
    if state not in TX_STATES:
        return f"unknown transaction state {state!r}"
    if state == TX_COMMITTED and not isinstance(commit_seq, int):
        return "a committed transaction without its commit number"
    return None


def bad_effect(key: Any, seq: Any, tool: Any, cls: Any, status: Any, redo: Any) -> str | None:
    """Why an effect record cannot be recovered, or None if it can."""
    if not isinstance(key, str) or not isinstance(seq, int) or not isinstance(tool, str):
        return "key, sequence number or tool is not of its type"
    try:
        EffectClass(cls)
    except ValueError:
        return f"unknown effect class {cls!r}"
    if status not in STATUSES:
        return f"unknown status {status!r}"
    try:
        record = json.loads(redo)
    except (TypeError, ValueError) as exc:
        return f"its redo record is not JSON: {exc}"
    if not isinstance(record, dict):
        return f"its redo record is not a JSON object (a {type(record).__name__})"
    return None

"""The coordinator's events: one per call of the core that changes its state.

An event names the core method and its arguments in JSON; replaying it on a replica calls
the same method with the same arguments, so every replica makes the same decision (the core
is deterministic and reads no clock). The appender records the kind of decision it got
(`d`); a replica that gets another kind has diverged, and says so loudly.

Effects travel as stubs (tool, class, scopes, key): a replica needs them for ordering and
staleness, never to run them. Only the process that staged an effect holds its functions.
"""

from __future__ import annotations

from typing import Any

from atomix.decisions import Resolution
from atomix.effects import REVERSIBLE, AbortSource, Effect, EffectClass
from atomix.manager import TransactionManager
from atomix.scopes import Scope

# Event kinds (the `k` of a body).
BEGIN = "begin"
READ = "read"
EXTERNALIZE = "ext"
STAGE = "stage"
SEAL = "seal"
COMMIT = "commit"
ABORT = "abort"
FINISH = "finish"
ROLLBACK = "rollback"
RESOLVE = "resolve"
ABORT_GROUP = "abort_group"
SAVEPOINT = "savepoint"
RELEASE = "release"
REVOKE = "revoke"
RESERVE = "reserve"


def scope_out(scope: Scope) -> list[Any]:
    return [scope.kind, list(scope.parts)]


def scope_in(data: list[Any]) -> Scope:
    return Scope(data[0], tuple(data[1]))


def effect_out(effect: Effect, scope: Any) -> list[Any]:
    """An effect's stub; `scope` canonicalises a scope the effect holds as text."""
    return [
        effect.tool,
        effect.effect_class.value,
        [scope_out(s if s.__class__ is Scope else scope(s)) for s in effect.scopes],
        effect.key,
    ]


def _no_compensation() -> None:  # a stub's: replicas never compensate
    return None


def effect_in(data: list[Any]) -> Effect:
    cls = EffectClass(data[1])
    return Effect(
        data[0],
        cls,
        tuple(scope_in(s) for s in data[2]),
        data[3],
        compensate=_no_compensation if cls is REVERSIBLE else None,
    )


def decision_kind(result: Any) -> str:
    """What the appender records of its decision, for the replicas to compare."""
    if isinstance(result, tuple):  # finish: (settlement, ready)
        return str(result[0].outcome)
    if isinstance(result, int):  # a savepoint's number
        return f"int:{result}"
    if isinstance(result, Resolution):
        decision = result.decision
        return "none" if decision is None else type(decision).__name__
    return type(result).__name__


def apply(core: TransactionManager, body: dict[str, Any]) -> Any:
    """Replay one event on a replica's core; returns what the core returned."""
    kind = body["k"]
    if kind == BEGIN:
        return core.begin(group=body.get("g"), trace=body.get("tr"), branch=body.get("b", 0))
    txid = int(body.get("t", 0))
    if kind == READ:
        return core.read(txid, [scope_in(s) for s in body["s"]])
    if kind == EXTERNALIZE:
        return core.externalize(
            txid, tuple(scope_in(s) for s in body["s"]), tuple(scope_in(s) for s in body["r"])
        )
    if kind == RESERVE:
        return core.reserve(txid, [scope_in(s) for s in body["s"]])
    if kind == STAGE:
        return core.stage(txid, effect_in(body["x"]), body.get("sp"))
    if kind == SEAL:
        core.seal(txid)
        return None
    if kind == COMMIT:
        return core.try_commit(txid)
    if kind == ABORT:
        return core.abort(txid, AbortSource(body["src"]), body.get("det", ""))
    if kind == FINISH:
        return core.finish(
            txid,
            residue=[effect_in(e) for e in body.get("res", ())],
            failed_applies=[effect_in(e) for e in body.get("fail", ())],
            forget=True,
        )
    if kind == ROLLBACK:
        return core.rollback_to(txid, body["m"])
    if kind == SAVEPOINT:
        return core.savepoint(txid, body.get("p"))
    if kind == RELEASE:
        core.release(txid, body["m"])
        return None
    if kind == REVOKE:
        return core.revoke_commit(txid, AbortSource(body["src"]), body.get("det", ""))
    if kind == RESOLVE:
        return core.resolve(body["g"], body["w"], forget=True)
    if kind == ABORT_GROUP:
        return core.abort_group(body["g"], keep=body.get("keep"), forget=True)
    raise ValueError(f"unknown coordinator event kind {kind!r}")

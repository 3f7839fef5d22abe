"""The coordinator's events: one per call of the core that changes its state.

An event names the core method and its arguments in JSON; replaying it on a replica calls
the same method with the same arguments, so every replica makes the same decision (the core
is deterministic and reads no clock). Two events are the coordinator's own: a fence (a
member's later events are skipped) and the settlement of a dead member's transactions.

Effects travel as stubs (tool, class, scopes, key): a replica needs them for ordering and
staleness, never to run them. Only the process that staged an effect holds its functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
FENCE = "fence"
SETTLE = "settle"


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


def call(core: TransactionManager, body: dict[str, Any]) -> Callable[[], Any]:
    """One event's call on a replica's core, its arguments read (a body that cannot be read
    raises here; the call itself may still be refused by the core when it is made)."""
    kind = body["k"]
    if kind == BEGIN:
        group, trace, branch = body.get("g"), body.get("tr"), body.get("b", 0)
        return lambda: core.begin(group=group, trace=trace, branch=branch)
    if kind in (RESOLVE, ABORT_GROUP):
        group = body["g"]
        if kind == RESOLVE:
            winner = int(body["w"])
            return lambda: core.resolve(group, winner, forget=True)
        keep = body.get("keep")
        return lambda: core.abort_group(group, keep=keep, forget=True)
    txid = int(body["t"])
    if kind == READ:
        scopes = [scope_in(s) for s in body["s"]]
        return lambda: core.read(txid, scopes)
    if kind == EXTERNALIZE:
        writes = tuple(scope_in(s) for s in body["s"])
        reads = tuple(scope_in(s) for s in body["r"])
        return lambda: core.externalize(txid, writes, reads)
    if kind == RESERVE:
        scopes = [scope_in(s) for s in body["s"]]
        return lambda: core.reserve(txid, scopes)
    if kind == STAGE:
        effect, savepoint = effect_in(body["x"]), body.get("sp")
        return lambda: core.stage(txid, effect, savepoint)
    if kind == SEAL:
        return lambda: core.seal(txid)
    if kind == COMMIT:
        return lambda: core.try_commit(txid)
    if kind in (ABORT, REVOKE):
        source, detail = AbortSource(body["src"]), str(body.get("det", ""))
        if kind == ABORT:
            return lambda: core.abort(txid, source, detail)
        return lambda: core.revoke_commit(txid, source, detail)
    if kind == FINISH:
        residue = [effect_in(e) for e in body.get("res", ())]
        failed = [effect_in(e) for e in body.get("fail", ())]
        return lambda: core.finish(txid, residue=residue, failed_applies=failed, forget=True)
    if kind == ROLLBACK:
        mark = int(body["m"])
        return lambda: core.rollback_to(txid, mark)
    if kind == SAVEPOINT:
        parent = body.get("p")
        return lambda: core.savepoint(txid, parent)
    if kind == RELEASE:
        mark = int(body["m"])
        return lambda: core.release(txid, mark)
    raise ValueError(f"unknown coordinator event kind {kind!r}")

"""A replica of the transaction manager, kept in step through the coordinator's event log.

`ReplicatedCore` stands where a runtime's `TransactionManager` stands (`Coordinator.core`)
and answers the same calls. A call that changes the core's state is appended to the log as
an event (`atomix.coordinator.events`), and only then made: the store hands back every event
before it that this replica has not replayed, the replica replays them, then makes its own
call on its `TransactionManager`. Every process replays every event in the same order on the
same deterministic core, so all make the same decisions: epochs are global (begins are
ordered), and a transaction of one process waits for, or is made stale by, the transactions
of every other. Decisions are made at replay, so appending takes no lock: appenders of many
processes insert at once, and the log orders them. A call the core refuses (it raises) is
refused alike on every replica: the event stays in the log and changes nothing anywhere.
The rules stay in `atomix.manager`; this module only orders the calls.

Fencing is in the log too: a recoverer appends a fence for a dead member before it recovers
that member's durable log, and every replica skips that member's later events, so a process
presumed dead that comes back can never get a decision after its fence (its replica raises
`Fenced` at its own event instead).

What is not replicated: deadlines. They are in each driver's own clock, which other processes
do not share, so a waiter never expires another process's transaction; a process that dies
is detected by its lease instead (`atomix.coordinator.members`), and a live one's waiters
time out on their own as before.

A seal is sent with the process's next event (it changes nothing another process decides
on), so a commit costs one append for seal and decision together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atomix.coordinator import events as ev
from atomix.coordinator.store import CoordinatorError, Event, Fenced, Store, safe_url
from atomix.decisions import AbortPlan, Blocker, CommitPlan, Proceed, Resolution, Settlement, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.scopes import Scope
from atomix.transaction import OPEN, Transaction

# Events after which a waiter somewhere may proceed: their appends wake the listeners.
_WAKING = frozenset({ev.FINISH, ev.RESOLVE, ev.ABORT_GROUP, ev.SETTLE, ev.FENCE})

#: What this replica makes of one of its own events: the call on its core, with the real
#: objects (a staged effect's functions, a session's record type) that the event's JSON lacks.
Local = Callable[[], Any]


class ReplicaDiverged(CoordinatorError):
    """An event could not be replayed on this replica at all (a body it cannot read):
    runtimes of different versions, or with different options, share a coordinator."""


@dataclass(slots=True)
class ReplicaStats:
    """Counters of one replica: appends made, events replayed, time inside appends."""

    appends: int = 0
    replayed: int = 0
    append_seconds: float = 0.0
    catchups: int = 0
    woken: int = 0
    holes: int = 0
    per_kind: dict[str, int] = field(default_factory=dict)


class ReplicatedCore:
    """The transaction manager of one process, replicated through a coordinator store.

    Guarantees: every state-changing call is applied to this replica at its event's position
    in the log, after every earlier event; every replica replays the same log on the same
    deterministic core, so they agree on every decision and on every refusal; once a fence
    for a member is in the log, no replica applies that member's later events, and the member
    itself gets `Fenced` for them; if replaying fails outright (an unreadable event), the
    replica refuses all further work rather than go on diverged.
    """

    def __init__(
        self,
        store: Store,
        options: RuntimeOptions | None,
        *,
        lock: threading.RLock,
        wake: Callable[[Iterable[int]], None],
    ) -> None:
        self.local = TransactionManager(options)
        self.options = self.local.options
        self.store = store
        self.member = 0  # set by `join`
        self.applied = 0  # the last log position replayed here
        #: live transactions -> the member that began them
        self.owner: dict[int, int] = {}
        #: members fenced in the log: their later events are skipped everywhere
        self.fenced: set[int] = set()
        self.stats = ReplicaStats()
        self.broken: BaseException | None = None
        self._lock = lock  # the runtime coordinator's lock: every core access holds it
        self._wake = wake
        self._pending_seals: list[int] = []
        self._deadlines: dict[int, float] = {}

    def join(self, member: int) -> None:
        self.member = member
        with self._lock:
            self.catch_up()

    # -- the log -----------------------------------------------------------------------------
    def catch_up(self) -> int:
        """Replay what others appended since this replica last looked; the count."""
        found = self.store.read(self.applied)
        if not found:
            return 0
        with self._lock:
            self.stats.catchups += 1
            return self._replay(found)

    def _replay(self, events: Sequence[Event]) -> int:
        n = 0
        for event in events:
            if event.seq <= self.applied:
                continue
            if event.seq != self.applied + 1:
                self.broken = ReplicaDiverged(f"log position {self.applied + 1} was skipped")
                raise self.broken
            if not event.body:
                self.stats.holes += 1
            elif event.member not in self.fenced:
                for body in event.body:
                    self._apply_other(event, body)
            self.applied = event.seq
            n += 1
        self.stats.replayed += n
        return n

    def _apply_other(self, event: Event, body: dict[str, Any]) -> None:
        try:
            kind = body["k"]
            if kind == ev.FENCE:
                self.fenced.add(int(body["m"]))
                return
            if kind == ev.SETTLE:
                self._settle(int(body["m"]), compensated=bool(body["c"]), by=str(body["by"]))
                return
            call = ev.call(self.local, body)
        except Exception as exc:
            self.broken = exc
            raise ReplicaDiverged(
                f"event {event.seq} of member {event.member} cannot be replayed here: {exc!r}"
            ) from exc
        try:
            result = call()
        except Exception:  # noqa: BLE001 - refused alike on every replica: nothing changed
            return
        self._note(body, result, event.member)

    def _note(self, body: dict[str, Any], result: Any, member: int) -> None:
        """Bookkeeping after an event: who owns what, and which waiters it frees."""
        kind = body["k"]
        if kind == ev.BEGIN:
            self.owner[result.txid] = member
        elif kind == ev.FINISH:
            settlement, ready = result
            self.owner.pop(settlement.txid, None)
            if ready:
                self.stats.woken += len(ready)
                self._wake(ready)
            self._wake((settlement.txid,))
        elif kind in (ev.RESOLVE, ev.ABORT_GROUP):
            assert isinstance(result, Resolution)
            for s in result.settled:
                self.owner.pop(s.txid, None)
            self._wake(result.woken)
            self._wake([s.txid for s in result.settled])

    def _submit(self, body: dict[str, Any], local: Local) -> Any:
        """Append `body` (with any pending seals), replay up to it, then make `local`, this
        process's own call; its result (or the core's refusal, raised)."""
        if self.broken is not None:
            raise CoordinatorError(
                f"this process's coordinator replica is unusable: {self.broken}"
            ) from self.broken
        start = time.perf_counter()
        with self._lock:
            seals = self._pending_seals
            self._pending_seals = []
            batch = [{"k": ev.SEAL, "t": t} for t in seals]
            batch.append(body)
            try:
                found = self.store.append(
                    self.member, self.applied, batch, notify=body["k"] in _WAKING
                )
            except Fenced:
                # Learn what the survivor did with this process's transactions (it settled
                # them), so that their handles and `active` say so; then refuse.
                try:
                    self.catch_up()
                except Exception:  # noqa: BLE001 - the refusal is what matters
                    pass
                raise
            except BaseException as exc:
                # Whether the row landed is unknown (the failure may follow its commit): this
                # replica may be behind its own event now, so it stops rather than guess.
                self.broken = exc
                raise
            own = found[-1]
            self._replay(found[:-1])
            stats = self.stats
            stats.appends += 1
            stats.replayed += 1
            self.applied = own.seq
            if self.member in self.fenced:
                raise Fenced(
                    f"coordinator {safe_url(self.store.url)}: member {self.member} was fenced in the log "
                    "before this call; its writes are refused"
                )
            for txid in seals:
                try:
                    self.local.seal(txid)
                except Exception:  # noqa: BLE001 - refused alike everywhere (it ended first)
                    pass
            try:
                result = local()
            finally:
                stats.append_seconds += time.perf_counter() - start
            self._note(body, result, self.member)
            return result

    def _one(self, body: dict[str, Any], call: Callable[[], Any]) -> Any:
        return self._submit(body, call)

    def _scopes(self, scopes: Iterable[str | Scope]) -> list[Scope]:
        scope = self.local.scope
        return [s if isinstance(s, Scope) else scope(s) for s in scopes]

    # -- the manager's calls -------------------------------------------------------------------
    def begin(
        self,
        *,
        group: str | None = None,
        trace: str | None = None,
        branch: int = 0,
        record: type[Transaction] = Transaction,
    ) -> Any:
        body: dict[str, Any] = {"k": ev.BEGIN, "g": group, "tr": trace, "b": branch}
        return self._submit(
            body, lambda: self.local.begin(group=group, trace=trace, branch=branch, record=record)
        )

    def read(self, txid: int, scopes: Iterable[str | Scope]) -> Proceed | Wait | AbortPlan:
        resolved = self._scopes(scopes)
        body = {"k": ev.READ, "t": txid, "s": [ev.scope_out(s) for s in resolved]}
        result: Proceed | Wait | AbortPlan = self._one(body, lambda: self.local.read(txid, resolved))
        return result

    def externalize(
        self, txid: int, scopes: Iterable[str | Scope], reads: Iterable[str | Scope] = ()
    ) -> Proceed | Wait | AbortPlan:
        resolved = tuple(self._scopes(scopes))
        observed = tuple(self._scopes(reads))
        body = {
            "k": ev.EXTERNALIZE,
            "t": txid,
            "s": [ev.scope_out(s) for s in resolved],
            "r": [ev.scope_out(s) for s in observed],
        }
        result: Proceed | Wait | AbortPlan = self._one(
            body, lambda: self.local.externalize(txid, resolved, observed)
        )
        return result

    def reserve(self, txid: int, scopes: Iterable[str | Scope]) -> Proceed | Wait | AbortPlan:
        resolved = self._scopes(scopes)
        body = {"k": ev.RESERVE, "t": txid, "s": [ev.scope_out(s) for s in resolved]}
        result: Proceed | Wait | AbortPlan = self._one(
            body, lambda: self.local.reserve(txid, resolved)
        )
        return result

    def stage(self, txid: int, effect: Effect, savepoint: int | None = None) -> Proceed | AbortPlan:
        body = {"k": ev.STAGE, "t": txid, "x": ev.effect_out(effect, self.local.scope)}
        if savepoint is not None:
            body["sp"] = savepoint
        result: Proceed | AbortPlan = self._one(
            body, lambda: self.local.stage(txid, effect, savepoint)
        )
        return result

    def seal(self, txid: int) -> None:
        tx = self.local.get(txid)
        if tx.state is OPEN and txid not in self._pending_seals:
            # Sent with this process's next event (see the module docstring); sealing here
            # at once keeps what this process sees of its own transaction exact.
            self._pending_seals.append(txid)
            return
        self._one({"k": ev.SEAL, "t": txid}, lambda: self.local.seal(txid))

    def try_commit(self, txid: int) -> CommitPlan | Wait | AbortPlan:
        result: CommitPlan | Wait | AbortPlan = self._one(
            {"k": ev.COMMIT, "t": txid}, lambda: self.local.try_commit(txid)
        )
        return result

    def abort(self, txid: int, source: AbortSource | str, detail: str = "") -> AbortPlan:
        src = AbortSource(source)
        result: AbortPlan = self._one(
            {"k": ev.ABORT, "t": txid, "src": src.value, "det": detail},
            lambda: self.local.abort(txid, src, detail),
        )
        return result

    def finish(
        self,
        txid: int,
        *,
        residue: Sequence[Effect] = (),
        failed_applies: Sequence[Effect] = (),
        waited: float = 0.0,
        forget: bool = False,
    ) -> tuple[Settlement, list[int]]:
        scope = self.local.scope
        body: dict[str, Any] = {"k": ev.FINISH, "t": txid}
        if residue:
            body["res"] = [ev.effect_out(e, scope) for e in residue]
        if failed_applies:
            body["fail"] = [ev.effect_out(e, scope) for e in failed_applies]
        result: tuple[Settlement, list[int]] = self._one(
            body,
            lambda: self.local.finish(
                txid, residue=residue, failed_applies=failed_applies, waited=waited, forget=forget
            ),
        )
        return result

    def rollback_to(self, txid: int, savepoint: int) -> AbortPlan:
        result: AbortPlan = self._one(
            {"k": ev.ROLLBACK, "t": txid, "m": savepoint},
            lambda: self.local.rollback_to(txid, savepoint),
        )
        return result

    def savepoint(self, txid: int, parent: int | None = None) -> int:
        result: int = self._one(
            {"k": ev.SAVEPOINT, "t": txid, "p": parent}, lambda: self.local.savepoint(txid, parent)
        )
        return result

    def release(self, txid: int, savepoint: int) -> None:
        self._one({"k": ev.RELEASE, "t": txid, "m": savepoint}, lambda: self.local.release(txid, savepoint))

    def revoke_commit(self, txid: int, source: AbortSource | str, detail: str = "") -> AbortPlan:
        src = AbortSource(source)
        result: AbortPlan = self._one(
            {"k": ev.REVOKE, "t": txid, "src": src.value, "det": detail},
            lambda: self.local.revoke_commit(txid, src, detail),
        )
        return result

    def resolve(self, group: str, winner: int, *, forget: bool = False) -> Resolution:
        result: Resolution = self._one(
            {"k": ev.RESOLVE, "g": group, "w": winner},
            lambda: self.local.resolve(group, winner, forget=forget),
        )
        return result

    def abort_group(self, group: str, *, keep: int | None = None, forget: bool = False) -> Resolution:
        result: Resolution = self._one(
            {"k": ev.ABORT_GROUP, "g": group, "keep": keep},
            lambda: self.local.abort_group(group, keep=keep, forget=forget),
        )
        return result

    # -- reading (this replica, as of its last event) --------------------------------------------
    def get(self, txid: int) -> Transaction:
        return self.local.get(txid)

    def scope(self, spec: str | Scope) -> Scope:
        return self.local.scope(spec)

    def frontier(self, spec: str | Scope) -> int:
        return self.local.frontier(spec)

    def active(self) -> list[Transaction]:
        """This process's unsettled transactions (a runtime asks about its own)."""
        mine = self.member
        return [tx for tx in self.local.active() if self.owner.get(tx.txid) == mine]

    def active_everywhere(self) -> list[Transaction]:
        """Every process's unsettled transactions, as of this replica's last event."""
        return self.local.active()

    def runs_at_call(self, effect_class: EffectClass | None) -> bool:
        return self.local.runs_at_call(effect_class)

    def winner(self, group: str) -> int | None:
        return self.local.winner(group)

    def blockers(self, txid: int) -> list[Blocker]:
        return self.local.blockers(txid)

    def forget(self, txid: int) -> None:
        self.local.forget(txid)

    # -- deadlines: this process's own (see the module docstring) --------------------------------
    def wait_until(self, txid: int, deadline: float | None) -> None:
        if deadline is None:
            self._deadlines.pop(txid, None)
        else:
            self._deadlines[txid] = deadline

    def done_waiting(self, txid: int) -> None:
        self._deadlines.pop(txid, None)

    def next_deadline(self, txids: Iterable[int], after: float) -> float | None:
        return None

    def expire(self, now: float, *, but: int | None = None) -> list[AbortPlan]:
        return []

    # -- recovery of a dead member's transactions --------------------------------------------------
    def fence_member(self, member: int) -> None:
        """Put a fence for `member` in the log: from here on no replica applies its events."""
        self._submit({"k": ev.FENCE, "m": member}, lambda: self.fenced.add(member))

    def settle_member(self, member: int, *, compensated: bool, by: str) -> list[int]:
        """Fence `member` in the log, abort (with `cancelled`) every unsettled transaction it
        began and finish each of its transactions, in one event that every replica replays
        alike: a committed one as committed (its effects were finished by key from its log,
        or it had none), an aborted one with its eager effects as residue unless
        `compensated` (its log's recovery compensated them). The transactions settled."""
        body = {"k": ev.SETTLE, "m": member, "c": compensated, "by": by}
        result: list[int] = self._submit(
            body, lambda: self._settle(member, compensated=compensated, by=by)
        )
        return result

    def _settle(self, member: int, *, compensated: bool, by: str) -> list[int]:
        self.fenced.add(member)
        local = self.local
        done: list[int] = []
        for txid in sorted(t for t, m in self.owner.items() if m == member):
            tx = local.get(txid)
            if tx.finished:
                continue
            if tx.state.value not in ("committed", "aborted"):
                detail = f"its process (member {member}) died; settled by {by}"
                local.abort(txid, AbortSource.CANCELLED, detail)
            residue: list[Effect] = []
            if tx.state.value == "aborted" and not compensated:
                residue = [e for e in tx.staged.values() if e.effect_class is EffectClass.REVERSIBLE]
            result = local.finish(txid, residue=residue, forget=True)
            self._note({"k": ev.FINISH, "t": txid}, result, member)
            done.append(txid)
        return done

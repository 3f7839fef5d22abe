"""The transaction manager: the protocol's one home, as a pure state machine.

No I/O and no clock: drivers feed it events (begin, read, externalise, stage, seal,
try-commit, abort, finish) and act on the decisions it returns. Every rule about
frontiers, staleness and settlement lives here and nowhere else. This module is kept whole,
larger than the others, because the protocol's rules must live in one place: split, a rule
about waiting, staleness or speculation could be changed in one part and missed in another.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Literal, TypeVar, overload

from atomix.decisions import (
    PROCEED,
    AbortPlan,
    Blocker,
    CommitPlan,
    Proceed,
    Resolution,
    Settlement,
    Wait,
)
from atomix.effects import BUFFERABLE, IRREVERSIBLE, REVERSIBLE, AbortSource, Effect, EffectClass
from atomix.epochs import EpochAllocator
from atomix.errors import IllegalTransition, UnknownTransaction
from atomix.frontier import ScopeIndex
from atomix.scope_parsing import CANONICAL, ScopePolicy
from atomix.scopes import Scope
from atomix.transaction import (
    ABORT_EVENT,
    ABORTED,
    AFTER_ABORT,
    AFTER_COMMIT,
    AFTER_SEAL,
    COMMITTED,
    OPEN,
    SEAL_EVENT,
    SEALED,
    TERMINAL,
    WAIT_EVENT,
    WAITING,
    Transaction,
    TxEvent,
    next_state,
)

GLOBAL_SCOPE = Scope("global", ("*",))
# Scopes left by settled work between two reclamations (see TransactionManager._reclaim).
_RECLAIM_EVERY = 4096
TxRecord = TypeVar("TxRecord", bound=Transaction)
_LOSING = AbortSource.LOSING_SPECULATION
_STALE = AbortSource.STALE_READ


_by_epoch = itemgetter(1)  # a Blocker's epoch: one per transaction, so it orders them too
_txid_of = itemgetter(0)


class _Parked:
    """One Wait's parking: the waiter, how many of the distinct transactions it names are
    still unsettled (-1 once the parking is void: decided again, aborted or finished), and
    the latest epoch among them."""

    __slots__ = ("txid", "pending", "horizon")

    def __init__(self, txid: int, pending: int, horizon: int) -> None:
        self.txid = txid
        self.pending = pending
        self.horizon = horizon


class _Parking:
    """Who waits for whom, counted. A Wait parks its transaction on the transactions it
    names in `wake_on`: the latest blocker in each queue it waits in (each waits, in turn,
    for the earlier ones it conflicts with, so it settles after them); or all its blockers,
    when it was woken and must wait again for one no later than what woke it (they settled
    out of order, and parking on the latest again could wake it once per blocker). Each
    settle counts down the parkings
    that name the settled one, so a waiter is woken when the last of those settles: a settle
    costs one step per parking that names it, not a rebuild of every waiter's blocker list,
    and parking costs one step per queue, not one per blocker. Blockers only ever leave by
    settling (a registration lasts until finish), so a waiter is never woken late."""

    __slots__ = ("parked", "watchers", "woken")

    def __init__(self) -> None:
        self.parked: dict[int, _Parked] = {}  # waiter -> its live parking
        self.watchers: dict[int, list[_Parked]] = {}  # blocker -> parkings that name it
        # Waiters woken and not yet decided otherwise -> the latest epoch they were parked on.
        self.woken: dict[int, int] = {}

    def park(self, waiter: int, ids: set[int], horizon: int) -> None:
        """Park `waiter` on the distinct transactions `ids`, the latest of epoch `horizon`
        (replacing any parking of it)."""
        old = self.parked.get(waiter)
        if old is not None:
            old.pending = -1
        parked = self.parked[waiter] = _Parked(waiter, len(ids), horizon)
        watchers = self.watchers
        for blocker in ids:
            named = watchers.get(blocker)
            if named is None:
                watchers[blocker] = [parked]
            else:
                named.append(parked)

    def unpark(self, waiter: int) -> None:
        parked = self.parked.pop(waiter, None)
        if parked is not None:
            parked.pending = -1
        if self.woken:
            self.woken.pop(waiter, None)

    def settled(self, blocker: int) -> list[int]:
        """Waiters whose last pending blocker was `blocker`, in txid order."""
        named = self.watchers.pop(blocker, None)
        if not named:
            return []
        ready: list[int] = []
        for parked in named:
            if parked.pending > 0:
                parked.pending -= 1
                if parked.pending == 0:
                    del self.parked[parked.txid]
                    ready.append(parked.txid)
                    self.woken[parked.txid] = parked.horizon
        if len(ready) > 1:
            ready.sort()
        return ready


@dataclass(slots=True, eq=False)
class _Group:
    """One speculation group while any of its branches is unfinished."""

    members: dict[int, Transaction] = field(default_factory=dict)  # not forgotten, in begin order
    unfinished: int = 0
    won: bool = False  # one of its branches committed
    picked: int | None = None  # the branch resolve picked as its winner


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Switches of the protocol. The defaults are Atomix (`tx-full`); each other value is an
    ablation the evaluation measures, never a mode of its own re-implementing the rules.

    - `scopes`: how scope texts are canonicalised and compared (`NAIVE`: raw strings).
    - `frontier`: one frontier per resource, or one global frontier (one ordered lock).
    - `wait_for_frontiers`: False commits at seal and externalises at once, without waiting
      for earlier conflicting transactions to settle.
    - `scope_on_read`: False registers no reads (no waiting on them, no stale-read checks).
    - `abort_on_stale`: False lets stale reads and late accesses commit.
    - `classify_residue`: False leaves residue out of settlements (it still changes the
      world, and still makes readers of its scopes stale).
    - `gate_irreversible`: False removes the gate: an irreversible effect runs when the agent
      calls, as an eager effect does (the shim externalises it first, `runs_at_call` says
      which classes do). At commit it is final, not released again; at abort it cannot be
      undone, so its settlement reports it as residue.
    - `keyed_delivery`: False delivers effects to substrates without their idempotency key
      (the runtime still keys its own records, so a duplicated staging is still recognised),
      so a substrate cannot recognise a re-delivery (a commit-time re-apply after an
      ambiguous failure, a duplicated delivery) as the same effect. Read by
      `TxSession.delivery_key`, which shims ask for the key they hand to a substrate.
    - `compensate_on_abort`: False leaves an aborted transaction's externalised reversible
      effects applied: the abort plan compensates nothing, and the settlement reports them as
      residue (the runtime knows they stay). Savepoint rollbacks still compensate.
    - `enforce_seal`: False admits a read, externalise or stage on a sealed (or waiting)
      transaction as if it were open, growing its footprint, instead of aborting it with
      `seal_violation`; a later try_commit decides on the grown footprint. It changes nothing
      where no access ever comes after seal (a driver that seals only inside commit, after
      every call has returned).

    `gate_irreversible=False` and `keyed_delivery=False` change how a shim delivers calls:
    the harness's shim honours them; `Runtime`'s tool shims do not, and it refuses them.
    """

    scopes: ScopePolicy = field(default=CANONICAL)
    frontier: Literal["per-resource", "global"] = "per-resource"
    wait_for_frontiers: bool = True
    scope_on_read: bool = True
    abort_on_stale: bool = True
    classify_residue: bool = True
    gate_irreversible: bool = True
    keyed_delivery: bool = True
    compensate_on_abort: bool = True
    enforce_seal: bool = True


class TransactionManager:
    """Decides when transactions may touch scopes, commit, or must abort.

    Guarantees (given correct shim metadata): a transaction commits only when no unsettled
    transaction of an earlier epoch and another speculation group is registered on a scope
    overlapping its footprint; waits are only ever on earlier epochs (no deadlock); frontiers
    never regress; a stale read or a late access aborts; committed history is
    conflict-serialisable in epoch order.
    """

    def __init__(self, options: RuntimeOptions | None = None) -> None:
        self.options = options or RuntimeOptions()
        self._epochs = EpochAllocator()
        self._order = ScopeIndex()  # who is registered where: decides waiting
        # real scopes: commit stamps and externalised effects
        self._real = ScopeIndex(queues=False)
        self._txs: dict[int, Transaction] = {}
        self._groups: dict[str, _Group] = {}
        self._parking = _Parking()
        self._parked = self._parking.parked  # (read on hot paths: is anyone parked at all?)
        # Transactions parked at externalize -> the scopes they wait to externalise, also
        # registered in `_queue` until they are decided again: a read does not overtake an
        # earlier one (see `read`).
        self._queued: dict[int, Sequence[Scope]] = {}
        self._queue = ScopeIndex()
        # Waiting transactions -> until when their driver waits (in the drivers' clock units;
        # the core has none of its own). Past it, anyone deciding with the time may expire them.
        self._deadlines: dict[int, float] = {}
        # The same deadlines as a heap of (deadline, txid), so that expiring looks only at the
        # ones that passed; an entry the dict no longer holds (or holds with another value) is
        # stale and skipped.
        self._deadline_heap: list[tuple[float, int]] = []
        self._next_txid = 1
        # Reclamation of settled work's scopes (see `_reclaim`): unfinished transactions in
        # begin order (finished ones leave from the front), and the scopes settled
        # transactions left, each with the next transaction id at the time: once every
        # transaction below that id has finished, its nodes' stamps can judge no one.
        self._begun: deque[Transaction] = deque()
        self._left: deque[tuple[int, Scope]] = deque()
        #: How many scopes settled work leaves before the core reclaims what it can (0: never,
        #: the reclamation ablation; 1: at every finish, as the property tests run it).
        self.reclaim_every = _RECLAIM_EVERY
        self._seq = 0
        self._global = self.options.frontier == "global"
        self._canonical = self.options.scopes.canonical
        self._stale = self.options.abort_on_stale
        self._wait_for_frontiers = self.options.wait_for_frontiers
        self._ungated = not self.options.gate_irreversible
        # An aborted transaction's effects that ran and that its abort leaves in place (see
        # `_left_behind`): none unless one of these components is switched off.
        self._leaves = self._ungated or not self.options.compensate_on_abort

    # -- lookup ----------------------------------------------------------------------------
    def get(self, txid: int) -> Transaction:
        try:
            return self._txs[txid]
        except KeyError:
            raise UnknownTransaction(txid) from None

    def scope(self, spec: str | Scope) -> Scope:
        """Canonicalise a scope with this runtime's scope policy."""
        return self.options.scopes.resolve(spec)

    def frontier(self, spec: str | Scope) -> int:
        """The certified frontier of a scope (monotone: a reclaimed scope's frontier, see
        `_reclaim`, is the highest epoch reclaimed anywhere, which no unfinished transaction
        is below)."""
        real = self._real
        return max(real.frontier(self.scope(spec)), real.floor)

    def active(self) -> list[Transaction]:
        return [tx for tx in self._txs.values() if not tx.finished]

    def runs_at_call(self, effect_class: EffectClass | None) -> bool:
        """Whether an effect of this class runs when it is called (externalised first, then
        staged as it ran) rather than at commit: reversible ones always; irreversible ones
        only when the gate is switched off (`gate_irreversible=False`). Shims ask this."""
        return effect_class is REVERSIBLE or (self._ungated and effect_class is IRREVERSIBLE)

    def _tick(self) -> int:
        self._seq += 1
        return self._seq

    def _order_scope(self, scope: Scope) -> Scope:
        return GLOBAL_SCOPE if self._global else scope

    def _resolved(self, scopes: Iterable[str | Scope]) -> Sequence[Scope]:
        """Canonical scopes: as given when they are resolved already (what sessions hand
        over; never under the naive policy), else each resolved."""
        if self._canonical and scopes.__class__ in (list, tuple):
            for s in scopes:
                if s.__class__ is not Scope:
                    break
            else:
                return scopes
        return [self.scope(s) for s in scopes]

    # -- begin -------------------------------------------------------------------------------
    @overload
    def begin(
        self, *, group: str | None = None, trace: str | None = None, branch: int = 0
    ) -> Transaction: ...

    @overload
    def begin(
        self,
        *,
        group: str | None = None,
        trace: str | None = None,
        branch: int = 0,
        record: type[TxRecord],
    ) -> TxRecord: ...

    def begin(
        self,
        *,
        group: str | None = None,
        trace: str | None = None,
        branch: int = 0,
        record: type[Transaction] = Transaction,
    ) -> Transaction:
        """A new transaction, open, with a fresh epoch. `record` is the class of its record: a
        driver passes its handle class (a Transaction subclass, made with the same arguments)
        so that one object serves as both."""
        txid = self._next_txid
        self._next_txid = txid + 1
        self._real.clock = txid + 1
        begun = self._begun
        while begun and begun[0].finished:
            begun.popleft()
        tx = record(
            txid, self._epochs.allocate(), f"t{txid}" if trace is None else trace, group, branch
        )
        self._txs[txid] = tx
        begun.append(tx)
        if group is not None:
            members = self._groups.get(group)
            if members is None:
                members = self._groups[group] = _Group()
            members.members[txid] = tx
            members.unfinished += 1
        if self._global:
            # One global frontier behaves like one ordered lock: register at begin, so that
            # every later transaction waits for this one whatever it touches.
            self._order.register(GLOBAL_SCOPE, tx)
        return tx

    # -- accesses while open -------------------------------------------------------------------
    def _check_open(self, tx: Transaction, what: str) -> AbortPlan | None:
        if tx.state is OPEN:
            return None
        if tx.state in TERMINAL:
            raise IllegalTransition(tx.txid, tx.state.value, what)
        if not self.options.enforce_seal:
            return None  # the seal ablation: admitted as if open (see RuntimeOptions)
        return self.abort(tx.txid, AbortSource.SEAL_VIOLATION, f"{what} after seal")

    def _eager_conflict(
        self,
        tx: Transaction,
        scope: Scope,
        blockers: list[Blocker],
        wake: list[int],
        collect: bool = True,
    ) -> AbortPlan | None:
        """Another transaction's externalised, unsettled reversible effect on this scope.

        An earlier one is waited for (added to `blockers` and `wake` unless the caller does
        not `collect` them: its compensation could still rewrite what we would see); a later
        one or a sibling branch makes this access stale (the abort is returned).
        """
        for other in self._real.eager_owners(scope):
            if other is tx or other.finished:
                continue
            if (tx.group is not None and other.group == tx.group) or other.epoch > tx.epoch:
                return self.abort(
                    tx.txid,
                    _STALE,
                    f"{scope} holds an unsettled effect of epoch {other.epoch}",
                )
            if collect:
                blockers.append(Blocker(other.txid, other.epoch, scope._text))
                wake.append(other.txid)
        return None

    def _late(self, tx: Transaction, scope: Scope, *, write: bool) -> AbortPlan | None:
        if not self.options.abort_on_stale or self._real.max_epoch <= tx.epoch:
            return None  # (nothing of a later epoch has committed anywhere)
        committed = self._real.frontier(scope) if write else self._real.last_write_epoch(scope)
        if committed > tx.epoch:
            return self.abort(
                tx.txid,
                _STALE,
                f"late access to {scope}: epoch {committed} already committed there",
            )
        return None

    def _wait(
        self,
        tx: Transaction,
        blockers: Sequence[Blocker],
        wake: list[int],
        externalizing: Sequence[Scope] | None = None,
    ) -> Wait:
        """Park `tx` on `wake` (the latest of `blockers` in each queue it waits in; all of
        them if it was woken before and must wait again), replacing any parking of an earlier
        Wait, and say so: `finish` lists it when the last of those settles. A transaction
        waiting to externalise `externalizing` is queued there meanwhile."""
        txid = tx.txid
        if self._queued:
            self._dequeue(tx)
        parking = self._parking
        # One source (one queue's prefix, or one eager owner) is in epoch order and has no
        # repeats already; several may name one blocker twice over the same scope.
        ordered = blockers if len(wake) == 1 else sorted(dict.fromkeys(blockers), key=_by_epoch)
        woken = parking.woken
        # Woken, and still behind one no later than what woke it: they settle out of order
        # here, so count them all down rather than wake once per blocker.
        early = woken and txid in woken and ordered[0][1] <= woken[txid]
        ids = set(map(_txid_of, ordered)) if early else set(wake)
        parking.park(txid, ids, ordered[-1][1])
        if externalizing:
            self._queued[txid] = externalizing
            for scope in externalizing:
                self._queue.register(scope, tx)
        return Wait(txid, tuple(ordered), tuple(sorted(ids)))

    def _unpark(self, txid: int) -> None:
        """`txid` was decided again, aborted or finished: it waits for nothing any more."""
        self._parking.unpark(txid)
        if self._queued:
            tx = self._txs.get(txid)
            if tx is not None:
                self._dequeue(tx)

    def _dequeue(self, tx: Transaction) -> None:
        scopes = self._queued.pop(tx.txid, None)
        if scopes:
            left = self._left
            bound = self._next_txid
            for scope in scopes:
                self._queue.unregister(scope, tx)
                left.append((bound, scope))

    def _queued_before(self, tx: Transaction, scope: Scope, wake: list[int]) -> list[Blocker]:
        """Earlier transactions (of another group) queued to externalise on `scope`.

        A read does not overtake them, as a fair reader-writer lock lets no reader overtake
        a queued writer: each is about to run an effect the read would then have missed
        (making it stale), and a reader that went ahead would be woken and parked again at
        every hand-off of the scope between them. It waits until they have settled."""
        return self._queue.earlier_blockers(scope, tx.epoch, tx.group, True, wake)

    def read(self, txid: int, scopes: Iterable[str | Scope]) -> Proceed | Wait | AbortPlan:
        """Scope-on-read: register what the transaction is about to observe."""
        tx = self.get(txid)
        if (plan := self._check_open(tx, "read")) is not None:
            return plan
        if not self.options.scope_on_read:
            return PROCEED
        resolved = [self.scope(s) for s in scopes]
        blockers: list[Blocker] = []
        wake: list[int] = []
        if (plan := self._read_blockers(tx, resolved, blockers, wake)) is not None:
            return plan
        if blockers:
            return self._wait(tx, blockers, wake)
        if self._parked or self._queued:
            self._unpark(txid)
        self._register_reads(tx, resolved)
        return PROCEED

    def _read_blockers(
        self,
        tx: Transaction,
        resolved: Sequence[Scope],
        blockers: list[Blocker],
        wake: list[int],
        written: Sequence[Scope] = (),
    ) -> AbortPlan | None:
        """What a read of `resolved` waits for (added to `blockers`, and what wakes it to
        `wake`), or its abort. A scope the same step also writes (`written`) is checked by the
        caller as a write, which subsumes a read: it waits for every earlier holder."""
        queued = self._queued
        for scope in resolved:
            if written and scope in written and self._wait_for_frontiers:
                continue
            if (plan := self._eager_conflict(tx, scope, blockers, wake)) is not None:
                return plan
            if (plan := self._late(tx, scope, write=False)) is not None:
                return plan
            if queued:
                blockers += self._queued_before(tx, scope, wake)
        return None

    def _register_reads(self, tx: Transaction, resolved: Sequence[Scope]) -> None:
        register = self._order.register
        for scope in resolved:
            if scope not in tx.reads:
                tx.reads[scope] = self._tick()
            # As a reader: a later reader of the scope need not wait for this one.
            register(self._order_scope(scope), tx, write=False)

    def externalize(
        self, txid: int, scopes: Iterable[str | Scope], reads: Iterable[str | Scope] = ()
    ) -> Proceed | Wait | AbortPlan:
        """May a reversible effect on these scopes run now? Proceed reserves them.

        It runs only once no earlier unsettled transaction is registered there, so eager
        effects reach a resource in epoch order and no one earlier can observe them.

        `reads` are scopes the call observes before it acts (a read-modify-write tool): they
        are read in the same step, as `read` would, once both may go ahead. So the call waits
        once, for everything in its way, instead of first as a reader (woken, and parked
        again, at every hand-off of the scope between earlier writers) and then as a writer;
        and its reads are registered when it runs, which is when it observes them.
        """
        try:
            tx = self._txs[txid]
        except KeyError:
            raise UnknownTransaction(txid) from None
        if tx.state is not OPEN and (
            plan := self._check_open(tx, "read" if reads else "externalize")
        ) is not None:
            return plan
        if (  # one resolved scope, what the shim hands over: as it is
            scopes.__class__ is tuple
            and len(scopes) == 1
            and (only := scopes[0]).__class__ is Scope
            and self._canonical
        ):
            resolved: Sequence[Scope] = (only,)
        else:
            resolved = self._resolved(scopes)
        blockers: list[Blocker] = []
        wake: list[int] = []
        observed = self._resolved(reads) if reads and self.options.scope_on_read else ()
        if observed and (
            plan := self._read_blockers(tx, observed, blockers, wake, resolved)
        ) is not None:
            return plan
        frontiers = self._wait_for_frontiers
        real = self._real
        order = self._order
        glob = self._global
        # Only another's unsettled eager effect or a commit of a later epoch can abort this;
        # neither exists in the common case, and then no scope needs a look for them. (Each
        # eager scope of a transaction is one registration: when they are all there are,
        # every eager effect anywhere is its own.)
        late = self._stale and real.max_epoch > tx.epoch
        others_eager = real.eager_count > len(tx.eager_scopes)
        for scope in resolved:
            # An earlier eager owner also holds the scope: with frontiers it is waited for
            # among the earlier holders, so here it is only checked for what aborts.
            if others_eager and (
                plan := self._eager_conflict(tx, scope, blockers, wake, collect=not frontiers)
            ) is not None:
                return plan
            if late and (plan := self._late(tx, scope, write=True)) is not None:
                return plan
            if frontiers:
                blockers += order.earlier_blockers(
                    GLOBAL_SCOPE if glob else scope, tx.epoch, tx.group, True, wake
                )
        if blockers:
            return self._wait(tx, blockers, wake, resolved)
        if self._parked or self._queued:
            self._unpark(txid)
        if observed:
            self._register_reads(tx, observed)
        self._seq += 1
        seq = self._seq
        eager = tx.eager_scopes
        effects = tx.effect_scopes
        for scope in resolved:
            if scope not in eager:
                eager[scope] = seq
            effects.add(scope)
            real.register_eager(scope, tx)
            order.register(GLOBAL_SCOPE if glob else scope, tx)
        return PROCEED

    def stage(
        self, txid: int, effect: Effect, savepoint: int | None = None
    ) -> Proceed | AbortPlan:
        """Record an effect. Bufferable and irreversible ones stay with the runtime until
        commit; a reversible one must have been externalised on its scopes first.
        `savepoint`: the one it belongs to (0: none; None: the current one, see
        `savepoint`), whose rollback undoes it."""
        try:
            tx = self._txs[txid]
        except KeyError:
            raise UnknownTransaction(txid) from None
        if tx.savepoints is not None:
            owner = tx.current_savepoint if savepoint is None else savepoint
            if owner and effect.key not in tx.staged:
                if owner not in tx.savepoints:
                    raise ValueError(f"transaction {txid} has no savepoint {owner}")
                if tx.owners is None:
                    tx.owners = {}
                tx.owners[effect.key] = owner
        if tx.state is not OPEN and (plan := self._check_open(tx, "stage")) is not None:
            return plan
        key = effect.key
        staged = tx.staged
        if key in staged:
            tx.duplicates_suppressed += 1  # a duplicated delivery of a staged call
            return PROCEED
        cls = effect.effect_class
        # Ran when called (reversible; irreversible too without the gate): externalised first.
        if cls is REVERSIBLE or (self._ungated and cls is IRREVERSIBLE):
            eager = tx.eager_scopes
            for s in effect.scopes:
                if s not in eager and self.scope(s) not in eager:
                    break
            else:
                s = None
            if s is not None:
                missing = [s for s in effect.scopes if self.scope(s) not in eager]
                raise ValueError(
                    f"effect of {effect.tool!r}: {cls.value} effect that runs when called, "
                    "staged without externalize() "
                    f"on {', '.join(map(str, missing))}"
                )
        else:
            scopes = effect.scopes
            # Sessions hand over resolved scopes; only other specs (or the naive policy) need
            # parsing. One scope is the usual case, and checked without a loop.
            if not self._canonical or (
                scopes[0].__class__ is not Scope
                if len(scopes) == 1
                else any(s.__class__ is not Scope for s in scopes)
            ):
                scopes = tuple(self.scope(s) for s in scopes)
            real = self._real
            # Only an unsettled eager effect or a commit of a later epoch can make this stale;
            # neither exists in the common case, and then no scope needs a look.
            if real.eager_count > len(tx.eager_scopes) or (
                self._stale and real.max_epoch > tx.epoch
            ):
                for scope in scopes:
                    if (plan := self._stage_conflict(tx, scope)) is not None:
                        return plan
            mine = tx.effect_scopes
            register = None if self._global else self._order.register  # global: at begin
            for scope in scopes:
                known = len(mine)
                mine.add(scope)
                if len(mine) != known and register is not None:  # new to the footprint
                    register(scope, tx)
        self._seq += 1
        effect.seq = self._seq
        staged[key] = effect
        return PROCEED

    def _stage_conflict(self, tx: Transaction, scope: Scope) -> AbortPlan | None:
        """A buffered or gated effect on `scope` is stale behind a later epoch's unsettled
        eager effect, or late behind its commit (abort-on-stale)."""
        for other in self._real.eager_owners(scope):
            if other is not tx and not other.finished and other.epoch > tx.epoch:
                return self.abort(
                    tx.txid,
                    _STALE,
                    f"{scope} holds an unsettled effect of later epoch {other.epoch}",
                )
        return self._late(tx, scope, write=True)

    def reserve(self, txid: int, scopes: Iterable[str | Scope]) -> Proceed | Wait | AbortPlan:
        """Claim `scopes` for an open transaction before it touches them: a retry of a
        transaction that aborted on a stale read claims the footprint of the attempt that
        failed, so that it is not starved by the work it keeps losing to.

        The claim registers it as a writer of each scope (later transactions that touch
        one wait for it, as for any earlier writer) and waits until every earlier
        transaction holding one of them has settled (Wait until then; asked again, it
        proceeds). So a retry runs after what beat it and before what came after it, on
        those scopes. A claim adds nothing to the footprint its commit waits for or stamps:
        it only orders others behind it, and it is released when the transaction finishes."""
        tx = self.get(txid)
        if (plan := self._check_open(tx, "reserve")) is not None:
            return plan
        resolved = self._resolved(scopes)
        mine = tx.reserved
        if mine is None:
            mine = tx.reserved = set()
        register = None if self._global else self._order.register  # global: at begin
        for scope in resolved:
            if scope not in mine:
                mine.add(scope)
                if register is not None:
                    register(scope, tx)
        if self._wait_for_frontiers:
            blockers: list[Blocker] = []
            wake: list[int] = []
            for scope in resolved:
                blockers += self._earlier_holders(tx, scope, wake)
            if blockers:
                return self._wait(tx, blockers, wake)
        if self._parked or self._queued:
            self._unpark(txid)
        return PROCEED

    # -- seal, commit, abort ---------------------------------------------------------------------
    def seal(self, txid: int) -> None:
        try:
            tx = self._txs[txid]
        except KeyError:
            raise UnknownTransaction(txid) from None
        state = AFTER_SEAL.get(tx.state)
        if state is None:
            raise IllegalTransition(txid, tx.state.value, SEAL_EVENT.value)
        tx.state = state

    def _earlier_holders(self, tx: Transaction, scope: Scope, wake: list[int]) -> list[Blocker]:
        """Earlier unsettled transactions a write of `scope` must wait for."""
        return self._order.earlier_blockers(
            self._order_scope(scope), tx.epoch, tx.group, True, wake
        )

    def blockers(self, txid: int) -> list[Blocker]:
        """What this transaction's commit waits for: earlier unsettled transactions whose
        access to its footprint conflicts with its own (a write meets every access, a read
        only writes: reads never conflict with reads), and aborted branches of its own group
        whose compensations on its footprint are still pending (their before-images would
        otherwise overwrite what it commits). Neither kind can wait on it in turn: an aborted
        branch only finishes."""
        return self._blockers(self.get(txid), [])

    def _blockers(self, tx: Transaction, wake: list[int]) -> list[Blocker]:
        """What its commit waits for (see `blockers`); what wakes it is added to `wake`."""
        order = self._order
        epoch, group = tx.epoch, tx.group
        found: list[Blocker] = []
        written = tx.effect_scopes
        if self._global:
            # One global frontier orders everything: each earlier unsettled transaction is
            # one blocker, met on the global scope (registered as a write at begin).
            found = order.earlier_blockers(GLOBAL_SCOPE, epoch, group, True, wake)
        else:
            for scope in written:
                found += order.earlier_blockers(scope, epoch, group, True, wake)
            if tx.reads:
                for scope in tx.reads:
                    if scope not in written:  # read only: only writers are in its way
                        found += order.earlier_blockers(scope, epoch, group, False, wake)
        if group is not None and self._real.eager_count:
            scopes = tx.footprint() if tx.reads else written
            siblings = self._compensating_siblings(tx, scopes)
            if siblings:
                found += siblings
                wake += map(_txid_of, siblings)
        return found

    def _compensating_siblings(self, tx: Transaction, scopes: set[Scope]) -> list[Blocker]:
        real = self._real
        # A compensation can only be pending where an effect was externalised: the eager
        # registrations (kept until finish) name the candidates without a walk of the group.
        candidates: dict[int, Transaction] = {}
        for scope in scopes:
            for other in real.eager_owners(scope):
                if (
                    other.group == tx.group
                    and other is not tx
                    and other.state is ABORTED
                    and not other.finished
                ):
                    candidates[other.txid] = other
        found: list[Blocker] = []
        for other in candidates.values():
            for effect in other.staged.values():
                if effect.effect_class is not REVERSIBLE:
                    continue
                for s in effect.scopes:
                    scope = self.scope(s)
                    if any(scope.overlaps(mine) for mine in scopes):
                        found.append(Blocker(other.txid, other.epoch, str(scope)))
        return found

    def try_commit(self, txid: int) -> CommitPlan | Wait | AbortPlan:
        """Commit if the frontiers allow and every read is still current.

        A speculative branch whose siblings are still live commits only as the winner that
        `resolve` picked: resolve aborts the siblings first, so none of their compensations
        can later roll back what the winner committed (siblings never wait on each other, so
        nothing else would order them).
        """
        try:
            tx = self._txs[txid]
        except KeyError:
            raise UnknownTransaction(txid) from None
        state = tx.state
        if state is not SEALED and state is not WAITING:
            raise IllegalTransition(txid, state.value, TxEvent.COMMIT.value)
        group = tx.group
        record = self._groups.get(group) if group is not None else None
        if record is not None and record.picked is None:
            live = [
                t for t, other in record.members.items() if t != txid and other.state not in TERMINAL
            ]
            if live:
                raise IllegalTransition(
                    txid,
                    state.value,
                    TxEvent.COMMIT.value,
                    f"branches {live} of group {group!r} are live; settle it with resolve",
                )
        if self._wait_for_frontiers:
            wake: list[int] = []
            found = self._blockers(tx, wake)
            if found:
                tx.state = next_state(txid, state, WAIT_EVENT)
                return self._wait(tx, found, wake)
        if self._parked or self._queued:
            self._unpark(txid)
        if record is not None and (
            record.won or (record.picked is not None and record.picked != txid)
        ):
            return self.abort(txid, _LOSING, f"{group} has a winner")
        real = self._real
        if self._stale and tx.reads:
            for scope, seen in tx.reads.items():
                if real.last_write_seq(scope) > seen:
                    return self.abort(txid, _STALE, f"{scope} was written after it was read")
        tx.state = AFTER_COMMIT[state]  # sealed or waiting, checked above
        if record is not None:
            record.won = True
        self._seq += 1
        commit_seq = self._seq
        epoch = tx.epoch
        if tx.reads:
            for scope in tx.reads:
                real.stamp(scope, epoch, write=False)
        eager = tx.eager_scopes
        stamp = real.stamp_write
        for scope in tx.effect_scopes:
            # An externalised effect became visible when it ran; a deferred one, at commit.
            stamp(scope, epoch, eager.get(scope, commit_seq) if eager else commit_seq)
        staged = tx.staged
        # Without the gate an irreversible effect ran when called: it is final, like a
        # reversible one, and must not be released (delivered) again.
        gated = not self._ungated
        if len(staged) == 1:  # one effect: its class says where it goes
            (only,) = staged.values()
            cls = only.effect_class
            if cls is BUFFERABLE:
                return CommitPlan(txid, epoch, (only,))
            if cls is IRREVERSIBLE and gated:
                return CommitPlan(txid, epoch, (), (only,))
            return CommitPlan(txid, epoch, (), (), (only,))
        apply: list[Effect] = []
        release: list[Effect] = []
        accept: list[Effect] = []
        for effect in staged.values():
            cls = effect.effect_class
            if cls is BUFFERABLE:
                apply.append(effect)
            elif cls is IRREVERSIBLE and gated:
                release.append(effect)
            else:
                accept.append(effect)
        return CommitPlan(txid, epoch, tuple(apply), tuple(release), tuple(accept))

    def abort(self, txid: int, source: AbortSource | str, detail: str = "") -> AbortPlan:
        """Abort: drop what never left, compensate externalised effects in reverse order."""
        try:
            tx = self._txs[txid]
        except KeyError:
            raise UnknownTransaction(txid) from None
        self._mark_aborted(tx, source, detail)
        return self._abort_plan(tx)

    def revoke_commit(self, txid: int, source: AbortSource | str, detail: str = "") -> AbortPlan:
        """Take back a commit decision whose plan was not carried out at all (nothing applied
        or released: its driver could not make the decision durable), and abort instead.

        The one step outside the lifecycle table, and only between `try_commit` and the
        first effect of its plan. What try_commit stamped stays: frontiers never regress,
        and a stamp that no commit backs only makes an access late or a read stale that
        need not have been, never the reverse. The abort plan is an ordinary one: the
        reversible effects that ran are compensated, the rest dropped."""
        tx = self.get(txid)
        if tx.state is not COMMITTED or tx.finished:
            raise IllegalTransition(txid, tx.state.value, "revoke", "only a commit not yet carried out")
        if source.__class__ is not AbortSource:
            source = AbortSource(source)
        tx.state = ABORTED
        tx.abort_source = source
        tx.abort_detail = detail
        if tx.group is not None and (record := self._groups.get(tx.group)) is not None:
            record.won = False  # its siblings lost already; none of them won instead
        return self._abort_plan(tx)

    def _mark_aborted(self, tx: Transaction, source: AbortSource | str, detail: str) -> None:
        if source.__class__ is not AbortSource:
            source = AbortSource(source)  # a bad source must not leave the state changed
        state = AFTER_ABORT.get(tx.state)
        if state is None:
            raise IllegalTransition(tx.txid, tx.state.value, ABORT_EVENT.value)
        tx.state = state
        tx.abort_source = source
        tx.abort_detail = detail
        if self._parked or self._queued:  # it waits for nothing any more
            self._unpark(tx.txid)

    def _abort_plan(self, tx: Transaction) -> AbortPlan:
        """Compensate externalised reversible effects (reverse order), drop what never left.
        An effect that ran and that the abort leaves in place (`_left_behind`) is in neither
        list: nothing is done to it, and `finish` reports it as residue."""
        compensate: list[Effect] = []
        drop: list[Effect] = []
        if self._leaves:
            undo = self.options.compensate_on_abort
            for e in tx.staged.values():
                cls = e.effect_class
                if cls is REVERSIBLE:
                    if undo:
                        compensate.append(e)
                elif not (self._ungated and cls is IRREVERSIBLE):
                    drop.append(e)
        else:
            for e in tx.staged.values():
                (compensate if e.effect_class is REVERSIBLE else drop).append(e)
        compensate.reverse()
        source = tx.abort_source
        assert source is not None  # marked aborted, with its source
        return AbortPlan(tx.txid, tx.epoch, source, tx.abort_detail, tuple(compensate), tuple(drop))

    # -- savepoints (nested transactions) ----------------------------------------------------
    def savepoint(self, txid: int, parent: int | None = None) -> int:
        """Open a savepoint (a nested block) of an open transaction, for `rollback_to`.

        Savepoints form a tree, and each effect belongs to the savepoint that staged it (see
        `stage`), so blocks that run at the same time (asyncio tasks, worker threads) are
        isolated: rolling one back undoes its own effects and its descendants' only. `parent`
        names the enclosing savepoint (0: the transaction itself). Without it, the new one
        nests in the innermost savepoint opened this way and not yet released, and becomes
        the one that stages naming no savepoint belong to: sequential nesting, as a caller
        that opens one block at a time sees it."""
        tx = self.get(txid)
        if tx.state is not OPEN:
            raise IllegalTransition(txid, tx.state.value, "savepoint", "only an open transaction")
        tree = tx.savepoints
        if tree is None:
            tree = tx.savepoints = {}
        sp = self._tick()
        if parent is None:
            tree[sp] = tx.current_savepoint
            tx.current_savepoint = sp
        else:
            if parent and parent not in tree:
                raise ValueError(f"transaction {txid} has no savepoint {parent}")
            tree[sp] = parent
        return sp

    def release(self, txid: int, savepoint: int) -> None:
        """A savepoint's block ended: its effects stay with the transaction (and still belong
        to it, so its parent's rollback undoes them too). If it was the current one (see
        `savepoint`), its parent is current again."""
        tx = self.get(txid)
        tree = tx.savepoints
        if tree is not None and tx.current_savepoint == savepoint:
            tx.current_savepoint = tree.get(savepoint, 0)

    def rollback_to(self, txid: int, savepoint: int) -> AbortPlan:
        """Undo what the open transaction staged in `savepoint` and the savepoints nested in
        it (a nested block that failed): those effects leave it, and the plan says which to
        compensate (reverse order) and which to drop. Effects of other savepoints (a sibling
        block running at the same time) and of the transaction itself stay, whenever they
        were staged. The transaction stays open with the rest. Its footprint keeps the
        rolled-back scopes, reads included: ordering stays conservative, never short."""
        tx = self.get(txid)
        if tx.state is not OPEN:
            raise IllegalTransition(txid, tx.state.value, "rollback", "only an open transaction")
        tree = tx.savepoints
        if tree is None or savepoint not in tree:
            raise ValueError(f"transaction {txid} has no savepoint {savepoint}")
        owners = tx.owners or {}
        inside: dict[int, bool] = {savepoint: True, 0: False}

        def within(sp: int) -> bool:
            """Whether savepoint `sp` is `savepoint` or nested in it (memoised walk up)."""
            path: list[int] = []
            while sp not in inside:
                path.append(sp)
                sp = tree.get(sp, 0)
            found = inside[sp]
            for step in path:
                inside[step] = found
            return found

        compensate: list[Effect] = []
        drop: list[Effect] = []
        kept: dict[str, Effect] = {}
        ungated = self._ungated
        for key, e in tx.staged.items():
            # An irreversible effect that ran when called (no gate) cannot be undone: it stays
            # with the transaction, accepted at its commit, residue at its abort.
            if not within(owners.get(key, 0)) or (ungated and e.effect_class is IRREVERSIBLE):
                kept[key] = e
            else:
                (compensate if e.effect_class is REVERSIBLE else drop).append(e)
                owners.pop(key, None)
        tx.staged = kept
        compensate.reverse()
        return AbortPlan(
            tx.txid, tx.epoch, AbortSource.TOOL_FAILURE, "rolled back to a savepoint",
            tuple(compensate), tuple(drop),
        )

    def resolve(self, group: str, winner: int, *, forget: bool = False) -> Resolution:
        """Speculation: abort every other live branch of `group`, then try to commit the
        winner. Losers are settled first (see `Resolution`), so the winner's commit meets
        only the siblings whose compensations are still pending. With `forget`, the records
        of losers settled on the spot are dropped, as `finish(forget=True)` does."""
        record = self._groups.get(group)
        if record is None or (win := record.members.get(winner)) is None:
            raise UnknownTransaction(f"transaction {winner} is not a branch of group {group!r}")
        if win.state is COMMITTED:
            raise IllegalTransition(winner, COMMITTED.value, "resolve")
        if win.state is ABORTED:
            # It cannot win. If a winner was picked before (a sibling that committed first
            # aborted this one), that pick stands and nothing else changes; if not, every
            # live branch loses with it.
            resolution = (
                Resolution(None)
                if self.winner(group) is not None
                else self.abort_group(group, keep=winner, forget=forget)
            )
            resolution.decision = AbortPlan(
                winner, win.epoch, win.abort_source or AbortSource.TOOL_FAILURE, win.abort_detail
            )
            return resolution
        record.picked = winner
        resolution = self.abort_group(group, keep=winner, forget=forget)
        if win.state is OPEN:
            self.seal(winner)
        resolution.decision = self.try_commit(winner)
        return resolution

    def abort_group(
        self, group: str, *, keep: int | None = None, forget: bool = False
    ) -> Resolution:
        """Abort every live branch of `group` but `keep` (they lost), in begin order."""
        resolution = Resolution(None)
        record = self._groups.get(group)
        if record is None:
            return resolution
        detail = f"lost {group}"
        settled = resolution.settled
        woken = resolution.woken
        # A copy: settling the last branch ends the group, and forgetting one leaves it.
        for tx in list(record.members.values()):
            state = AFTER_ABORT.get(tx.state) if tx.txid != keep else None
            if state is None:  # the winner, or already settled
                continue
            tx.state = state  # _mark_aborted, without its frame: the source is known good
            tx.abort_source = _LOSING
            tx.abort_detail = detail
            if self._parked or self._queued:
                self._unpark(tx.txid)
            if tx.eager_scopes:  # something was externalised: the driver compensates
                resolution.compensate.append(self._abort_plan(tx))
            else:
                settlement, now_ready = self._finish(tx, False, (), (), forget)
                settled.append(settlement)
                if now_ready:
                    woken.extend(now_ready)
        return resolution

    def finish(
        self,
        txid: int,
        *,
        residue: Sequence[Effect] = (),
        failed_applies: Sequence[Effect] = (),
        waited: float = 0.0,
        forget: bool = False,
    ) -> tuple[Settlement, list[int]]:
        """The driver has carried out the plan: deregister, advance, say who may now proceed.

        `residue` lists compensations that failed; the world under them changed for good, so
        readers of those scopes become stale. `waited` is added to the record's own. The
        settlement is also set on the record. With `forget`, the manager drops the record too,
        as `forget` would, and the record its staged effects.
        """
        try:
            tx = self._txs[txid]
        except KeyError:
            raise UnknownTransaction(txid) from None
        state = tx.state
        committed = state is COMMITTED
        if not committed and state is not ABORTED:
            raise IllegalTransition(txid, state.value, "finish")
        if tx.finished:
            raise IllegalTransition(txid, "finished", "finish")
        if waited:
            tx.waited += waited
        return self._finish(tx, committed, residue, failed_applies, forget)

    def _finish(
        self,
        tx: Transaction,
        committed: bool,
        residue: Sequence[Effect],
        failed_applies: Sequence[Effect],
        forget: bool,
    ) -> tuple[Settlement, list[int]]:
        tx.finished = True
        order = self._order
        if self._global:
            order.unregister(GLOBAL_SCOPE, tx)
        else:  # its footprint; unregistering is idempotent, so a scope read and written is fine
            if tx.reads:
                for scope in tx.reads:
                    order.unregister(scope, tx)
            for scope in tx.effect_scopes:
                order.unregister(scope, tx)
            if tx.reserved:
                for scope in tx.reserved:
                    order.unregister(scope, tx)
        real = self._real
        eager = tx.eager_scopes
        if eager:
            for scope in eager:
                real.unregister_eager(scope, tx)
        if committed:
            # Buffered and gated effects landed while the driver carried out the plan, after
            # try_commit: a read since then saw the old value, so it is stale.
            self._seq += 1
            landed = self._seq
            for scope in tx.effect_scopes:
                if scope not in eager:
                    real.stamp_visible(scope, landed)  # its epoch was stamped at commit
        if not committed and self._leaves:
            residue = self._left_behind(tx, residue)
        if residue:
            seq = self._tick()
            for effect in residue:
                for scope in effect.scopes:
                    real.stamp(self.scope(scope), 0, write=True, visible_seq=seq)
        every = self.reclaim_every
        if every:
            left = self._left
            bound = self._next_txid
            for scope in tx.effect_scopes:  # (eager scopes are effect scopes too)
                left.append((bound, scope))
            if tx.reads:
                for scope in tx.reads:
                    left.append((bound, scope))
            if tx.reserved:
                for scope in tx.reserved:
                    left.append((bound, scope))
            if residue:
                for effect in residue:
                    for scope in effect.scopes:
                        left.append((bound, self.scope(scope)))
            if len(left) >= every:
                self._reclaim()
        parking = self._parking
        if self._parked or self._queued or parking.woken:
            self._unpark(tx.txid)
        ready = parking.settled(tx.txid) if parking.watchers else []
        group = tx.group
        if group is not None:
            record = self._groups[group]
            record.unfinished -= 1
            if record.unfinished <= 0:
                del self._groups[group]
        settlement = tx.settlement = self._settlement(tx, committed, residue, failed_applies)
        if forget:  # _drop, without its frame
            if group is not None and record.unfinished > 0:
                record.members.pop(tx.txid, None)
            del self._txs[tx.txid]
            # Its holder keeps the record: not the effects' closures and payloads, which
            # nothing needs once the settlement says what became of them.
            tx.staged = {}
            tx.owners = None
        return settlement, ready

    def _horizon(self) -> int | None:
        """The id of the oldest unfinished transaction (None: there is none)."""
        begun = self._begun
        while begun and begun[0].finished:
            begun.popleft()
        return begun[0].txid if begun else None

    def _reclaim(self) -> None:
        """Drop the scopes settled work left, once nothing there can change a decision.

        Memory then follows the live work, not the work ever done. A node of the indices
        goes when no unfinished transaction is registered on it and every transaction that
        began before its last commit stamp has finished (`ScopeIndex.reclaim`): stamps are
        only ever compared with such transactions (a later one has a larger epoch and reads
        after the stamp), so no wait, stale read or late access is decided otherwise than
        with the node kept. A scope left by a transaction that finished while an older one
        is still unfinished waits here until that one has finished too."""
        horizon = self._horizon()
        left = self._left
        indices = (self._real, self._order, self._queue)
        while left and (horizon is None or left[0][0] <= horizon):
            _, scope = left.popleft()
            for index in indices:
                index.reclaim(scope, horizon)

    def tracked_scopes(self) -> int:
        """How many scope nodes the core's indices hold (what `_reclaim` bounds)."""
        return self._real.nodes + self._order.nodes + self._queue.nodes

    def _left_behind(self, tx: Transaction, residue: Sequence[Effect]) -> Sequence[Effect]:
        """`residue` (failed compensations) plus the aborted transaction's effects that ran
        and that its abort left in place: irreversible ones without the gate (they left when
        called), reversible ones without compensation. The world under them changed for
        good, as under residue, and the runtime knows it: they are residue."""
        undo = self.options.compensate_on_abort
        ungated = self._ungated
        known = {e.key for e in residue}
        left = list(residue)
        for e in tx.staged.values():
            cls = e.effect_class
            if e.key not in known and (
                (cls is REVERSIBLE and not undo) or (ungated and cls is IRREVERSIBLE)
            ):
                left.append(e)
        return left

    def _settlement(
        self,
        tx: Transaction,
        committed: bool,
        residue: Sequence[Effect],
        failed_applies: Sequence[Effect],
    ) -> Settlement:
        """One pass over the effects sorts each key into what became of it."""
        applied: tuple[str, ...]
        released: tuple[str, ...]
        accepted: tuple[str, ...]
        compensated: tuple[str, ...]
        dropped: tuple[str, ...]
        residue_out: tuple[str, ...]
        failed_out: tuple[str, ...]
        applied = released = accepted = compensated = dropped = residue_out = failed_out = ()
        staged = tx.staged
        effects = staged.values()
        if not staged:
            pass
        elif committed and not failed_applies and not tx.eager_scopes and (
            next(iter(effects)).effect_class is BUFFERABLE
            if len(staged) == 1
            else all(e.effect_class is BUFFERABLE for e in effects)
        ):
            applied = tuple(staged)  # the usual commit: every effect buffered, every one landed
        elif committed:
            failed = {e.key for e in failed_applies} if failed_applies else ()
            done: list[str] = []
            gated: list[str] = []
            final: list[str] = []
            ungated = self._ungated
            for e in effects:
                cls = e.effect_class
                if cls is REVERSIBLE or (ungated and cls is IRREVERSIBLE):
                    final.append(e.key)  # ran when called: accepted as final
                elif e.key not in failed:
                    (done if cls is BUFFERABLE else gated).append(e.key)
            applied, released, accepted = tuple(done), tuple(gated), tuple(final)
            if failed:
                failed_out = tuple(e.key for e in effects if e.key in failed)
        elif not tx.eager_scopes:
            # Nothing was externalised, so no effect is reversible: every one is dropped.
            dropped = tuple(staged)
        else:
            residue_keys = {e.key for e in residue} if residue else ()
            undone: list[str] = []
            left: list[str] = []
            for e in effects:
                if e.key in residue_keys:
                    continue  # left in place (reported below when residue is classified)
                if e.effect_class is not REVERSIBLE:
                    left.append(e.key)
                else:
                    undone.append(e.key)
            undone.reverse()
            compensated, dropped = tuple(undone), tuple(left)
            if residue_keys and self.options.classify_residue:
                residue_out = tuple(e.key for e in effects if e.key in residue_keys)
        written = tx.effect_scopes
        if len(written) == 1:
            (only,) = written
            writes: tuple[str, ...] = (only._text,)
        else:
            writes = tuple(sorted(map(str, written))) if written else ()
        return Settlement(
            tx.txid,
            tx.epoch,
            tx.trace,
            tx.group,
            "committed" if committed else "aborted",
            tx.abort_source,  # an AbortSource is a str (StrEnum): no .value property call needed
            tx.abort_detail,
            applied,
            released,
            accepted,
            compensated,
            dropped,
            residue_out,
            failed_out,
            tx.duplicates_suppressed,
            tx.waited,
            tuple(sorted(map(str, tx.reads))) if tx.reads else (),
            writes,
        )

    # -- deadlines ---------------------------------------------------------------------------
    def wait_until(self, txid: int, deadline: float | None) -> None:
        """Record that `txid` waits, and until when (None: no deadline). The number is in the
        drivers' clock units: the core only compares it with the `now` it is later given."""
        if deadline is None:
            self._deadlines.pop(txid, None)
        else:
            self._deadlines[txid] = deadline
            heap = self._deadline_heap
            heapq.heappush(heap, (deadline, txid))
            if len(heap) > 64 + 2 * len(self._deadlines):  # mostly stale entries: rebuild
                heap[:] = [(d, t) for t, d in self._deadlines.items()]
                heapq.heapify(heap)

    def done_waiting(self, txid: int) -> None:
        """`txid` no longer waits (it proceeds, or its own driver aborts it): no deadline."""
        self._deadlines.pop(txid, None)

    def next_deadline(self, txids: Iterable[int], after: float) -> float | None:
        """The earliest deadline later than `after` among these transactions (a waiter's
        blockers): when one of them may next be found expired."""
        deadlines = self._deadlines
        if not deadlines:
            return None
        found = [d for t in txids if (d := deadlines.get(t)) is not None and d > after]
        return min(found) if found else None

    def expire(self, now: float, *, but: int | None = None) -> list[AbortPlan]:
        """Abort (source `timeout`) every transaction still waiting strictly past its
        deadline: its driver is gone, or it would have aborted itself at the deadline. The
        caller carries out each plan and finishes the transaction, as for its own abort.
        `but` is the caller's own transaction: its own deadline is its own driver's business.

        Strictly past: a live driver wakes at its deadline and settles its own transaction,
        so at the deadline itself the owner always goes first."""
        deadlines = self._deadlines
        heap = self._deadline_heap
        if not deadlines or not heap or heap[0][0] >= now:
            return []
        due: list[int] = []
        kept: list[tuple[float, int]] = []
        while heap and heap[0][0] < now:
            deadline, txid = heapq.heappop(heap)
            if deadlines.get(txid) != deadline:
                continue  # stale: no longer waiting, or waiting until another time
            if txid == but:
                kept.append((deadline, txid))
            else:
                due.append(txid)
        for entry in kept:
            heapq.heappush(heap, entry)
        plans: list[AbortPlan] = []
        for txid in sorted(set(due)):  # (a deadline set twice is in the heap twice)
            deadline = deadlines.pop(txid)
            tx = self._txs.get(txid)
            if tx is None or tx.finished or tx.state in TERMINAL:
                continue  # settled, or being settled by whoever aborted it
            plans.append(
                self.abort(
                    txid,
                    AbortSource.TIMEOUT,
                    f"still waiting past its deadline ({deadline:g}); its driver did not act",
                )
            )
        return plans

    def winner(self, group: str) -> int | None:
        """The branch `resolve` picked in this live group, while that pick still stands (the
        branch has not aborted since)."""
        record = self._groups.get(group)
        picked = record.picked if record is not None else None
        if picked is None:
            return None
        tx = self._txs.get(picked)
        return picked if tx is not None and tx.state is not ABORTED else None

    def forget(self, txid: int) -> None:
        """Drop a finished transaction's record (long-running drivers call this)."""
        tx = self.get(txid)
        if not tx.finished:
            raise IllegalTransition(txid, tx.state.value, "forget")
        self._drop(tx)

    def _drop(self, tx: Transaction) -> None:
        if tx.group is not None:
            record = self._groups.get(tx.group)
            if record is not None:
                record.members.pop(tx.txid, None)
        del self._txs[tx.txid]
        tx.staged = {}  # as in _finish

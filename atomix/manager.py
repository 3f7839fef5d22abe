"""The transaction manager: the protocol's one home, as a pure state machine.

No I/O and no clock: drivers feed it events (begin, read, externalise, stage, seal,
try-commit, abort, finish) and act on the decisions it returns. Every rule about
frontiers, staleness and settlement lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

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
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.epochs import EpochAllocator
from atomix.errors import IllegalTransition, UnknownTransaction
from atomix.frontier import ScopeIndex
from atomix.scopes import CANONICAL, Scope, ScopePolicy
from atomix.transaction import TERMINAL, Transaction, TxEvent, TxState, next_state

GLOBAL_SCOPE = Scope("global", ("*",))


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """Switches of the protocol. The defaults are Atomix (`tx-full`); each other value is an
    ablation the evaluation measures, never a mode of its own re-implementing the rules."""

    scopes: ScopePolicy = field(default=CANONICAL)
    frontier: Literal["per-resource", "global"] = "per-resource"
    wait_for_frontiers: bool = True
    scope_on_read: bool = True
    abort_on_stale: bool = True
    classify_residue: bool = True


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
        self._real = ScopeIndex()  # real scopes: commit stamps and externalised effects
        self._txs: dict[int, Transaction] = {}
        self._groups: dict[str, dict[int, None]] = {}  # group -> its branches, in begin order
        self._won: set[str] = set()  # groups one of whose branches committed
        self._picked: dict[str, int] = {}  # group -> the branch resolve picked as its winner
        self._unfinished: dict[str, int] = {}  # per group, branches not yet finished
        self._waiters: dict[int, set[int]] = {}
        self._next_txid = 1
        self._seq = 0
        self._global = self.options.frontier == "global"
        self._canonical = self.options.scopes.canonical

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
        """The certified frontier of a scope (monotone)."""
        return self._real.frontier(self.scope(spec))

    def active(self) -> list[Transaction]:
        return [tx for tx in self._txs.values() if not tx.finished]

    def _tick(self) -> int:
        self._seq += 1
        return self._seq

    def _order_scope(self, scope: Scope) -> Scope:
        return GLOBAL_SCOPE if self._global else scope

    # -- begin -------------------------------------------------------------------------------
    def begin(
        self, *, group: str | None = None, trace: str | None = None, branch: int = 0
    ) -> Transaction:
        txid = self._next_txid
        self._next_txid += 1
        tx = Transaction(
            txid, self._epochs.allocate(), f"t{txid}" if trace is None else trace, group, branch
        )
        self._txs[txid] = tx
        if group is not None:
            self._groups.setdefault(group, {})[txid] = None
            self._unfinished[group] = self._unfinished.get(group, 0) + 1
        if self._global:
            # One global frontier behaves like one ordered lock: register at begin, so that
            # every later transaction waits for this one whatever it touches.
            self._register(tx, GLOBAL_SCOPE)
        return tx

    def _register(self, tx: Transaction, order_scope: Scope) -> None:
        registered = tx.registered
        known = len(registered)
        registered.add(order_scope)
        if len(registered) != known:
            self._order.register(order_scope, tx)

    # -- accesses while open -------------------------------------------------------------------
    def _check_open(self, tx: Transaction, what: str) -> AbortPlan | None:
        if tx.state is TxState.OPEN:
            return None
        if tx.state in TERMINAL:
            raise IllegalTransition(tx.txid, tx.state.value, what)
        return self.abort(tx.txid, AbortSource.SEAL_VIOLATION, f"{what} after seal")

    def _eager_conflict(
        self, tx: Transaction, scope: Scope
    ) -> tuple[list[Blocker], AbortPlan | None]:
        """Another transaction's externalised, unsettled reversible effect on this scope.

        An earlier one is waited for (its compensation could still rewrite what we would see);
        a later one or a sibling branch makes this access stale.
        """
        blockers: list[Blocker] = []
        for other in self._real.overlapping_eager(scope):
            if other is tx or other.finished:
                continue
            if (tx.group is not None and other.group == tx.group) or other.epoch > tx.epoch:
                return blockers, self.abort(
                    tx.txid,
                    AbortSource.STALE_READ,
                    f"{scope} holds an unsettled effect of epoch {other.epoch}",
                )
            blockers.append(Blocker(other.txid, other.epoch, str(scope)))
        return blockers, None

    def _late(self, tx: Transaction, scope: Scope, *, write: bool) -> AbortPlan | None:
        if not self.options.abort_on_stale:
            return None
        committed = self._real.frontier(scope) if write else self._real.last_write_epoch(scope)
        if committed > tx.epoch:
            return self.abort(
                tx.txid,
                AbortSource.STALE_READ,
                f"late access to {scope}: epoch {committed} already committed there",
            )
        return None

    def _wait(self, tx: Transaction, blockers: Sequence[Blocker]) -> Wait:
        for b in blockers:
            self._waiters.setdefault(b.txid, set()).add(tx.txid)
        return Wait(tx.txid, tuple(sorted(set(blockers), key=lambda b: (b.epoch, b.txid))))

    def read(self, txid: int, scopes: Iterable[str | Scope]) -> Proceed | Wait | AbortPlan:
        """Scope-on-read: register what the transaction is about to observe."""
        tx = self.get(txid)
        if (plan := self._check_open(tx, "read")) is not None:
            return plan
        if not self.options.scope_on_read:
            return PROCEED
        resolved = [self.scope(s) for s in scopes]
        blockers: list[Blocker] = []
        for scope in resolved:
            found, plan = self._eager_conflict(tx, scope)
            if plan is not None:
                return plan
            blockers.extend(found)
            if (plan := self._late(tx, scope, write=False)) is not None:
                return plan
        if blockers:
            return self._wait(tx, blockers)
        for scope in resolved:
            if scope not in tx.reads:
                tx.reads[scope] = self._tick()
            self._register(tx, self._order_scope(scope))
        return PROCEED

    def externalize(self, txid: int, scopes: Iterable[str | Scope]) -> Proceed | Wait | AbortPlan:
        """May a reversible effect on these scopes run now? Proceed reserves them.

        It runs only once no earlier unsettled transaction is registered there, so eager
        effects reach a resource in epoch order and no one earlier can observe them.
        """
        tx = self.get(txid)
        if (plan := self._check_open(tx, "externalize")) is not None:
            return plan
        resolved = [self.scope(s) for s in scopes]
        blockers: list[Blocker] = []
        for scope in resolved:
            found, plan = self._eager_conflict(tx, scope)
            if plan is not None:
                return plan
            if (plan := self._late(tx, scope, write=True)) is not None:
                return plan
            blockers.extend(found)
            if self.options.wait_for_frontiers:
                blockers.extend(self._earlier_holders(tx, scope))
        if blockers:
            return self._wait(tx, blockers)
        seq = self._tick()
        for scope in resolved:
            tx.eager_scopes.setdefault(scope, seq)
            tx.effect_scopes.add(scope)
            self._real.register(scope, tx, eager=True)
            self._register(tx, self._order_scope(scope))
        return PROCEED

    def stage(self, txid: int, effect: Effect) -> Proceed | AbortPlan:
        """Record an effect. Bufferable and irreversible ones stay with the runtime until
        commit; a reversible one must have been externalised on its scopes first."""
        tx = self._txs.get(txid) or self.get(txid)
        if tx.state is not TxState.OPEN and (plan := self._check_open(tx, "stage")) is not None:
            return plan
        if effect.key in tx.keys:
            tx.duplicates_suppressed += 1  # a duplicated delivery of a staged call
            return PROCEED
        if effect.effect_class is EffectClass.REVERSIBLE:
            missing = [s for s in effect.scopes if self.scope(s) not in tx.eager_scopes]
            if missing:
                raise ValueError(
                    f"effect of {effect.tool!r}: reversible effect staged without externalize() "
                    f"on {', '.join(map(str, missing))}"
                )
        else:
            scopes = effect.scopes
            if not self._canonical:
                scopes = tuple(self.scope(s) for s in scopes)
            else:
                for s in scopes:
                    if s.__class__ is not Scope:
                        # Sessions hand over resolved scopes; only other specs need parsing.
                        scopes = tuple(self.scope(s) for s in scopes)
                        break
            real = self._real
            stale = self.options.abort_on_stale
            for scope in scopes:
                if real.eager_count:
                    for other in real.overlapping_eager(scope):
                        if other is not tx and not other.finished and other.epoch > tx.epoch:
                            return self.abort(
                                tx.txid,
                                AbortSource.STALE_READ,
                                f"{scope} holds an unsettled effect of later epoch {other.epoch}",
                            )
                if stale and real.frontier(scope) > tx.epoch:
                    return self._late(tx, scope, write=True)  # type: ignore[return-value]
            mine = tx.effect_scopes
            for scope in scopes:
                known = len(mine)
                mine.add(scope)
                if len(mine) != known:  # new to the footprint (one hash instead of two)
                    self._register(tx, GLOBAL_SCOPE if self._global else scope)
        self._seq += 1
        effect.seq = self._seq
        tx.keys.add(effect.key)
        tx.effects.append(effect)
        return PROCEED

    # -- seal, commit, abort ---------------------------------------------------------------------
    def seal(self, txid: int) -> None:
        tx = self._txs.get(txid) or self.get(txid)
        tx.state = next_state(txid, tx.state, TxEvent.SEAL)

    def _earlier_holders(self, tx: Transaction, scope: Scope) -> list[Blocker]:
        return [
            Blocker(other.txid, other.epoch, str(scope))
            for other in self._order.earlier_holders(self._order_scope(scope), tx.epoch, tx.group)
        ]

    def blockers(self, txid: int) -> list[Blocker]:
        """What this transaction's commit waits for: earlier unsettled transactions on its
        footprint, and aborted branches of its own group whose compensations on its footprint
        are still pending (their before-images would otherwise overwrite what it commits).
        Neither kind can wait on it in turn: an aborted branch only finishes."""
        tx = self.get(txid)
        scopes = tx.footprint() or ({GLOBAL_SCOPE} if self._global else set())
        found: list[Blocker] = []
        for scope in scopes:
            found.extend(self._earlier_holders(tx, scope))
        if tx.group is not None:
            found.extend(self._compensating_siblings(tx, scopes))
        return found

    def _compensating_siblings(self, tx: Transaction, scopes: set[Scope]) -> list[Blocker]:
        real = self._real
        if not real.eager_count:  # nothing externalised anywhere: nothing to compensate
            return []
        # A compensation can only be pending where an effect was externalised: the eager
        # registrations (kept until finish) name the candidates without a walk of the group.
        candidates: dict[int, Transaction] = {}
        for scope in scopes:
            for other in real.overlapping_eager(scope):
                if (
                    other.group == tx.group
                    and other is not tx
                    and other.state is TxState.ABORTED
                    and not other.finished
                ):
                    candidates[other.txid] = other
        found: list[Blocker] = []
        for other in candidates.values():
            for effect in other.effects:
                if effect.effect_class is not EffectClass.REVERSIBLE:
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
        tx = self.get(txid)
        if tx.state not in (TxState.SEALED, TxState.WAITING):
            raise IllegalTransition(txid, tx.state.value, TxEvent.COMMIT.value)
        group = tx.group
        if group is not None and group not in self._picked:
            live = [
                t for t in self._groups.get(group, ())
                if t != txid and self._txs[t].state not in TERMINAL
            ]
            if live:
                raise IllegalTransition(
                    txid,
                    tx.state.value,
                    TxEvent.COMMIT.value,
                    f"branches {live} of group {group!r} are live; settle it with resolve",
                )
        if self.options.wait_for_frontiers:
            found = self.blockers(txid)
            if found:
                tx.state = next_state(txid, tx.state, TxEvent.WAIT)
                return self._wait(tx, found)
        if group is not None and (group in self._won or self._picked.get(group, txid) != txid):
            return self.abort(txid, AbortSource.LOSING_SPECULATION, f"{group} has a winner")
        if self.options.abort_on_stale:
            for scope, seen in tx.reads.items():
                if self._real.last_write_seq(scope) > seen:
                    return self.abort(
                        txid, AbortSource.STALE_READ, f"{scope} was written after it was read"
                    )
        tx.state = next_state(txid, tx.state, TxEvent.COMMIT)
        if tx.group is not None:
            self._won.add(tx.group)
        commit_seq = self._tick()
        for scope in tx.reads:
            self._real.stamp(scope, tx.epoch, write=False)
        for scope in tx.effect_scopes:
            visible = tx.eager_scopes.get(scope, commit_seq)
            self._real.stamp(scope, tx.epoch, write=True, visible_seq=visible)
        apply: list[Effect] = []
        release: list[Effect] = []
        accept: list[Effect] = []
        for effect in tx.effects:
            cls = effect.effect_class
            if cls is EffectClass.BUFFERABLE:
                apply.append(effect)
            elif cls is EffectClass.IRREVERSIBLE:
                release.append(effect)
            else:
                accept.append(effect)
        return CommitPlan(txid, tx.epoch, tuple(apply), tuple(release), tuple(accept))

    def abort(self, txid: int, source: AbortSource | str, detail: str = "") -> AbortPlan:
        """Abort: drop what never left, compensate externalised effects in reverse order."""
        tx = self._txs.get(txid) or self.get(txid)
        self._mark_aborted(tx, source, detail)
        return self._abort_plan(tx)

    def _mark_aborted(self, tx: Transaction, source: AbortSource | str, detail: str) -> None:
        if source.__class__ is not AbortSource:
            source = AbortSource(source)  # a bad source must not leave the state changed
        tx.state = next_state(tx.txid, tx.state, TxEvent.ABORT)
        tx.abort_source = source  # type: ignore[assignment]
        tx.abort_detail = detail

    def _abort_plan(self, tx: Transaction) -> AbortPlan:
        compensate: list[Effect] = []
        drop: list[Effect] = []
        for e in tx.effects:
            (compensate if e.effect_class is EffectClass.REVERSIBLE else drop).append(e)
        compensate.reverse()
        return AbortPlan(
            tx.txid, tx.epoch, tx.abort_source, tx.abort_detail, tuple(compensate), tuple(drop)  # type: ignore[arg-type]
        )

    def resolve(self, group: str, winner: int, *, forget: bool = False) -> Resolution:
        """Speculation: abort every other live branch of `group`, then try to commit the
        winner. Losers are settled first (see `Resolution`), so the winner's commit meets
        only the siblings whose compensations are still pending. With `forget`, the records
        of losers settled on the spot are dropped, as `finish(forget=True)` does."""
        members = self._groups.get(group, {})
        if winner not in members:
            raise UnknownTransaction(f"transaction {winner} is not a branch of group {group!r}")
        if self._txs[winner].state is TxState.COMMITTED:
            raise IllegalTransition(winner, TxState.COMMITTED.value, "resolve")
        win = self._txs[winner]
        if win.state is TxState.ABORTED:
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
        self._picked[group] = winner
        resolution = self.abort_group(group, keep=winner, forget=forget)
        if win.state is TxState.OPEN:
            self.seal(winner)
        resolution.decision = self.try_commit(winner)
        return resolution

    def abort_group(
        self, group: str, *, keep: int | None = None, forget: bool = False
    ) -> Resolution:
        """Abort every live branch of `group` but `keep` (they lost), in begin order."""
        resolution = Resolution(None)
        detail = f"lost {group}"
        for txid in list(self._groups.get(group, ())):  # settling the last one ends the group
            tx = self._txs[txid]
            if txid == keep or tx.state in TERMINAL:
                continue
            self._mark_aborted(tx, AbortSource.LOSING_SPECULATION, detail)
            if tx.eager_scopes:  # something was externalised: the driver compensates
                resolution.compensate.append(self._abort_plan(tx))
            else:
                settlement, woken = self.finish(txid, forget=forget)
                resolution.settled.append(settlement)
                resolution.woken.extend(woken)
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
        readers of those scopes become stale. With `forget`, the record is dropped too (the
        settlement is all that remains), as `forget` would.
        """
        tx = self._txs.get(txid) or self.get(txid)
        state = tx.state
        committed = state is TxState.COMMITTED
        if not committed and state is not TxState.ABORTED:
            raise IllegalTransition(txid, state.value, "finish")
        if tx.finished:
            raise IllegalTransition(txid, "finished", "finish")
        tx.finished = True
        order = self._order
        for scope in tx.registered:
            order.unregister(scope, tx)
        real = self._real
        eager = tx.eager_scopes
        for scope in eager:
            real.unregister(scope, tx)
        if committed:
            # Buffered and gated effects landed while the driver carried out the plan, after
            # try_commit: a read since then saw the old value, so it is stale.
            self._seq += 1
            landed = self._seq
            for scope in tx.effect_scopes:
                if scope not in eager:
                    real.stamp(scope, tx.epoch, write=True, visible_seq=landed)
        if residue:
            seq = self._tick()
            for effect in residue:
                for scope in effect.scopes:
                    real.stamp(self.scope(scope), 0, write=True, visible_seq=seq)
        waiters = self._waiters.pop(txid, None) if self._waiters else None
        woken = sorted(waiters) if waiters else []
        group = tx.group
        if group is not None:
            left = self._unfinished.get(group, 0) - 1
            if left <= 0:
                self._unfinished.pop(group, None)
                self._groups.pop(group, None)
                self._won.discard(group)
                self._picked.pop(group, None)
            else:
                self._unfinished[group] = left
        settlement = self._settlement(tx, committed, residue, failed_applies, waited)
        if forget:
            self._drop(tx)
        return settlement, woken

    def _settlement(
        self,
        tx: Transaction,
        committed: bool,
        residue: Sequence[Effect],
        failed_applies: Sequence[Effect],
        waited: float,
    ) -> Settlement:
        """One pass over the effects sorts each key into what became of it."""
        applied: tuple[str, ...] = ()
        released: tuple[str, ...] = ()
        accepted: tuple[str, ...] = ()
        compensated: tuple[str, ...] = ()
        dropped: tuple[str, ...] = ()
        residue_out: tuple[str, ...] = ()
        failed_out: tuple[str, ...] = ()
        effects = tx.effects
        if committed:
            failed = {e.key for e in failed_applies} if failed_applies else ()
            done: list[str] = []
            gated: list[str] = []
            final: list[str] = []
            for e in effects:
                cls = e.effect_class
                if cls is EffectClass.REVERSIBLE:
                    final.append(e.key)
                elif e.key not in failed:
                    (done if cls is EffectClass.BUFFERABLE else gated).append(e.key)
            applied, released, accepted = tuple(done), tuple(gated), tuple(final)
            if failed:
                failed_out = tuple(e.key for e in effects if e.key in failed)
        elif effects:
            residue_keys = {e.key for e in residue} if residue else ()
            undone: list[str] = []
            left: list[str] = []
            for e in effects:
                if e.effect_class is not EffectClass.REVERSIBLE:
                    left.append(e.key)
                elif e.key not in residue_keys:
                    undone.append(e.key)
            undone.reverse()
            compensated, dropped = tuple(undone), tuple(left)
            if residue_keys and self.options.classify_residue:
                residue_out = tuple(e.key for e in effects if e.key in residue_keys)
        written = tx.effect_scopes
        if not written:
            writes: tuple[str, ...] = ()
        elif len(written) == 1:
            for only in written:
                writes = (only._text,)
        else:
            writes = tuple(sorted(map(str, written)))
        source = tx.abort_source
        return Settlement(
            tx.txid,
            tx.epoch,
            tx.trace,
            tx.group,
            "committed" if committed else "aborted",
            source,  # an AbortSource is a str (StrEnum): no .value property call needed
            tx.abort_detail,
            applied,
            released,
            accepted,
            compensated,
            dropped,
            residue_out,
            failed_out,
            tx.duplicates_suppressed,
            waited,
            tuple(sorted(map(str, tx.reads))) if tx.reads else (),
            writes,
        )

    def winner(self, group: str) -> int | None:
        """The branch `resolve` picked in this live group, while that pick still stands (the
        branch has not aborted since)."""
        picked = self._picked.get(group)
        if picked is None:
            return None
        tx = self._txs.get(picked)
        return picked if tx is not None and tx.state is not TxState.ABORTED else None

    def forget(self, txid: int) -> None:
        """Drop a finished transaction's record (long-running drivers call this)."""
        tx = self.get(txid)
        if not tx.finished:
            raise IllegalTransition(txid, tx.state.value, "forget")
        self._drop(tx)

    def _drop(self, tx: Transaction) -> None:
        if tx.group is not None:
            members = self._groups.get(tx.group)
            if members is not None:
                members.pop(tx.txid, None)
        del self._txs[tx.txid]

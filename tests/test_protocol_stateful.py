"""A stateful property test of the protocol: random interleavings of up to six concurrent
transactions over hierarchical, overlapping scopes, driving the TransactionManager directly.

The test is the driver and owns the world: a dict from leaf scope to value (rows of the
tables `kv:t` and `kv:u`, and mailboxes) and a list of sent messages. It applies CommitPlans
and runs compensations itself, through closures it put in the Effects, and it keeps its own
log of what happened (every value observed by a read, every write that reached the world,
every commit with its epoch). The invariants are judged from that log and that world, never
from the manager's bookkeeping.

The driver's state and its own expectations are ProtocolModel (tests/protocol_model.py); the
rules and the invariants are here.
"""

from __future__ import annotations

import os

from hypothesis import settings, target
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from protocol_model import (
    ALL_SCOPES,
    COVERED,
    INITIAL,
    LEAVES,
    MAILBOXES,
    READABLE,
    RUNS,
    SCOPE,
    WRITABLE,
    Event,
    ProtocolModel,
    TxModel,
    _has_cycle,
    overlaps,
)

from atomix.decisions import AbortPlan, CommitPlan, Proceed, Settlement, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import IllegalTransition, UnknownTransaction
from atomix.scopes import Scope

MAX_LIVE = 6  # concurrent, unsettled transactions at most
MAX_OPEN = 4  # of which still open (so that open ones get work before new ones begin)
GROUPS = (None, None, None, None, "g1", "g2")
VIOLATE = st.sampled_from([False] * 19 + [True])  # now and then, an access after seal
FAIL = st.sampled_from([False, False, False, True])  # an apply or a compensation fails
AND_FINISH = st.booleans()  # settle the plan at once, or leave it pending for a while
EVENTS = ("seal", "try_commit", "abort", "read", "stage", "externalize", "finish", "forget")


class ProtocolMachine(ProtocolModel):
    """The rules that drive the TransactionManager, and the invariants judged from the
    driver's own log and world."""

    # -- rules -----------------------------------------------------------------------------------
    @initialize(groups=st.lists(st.sampled_from(GROUPS), min_size=2, max_size=4))
    def start(self, groups: list[str | None]) -> None:
        for group in groups:
            self.begin(group)

    @precondition(
        lambda self: len(self.live()) < MAX_LIVE
        and sum(m.state == "open" for m in self.txs.values()) < MAX_OPEN
    )
    @rule(group=st.sampled_from(GROUPS))
    def begin(self, group: str | None) -> None:
        tx = self.mgr.begin(group=group)
        assert all(tx.epoch > m.epoch for m in self.txs.values()), "epochs must increase"
        assert tx.txid not in self.txs
        self.txs[tx.txid] = TxModel(tx.txid, tx.epoch, group)
        if group is not None:
            self.groups.setdefault(group, []).append(tx.txid)

    def accessor(self, i: int, after_seal: bool) -> TxModel:
        """An open transaction; now and then (after_seal) a sealed one: a seal violation."""
        opened = [t for t, m in self.txs.items() if m.state == "open"]
        sealed = [t for t, m in self.txs.items() if m.state in ("sealed", "waiting")]
        return self.pick(sealed if (after_seal and sealed) or not opened else opened, i)

    def has_live_tx(self) -> bool:
        return any(m.state in ("open", "sealed", "waiting") for m in self.txs.values())

    @precondition(has_live_tx)
    @rule(i=st.integers(0, 63), scope=st.sampled_from(READABLE), after_seal=VIOLATE)
    def read(self, i: int, scope: str, after_seal: bool) -> None:
        self._read(self.accessor(i, after_seal), scope, None)

    @precondition(has_live_tx)
    @rule(
        i=st.integers(0, 63),
        scope=st.sampled_from(WRITABLE),
        value=st.integers(0, 9),
        after_seal=VIOLATE,
    )
    def read_modify_write(self, i: int, scope: str, value: int, after_seal: bool) -> None:
        """What agents do most: observe a scope, then buffer a new value for it."""
        self._read(self.accessor(i, after_seal), scope, value)

    def _read(self, tx: TxModel, scope: str, then_write: int | None) -> None:
        expected = self.read_blockers(tx, scope)
        self.note_access(tx, scope)
        decision = self.mgr.read(tx.txid, [scope])
        if tx.state != "open":
            self.aborted(tx, decision, AbortSource.SEAL_VIOLATION)
        elif isinstance(decision, Proceed):
            self.unpark(tx)
            tx.footprint.add(scope)
            self.observe(tx.txid, scope)
            if then_write is not None:
                key = f"{tx.txid}:rmw{self.serial}"
                self._stage(tx, self.buffered_write(tx.txid, scope, then_write, key))
        elif isinstance(decision, Wait):
            # only an earlier eager effect or queued externalisation of another group holds
            # a read up: never another read
            self.check_wait(tx, decision, expected)
        else:
            self.aborted(tx, decision, AbortSource.STALE_READ)

    def _stage(self, tx: TxModel, effect: Effect) -> None:
        duplicate = effect.key in tx.keys
        for scope in effect.scopes:
            self.note_access(tx, str(scope))
        decision = self.mgr.stage(tx.txid, effect)
        if tx.state != "open":
            self.aborted(tx, decision, AbortSource.SEAL_VIOLATION)
        elif isinstance(decision, Proceed):
            if duplicate:
                tx.duplicates += 1
            else:
                tx.keys.add(effect.key)
                tx.staged.append(effect)
                tx.footprint.update(str(s) for s in effect.scopes)
                tx.writes.update(str(s) for s in effect.scopes)
        else:
            assert effect.effect_class is not EffectClass.REVERSIBLE
            self.aborted(tx, decision, AbortSource.STALE_READ)

    @precondition(has_live_tx)
    @rule(
        i=st.integers(0, 63),
        to=st.sampled_from(WRITABLE + MAILBOXES),
        value=st.integers(0, 9),
        key=st.integers(0, 2),
        after_seal=VIOLATE,
    )
    def stage(self, i: int, to: str, value: int, key: int, after_seal: bool) -> None:
        """Stage a buffered write to a row or table, or queue a mail (irreversible) at the
        gate. A small key space per transaction: duplicated deliveries happen."""
        tx = self.accessor(i, after_seal)
        if to not in MAILBOXES:
            self._stage(tx, self.buffered_write(tx.txid, to, value, f"{tx.txid}:w{key}"))
            return
        version = self.new_version(tx.txid, "irreversible", value)
        ekey = f"{tx.txid}:m{key}"

        def release() -> None:
            self.sent.append((tx.txid, ekey, to, version))
            self.write_world(tx.txid, to, version)

        self._stage(tx, Effect("send", EffectClass.IRREVERSIBLE, (SCOPE[to],), ekey, apply=release))

    @precondition(has_live_tx)
    @rule(
        i=st.integers(0, 63),
        scope=st.sampled_from(WRITABLE),
        value=st.integers(0, 9),
        after_seal=VIOLATE,
        read_first=st.booleans(),
    )
    def externalize_write(
        self, i: int, scope: str, value: int, after_seal: bool, read_first: bool = False
    ) -> None:
        """A reversible write; with `read_first`, a read-modify-write tool that observes the
        scope in the same step (`externalize(..., reads=...)`): the write's wait (for every
        earlier holder) covers the read's."""
        tx = self.accessor(i, after_seal)
        self.note_access(tx, scope)
        expected = self.expected_blockers(tx, {scope}, {scope})
        decision = self.mgr.externalize(tx.txid, [scope], reads=[scope] if read_first else ())
        if tx.state != "open":
            self.aborted(tx, decision, AbortSource.SEAL_VIOLATION)
            return
        if isinstance(decision, Wait):
            self.check_wait(tx, decision, expected)
            self.queued[tx.txid] = {scope}
            return
        if isinstance(decision, AbortPlan):
            self.aborted(tx, decision, AbortSource.STALE_READ)
            return
        assert isinstance(decision, Proceed)
        self.unpark(tx)
        if read_first:
            self.observe(tx.txid, scope)
        tx.eager.add(scope)
        tx.footprint.add(scope)
        tx.writes.add(scope)
        # the driver runs the reversible effect now, remembering what it overwrote
        version = self.new_version(tx.txid, "reversible", value)
        before = {leaf: self.world[leaf] for leaf in COVERED[scope]}
        for leaf in COVERED[scope]:
            self.write_world(tx.txid, leaf, version)

        def compensate() -> None:
            for leaf, old in before.items():
                self.world[leaf] = old

        effect = Effect(
            "book", EffectClass.REVERSIBLE, (SCOPE[scope],), f"{tx.txid}:r{self.serial}",
            compensate=compensate,
        )
        self._stage(tx, effect)
        assert tx.staged[-1] is effect

    @precondition(lambda self: any(m.state == "open" for m in self.txs.values()))
    @rule(i=st.integers(0, 63), and_commit=st.booleans(), and_finish=AND_FINISH)
    def seal(self, i: int, and_commit: bool, and_finish: bool) -> None:
        # a driver seals once the agent has done something; an empty one only if all are
        opened = [t for t, m in self.txs.items() if m.state == "open"]
        tx = self.pick([t for t in opened if self.txs[t].footprint] or opened, i)
        self.mgr.seal(tx.txid)
        tx.state = "sealed"
        if and_commit and self.may_commit(tx):  # what a driver's commit() does
            self.decided(tx, self.mgr.try_commit(tx.txid))
            self.maybe_settle(tx, and_finish)

    def maybe_settle(self, tx: TxModel, now: bool) -> None:
        if now and tx.txid in self.settleable():
            self.settle(tx)

    def live_siblings(self, tx: TxModel) -> list[int]:
        if tx.group is None:
            return []
        return [
            m for m in self.groups.get(tx.group, ())
            if m != tx.txid and self.txs[m].state in ("open", "sealed", "waiting")
        ]

    def may_commit(self, tx: TxModel) -> bool:
        """A speculative branch commits through resolve (which aborts its siblings first) or,
        once no sibling is live, on its own. The core refuses anything else, see
        `branch_alone_is_refused`; the only-one-winner guard is unit-tested in
        test_manager_speculation.py."""
        return (
            tx.group is None or tx.resolved or tx.group in self.picked or not self.live_siblings(tx)
        )

    def lone_branches(self) -> list[int]:
        return [
            t for t, m in self.txs.items()
            if m.state in ("sealed", "waiting") and not self.may_commit(m)
        ]

    @precondition(lone_branches)
    @rule(i=st.integers(0, 63))
    def branch_alone_is_refused(self, i: int) -> None:
        """Committing one branch while a sibling is live could let that sibling's compensation
        roll it back later: the core raises and changes nothing."""
        tx = self.pick(self.lone_branches(), i)
        self.expect_illegal(tx, lambda: self.mgr.try_commit(tx.txid))

    def committable(self) -> list[int]:
        return [
            t for t, m in self.txs.items() if m.state in ("sealed", "waiting") and self.may_commit(m)
        ]

    @precondition(committable)
    @rule(i=st.integers(0, 63), and_finish=AND_FINISH)
    def try_commit(self, i: int, and_finish: bool) -> None:
        tx = self.pick(self.committable(), i)
        self.decided(tx, self.mgr.try_commit(tx.txid))
        self.maybe_settle(tx, and_finish)

    @precondition(has_live_tx)
    @rule(i=st.integers(0, 63), source=st.sampled_from(list(AbortSource)), and_finish=AND_FINISH)
    def abort(self, i: int, source: AbortSource, and_finish: bool) -> None:
        pool = [t for t, m in self.txs.items() if m.state in ("open", "sealed", "waiting")]
        tx = self.pick(pool, i)
        self.aborted(tx, self.mgr.abort(tx.txid, source, "test"), source)
        self.maybe_settle(tx, and_finish)

    def settleable(self) -> list[int]:
        """Transactions with a plan to carry out, in any order: the core makes a winning
        branch wait for a losing sibling's pending compensations on its scopes."""
        return [
            t for t, m in self.txs.items() if m.state in ("committed", "aborted") and not m.finished
        ]

    @precondition(settleable)
    @rule(i=st.integers(0, 63), fail=FAIL, wake=st.booleans(), forget=st.booleans())
    def finish(self, i: int, fail: bool, wake: bool, forget: bool) -> None:
        """Settle a plan; then maybe forget some finished transaction (long-running drivers do)."""
        self.settle(self.pick(self.settleable(), i), fail, wake)
        done = [t for t, m in self.txs.items() if m.finished and not m.forgotten]
        if forget:
            tx = self.pick(done, i // 2)
            self.mgr.forget(tx.txid)
            tx.forgotten = True

    def settle(self, tx: TxModel, fail: bool = False, wake: bool = True) -> None:
        """Carry out the transaction's plan on the world, then tell the manager; with `wake`,
        retry the commits it woke at once, as a driver does (else they retry later)."""
        plan = tx.plan
        failed: list[Effect] = []
        residue: list[Effect] = []
        done: list[str] = []
        if isinstance(plan, CommitPlan):
            for effect in plan.apply + plan.release:  # the driver applies and releases
                if fail and not failed:
                    failed.append(effect)  # this one never landed
                    continue
                assert effect.apply is not None
                effect.apply()
                done.append(effect.key)
        else:
            assert isinstance(plan, AbortPlan)
            for effect in plan.compensate:  # in the plan's (reverse) order
                if fail and not residue:
                    residue.append(effect)  # this compensation failed
                    continue
                assert effect.compensate is not None
                effect.compensate()
                done.append(effect.key)
        settlement, woken = self.mgr.finish(tx.txid, residue=residue, failed_applies=failed)
        tx.finished = True
        tx.finish_time = self.tick()
        if residue:
            for leaf in sorted({leaf for s in tx.eager for leaf in COVERED[s]}):
                self.events.append(Event(tx.finish_time, tx.txid, "x", leaf, self.world[leaf]))
                if self.world[leaf][0] == tx.txid:  # (a later compensation may have undone it)
                    self.residue.add((leaf, self.world[leaf]))
        self.unpark(tx)
        assert set(woken) == self.woken_by(tx.txid)
        for txid in woken if wake else ():
            waiter = self.txs[txid]
            if waiter.state == "waiting" and self.may_commit(waiter):
                self.decided(waiter, self.mgr.try_commit(txid))
        assert settlement.outcome == tx.state and settlement.epoch == tx.epoch
        assert settlement.duplicates_suppressed == tx.duplicates
        assert settlement.failed_applies == tuple(e.key for e in failed)
        if isinstance(plan, CommitPlan):
            assert settlement.applied == tuple(e.key for e in plan.apply if e.key in done)
            assert settlement.released == tuple(e.key for e in plan.release if e.key in done)
            assert settlement.accepted == tuple(e.key for e in plan.accept)
            assert settlement.compensated == settlement.dropped == settlement.residue == ()
        else:
            assert settlement.abort_source == plan.source.value
            assert settlement.compensated == tuple(done)
            assert settlement.residue == tuple(e.key for e in residue)
            assert settlement.dropped == tuple(e.key for e in plan.drop)
            assert settlement.applied == settlement.released == settlement.accepted == ()
        if tx.group is not None and all(self.txs[m].finished for m in self.groups[tx.group]):
            del self.groups[tx.group]
            self.picked.pop(tx.group, None)

    def settled_by_resolve(self, tx: TxModel, settlement: Settlement) -> set[int]:
        """A loser with nothing externalised, settled inside resolve: its record must say
        that everything it staged or queued was dropped. Returns who waited on it."""
        assert settlement.outcome == "aborted" and settlement.epoch == tx.epoch
        assert settlement.abort_source == AbortSource.LOSING_SPECULATION.value
        assert settlement.dropped == tuple(e.key for e in tx.staged)
        assert settlement.compensated == settlement.residue == settlement.applied == ()
        assert settlement.duplicates_suppressed == tx.duplicates
        tx.state = "aborted"
        tx.finished = True
        tx.finish_time = self.tick()
        self.unpark(tx)
        return self.woken_by(tx.txid)

    def live_groups(self) -> list[str]:
        return sorted(
            g for g, members in self.groups.items()
            if any(self.txs[m].state in ("open", "sealed", "waiting") for m in members)
        )

    @precondition(lambda self: self.live_groups())
    @rule(g=st.integers(0, 7), w=st.integers(0, 63), any_member=st.sampled_from([False] * 4 + [True]))
    def resolve(self, g: int, w: int, any_member: bool) -> None:
        """Pick a winner: a live branch, or now and then any member (aborted, committed,
        forgotten: the manager must cope)."""
        groups = self.live_groups()
        group = groups[g % len(groups)]
        members = self.groups[group]
        live = [m for m in members if self.txs[m].state in ("open", "sealed", "waiting")]
        pool = members if any_member else live
        winner = self.txs[pool[w % len(pool)]]
        if winner.forgotten:
            try:
                self.mgr.resolve(group, winner.txid)
            except UnknownTransaction:
                return
            raise AssertionError("resolve accepted a forgotten winner")
        if winner.state == "committed":
            states = {m: self.state_of(self.txs[m]) for m in members if not self.txs[m].forgotten}
            try:
                self.mgr.resolve(group, winner.txid)
            except IllegalTransition:
                pass
            else:
                raise AssertionError("resolve re-committed a committed winner")
            assert states == {m: self.state_of(self.txs[m]) for m in states}
            return
        picked = self.picked.get(group)
        standing = picked is not None and self.txs[picked].state != "aborted"
        losers = [
            self.txs[m] for m in members
            if m != winner.txid and self.txs[m].state not in ("committed", "aborted")
            # an aborted member cannot win, and it leaves a standing pick alone
            and not (winner.state == "aborted" and standing)
        ]
        res = self.mgr.resolve(group, winner.txid)
        decision = res.decision
        if winner.state != "aborted":  # an aborted member cannot win, nor displace a pick
            self.picked[group] = winner.txid
        # losers that externalised something go to the driver; the rest settle on the spot
        assert [p.txid for p in res.compensate] == [m.txid for m in losers if m.eager]
        assert [x.txid for x in res.settled] == [m.txid for m in losers if not m.eager]
        for plan in res.compensate:
            self.aborted(self.txs[plan.txid], plan, AbortSource.LOSING_SPECULATION)
        woken: set[int] = set()
        for settlement in res.settled:
            woken |= self.settled_by_resolve(self.txs[settlement.txid], settlement)
        assert set(res.woken) == woken
        if all(self.txs[m].finished for m in members):  # a finished winner: the group ends
            del self.groups[group]
            self.picked.pop(group, None)
        if winner.state == "aborted":
            assert isinstance(decision, AbortPlan) and decision.txid == winner.txid
            return
        winner.resolved = True
        if winner.state == "open":
            winner.state = "sealed"
        self.decided(winner, decision)

    def known(self) -> list[int]:
        return [t for t, m in self.txs.items() if not m.forgotten]

    @precondition(known)
    @rule(i=st.integers(0, 63), event=st.sampled_from(EVENTS))
    def illegal_event(self, i: int, event: str) -> None:
        """An event the transaction's state does not allow raises and changes nothing."""
        tx = self.pick(self.known(), i)
        mgr, txid, state = self.mgr, tx.txid, tx.state
        calls = {
            "seal": (state != "open", lambda: mgr.seal(txid)),
            "try_commit": (state not in ("sealed", "waiting"), lambda: mgr.try_commit(txid)),
            "abort": (state in ("committed", "aborted"), lambda: mgr.abort(txid, "timeout")),
            "read": (state in ("committed", "aborted"), lambda: mgr.read(txid, ["kv:t"])),
            "stage": (
                state in ("committed", "aborted"),
                lambda: mgr.stage(txid, self.buffered_write(txid, "kv:t", 0, f"{txid}:w0")),
            ),
            "externalize": (state in ("committed", "aborted"), lambda: mgr.externalize(txid, ["kv:t"])),
            "finish": (state not in ("committed", "aborted") or tx.finished, lambda: mgr.finish(txid)),
            "forget": (not tx.finished, lambda: mgr.forget(txid)),
        }
        illegal, call = calls[event]
        if illegal:
            self.expect_illegal(tx, call)

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def mirrors_agree(self) -> None:
        RUNS["steps"] += 1
        for tx in self.txs.values():
            if not tx.forgotten:
                real = self.mgr.get(tx.txid)
                assert real.state.value == tx.state and real.finished == tx.finished

    @invariant()
    def frontiers_never_regress(self) -> None:
        for scope in ALL_SCOPES:
            now = self.mgr.frontier(scope)
            assert now >= self.frontiers[scope], (scope, self.frontiers[scope], now)
            self.frontiers[scope] = now

    @invariant()
    def blockers_are_exactly_the_earlier_overlapping_unsettled(self) -> None:
        for tx in self.txs.values():
            if tx.finished:
                continue
            got = self.mgr.blockers(tx.txid)
            siblings = self.compensating_siblings(tx, tx.footprint)
            assert all(b.epoch < tx.epoch or b.txid in siblings for b in got)
            # liveness (no blockers once earlier overlapping work settled) and safety (every
            # unsettled earlier overlapping transaction of another group is one)
            assert {b.txid for b in got} == self.expected_blockers(tx, tx.footprint, tx.writes)

    @invariant()
    def aborted_effects_never_visible(self) -> None:
        for leaf, (writer, cls, _, _) in self.world.items():
            if writer == 0:
                continue
            w = self.txs[writer]
            if cls in ("bufferable", "irreversible"):
                assert w.state == "committed", f"{leaf} shows a {cls} effect of {w.state} tx {writer}"
            elif w.state == "aborted" and w.finished:
                assert (leaf, self.world[leaf]) in self.residue, f"{leaf}: uncompensated {writer}"
        for writer, _, _, _ in self.sent:
            assert self.txs[writer].state == "committed", f"aborted tx {writer} sent mail"

    @invariant()
    def world_holds_the_last_committed_write(self) -> None:
        """Once no unsettled eager effect covers a leaf, it holds the last committed (or
        residue) value written there: nothing committed was lost or rolled back."""
        for leaf in LEAVES:
            if any(
                not m.finished and any(leaf in COVERED[s] for s in m.eager)
                for m in self.txs.values()
            ):
                continue
            last = INITIAL
            for e in self.events:
                if e.leaf == leaf and (
                    (e.kind == "w" and self.txs[e.txid].state == "committed") or e.kind == "x"
                ):
                    last = e.version
            assert self.world[leaf] == last, f"{leaf} holds {self.world[leaf]}, last write {last}"

    @invariant()
    def committed_history_is_serialisable_in_epoch_order(self) -> None:
        epochs = {txid: epoch for _, txid, epoch in self.commits}
        assert len(epochs) == len(self.commits), "a transaction committed twice"
        edges = self.conflict_edges(epochs)
        for a, b in edges:
            if a in epochs and b in epochs:
                assert epochs[a] < epochs[b], f"conflict edge {a}->{b} against epoch order {edges}"
        assert not _has_cycle(edges), f"conflict cycle in {sorted(map(str, edges))}"

    def teardown(self) -> None:
        # steer the search towards histories with many conflicts between committed work
        edges = self.conflict_edges({txid: epoch for _, txid, epoch in self.commits})
        target(float(len(edges)), label="conflict edges")
        target(float(self.stale_aborts), label="stale aborts")
        target(float(self.late_accesses), label="late accesses")


ProtocolMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ATOMIX_PBT_EXAMPLES", 500)),
    stateful_step_count=40,
    deadline=None,
)
TestProtocol = ProtocolMachine.TestCase


def test_cycle_search() -> None:
    assert _has_cycle({(1, 2), (2, 3), (3, 1)})
    assert not _has_cycle({(1, 2), (2, 3), (1, 3)})
    assert _has_cycle({(1, 1)})


def test_scopes_overlap_as_the_machine_assumes() -> None:
    assert COVERED["kv:t"] == ("kv:t:1", "kv:t:2")
    assert overlaps("kv:t", "kv:t:1") and overlaps("kv:t:2", "kv:t")
    assert not overlaps("kv:t:1", "kv:t:2") and not overlaps("kv:t", "kv:u:1")
    assert isinstance(SCOPE["kv:t"], Scope)


def test_machine_replays_a_residue_undone_by_an_older_compensation() -> None:
    """A fixed interleaving through the machine's own rules: the newer effect's compensation
    fails (residue) and the older one's then restores the value from before both."""
    m = ProtocolMachine()
    m.start([None, None])
    m.externalize_write(0, "kv:t", 1, False)
    m.externalize_write(0, "kv:t", 2, False)
    m.abort(0, AbortSource.TOOL_FAILURE, False)
    m.finish(0, True, True, False)
    assert m.world["kv:t:1"] == INITIAL and not m.residue
    m.read(0, "kv:t", False)
    m.seal(0, True, True)
    assert m.txs[2].state == "committed"
    for name in INVARIANTS:
        getattr(m, name)()


INVARIANTS = (
    "mirrors_agree",
    "frontiers_never_regress",
    "blockers_are_exactly_the_earlier_overlapping_unsettled",
    "aborted_effects_never_visible",
    "world_holds_the_last_committed_write",
    "committed_history_is_serialisable_in_epoch_order",
)

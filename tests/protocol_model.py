"""The driver's side of the stateful protocol test (test_protocol_stateful.py).

The driver owns the world (a dict from leaf scope to value, and the sent messages) and keeps
its own log of what happened. ProtocolModel is that driver's state and what it computes by
itself: the world and the log, which transactions a decision must name as blockers, what a
plan must hold, and the conflict graph of the committed history. ProtocolMachine, in the test
file, adds the rules that drive the TransactionManager and the invariants judged from this
log and world.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis.stateful import RuleBasedStateMachine

from atomix.decisions import AbortPlan, CommitPlan, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import IllegalTransition
from atomix.manager import TransactionManager
from atomix.scope_parsing import parse_scope

# Leaves hold values; a table scope covers its rows.
LEAVES = ("kv:t:1", "kv:t:2", "kv:u:1", "mail:a", "mail:b")
READABLE = ("kv:t", "kv:t:1", "kv:t:2", "kv:u:1", "mail:a")
WRITABLE = ("kv:t", "kv:t:1", "kv:t:2", "kv:u:1")
MAILBOXES = ("mail:a", "mail:b")
ALL_SCOPES = tuple(dict.fromkeys(READABLE + WRITABLE + MAILBOXES + ("kv:u",)))
SCOPE = {s: parse_scope(s) for s in ALL_SCOPES}
COVERED = {s: tuple(leaf for leaf in LEAVES if SCOPE[s].covers(SCOPE[leaf])) for s in ALL_SCOPES}
INITIAL = (0, "initial", 0, 0)  # (writer txid, class, serial, value)

RUNS = {"examples": 0, "steps": 0}  # reported by the test run, never printed


def overlaps(a: str, b: str) -> bool:
    return SCOPE[a].overlaps(SCOPE[b])


@dataclass
class TxModel:
    """The driver's own record of one transaction."""

    txid: int
    epoch: int
    group: str | None
    state: str = "open"
    finished: bool = False
    forgotten: bool = False
    footprint: set[str] = field(default_factory=set)  # scopes the tx was told it may use
    writes: set[str] = field(default_factory=set)  # of which it writes (staged, externalised)
    eager: set[str] = field(default_factory=set)  # scopes with its externalised effects
    keys: set[str] = field(default_factory=set)
    staged: list[Effect] = field(default_factory=list)  # first of each key, in order
    duplicates: int = 0
    resolved: bool = False  # a branch picked as its group's winner
    plan: CommitPlan | AbortPlan | None = None
    finish_time: int | None = None


@dataclass(frozen=True)
class Event:
    time: int
    txid: int
    # "r": a value observed; "w": a value written into the world; "x": what a failed
    # compensation left behind (the world is then what it is, residue included)
    kind: str
    leaf: str
    version: tuple[int, str, int, int]


class ProtocolModel(RuleBasedStateMachine):
    """The driver's world, its log, and the expectations it computes itself; the rules and
    invariants are ProtocolMachine's (test_protocol_stateful.py)."""

    def __init__(self) -> None:
        super().__init__()
        RUNS["examples"] += 1
        self.mgr = TransactionManager()
        self.world: dict[str, tuple[int, str, int, int]] = dict.fromkeys(LEAVES, INITIAL)
        self.sent: list[tuple[int, str, str, tuple[int, str, int, int]]] = []
        self.now = 0
        self.serial = 0
        self.txs: dict[int, TxModel] = {}
        self.groups: dict[str, list[int]] = {}
        self.picked: dict[str, int] = {}  # live groups in which resolve picked a winner
        self.events: list[Event] = []
        self.version_time: dict[tuple[str, tuple[int, str, int, int]], int] = {}
        # (leaf, value) an aborted transaction left in the world when a compensation failed
        self.residue: set[tuple[str, tuple[int, str, int, int]]] = set()
        # waiter -> what its last Wait parked it on (`wake_on`) that has not settled yet, until
        # it is decided again, aborts or finishes; a settle wakes only the waiters it was the
        # last of these for.
        self.parked: dict[int, set[int]] = {}
        # waiter parked at externalize -> the scopes it waits to externalise: a read does not
        # overtake an earlier one (as no reader overtakes a queued writer in a fair lock)
        self.queued: dict[int, set[str]] = {}
        self.commits: list[tuple[int, int, int]] = []  # (time, txid, epoch) of each commit
        self.stale_aborts = 0
        self.late_accesses = 0  # accesses to a scope where a later epoch already committed
        self.frontiers = dict.fromkeys(ALL_SCOPES, 0)

    # -- the world ---------------------------------------------------------------------------
    def tick(self) -> int:
        self.now += 1
        return self.now

    def new_version(self, txid: int, cls: str, value: int) -> tuple[int, str, int, int]:
        self.serial += 1
        return (txid, cls, self.serial, value)

    def write_world(self, txid: int, leaf: str, version: tuple[int, str, int, int]) -> None:
        t = self.tick()
        self.world[leaf] = version
        self.version_time[(leaf, version)] = t
        self.events.append(Event(t, txid, "w", leaf, version))

    def observe(self, txid: int, scope: str) -> None:
        for leaf in COVERED[scope]:
            version = self.world[leaf]
            writer = version[0]
            # isolation: nobody ever sees another transaction's unsettled effect
            assert writer in (0, txid) or self.txs[writer].finished, (txid, leaf, version)
            self.events.append(Event(self.tick(), txid, "r", leaf, version))

    def buffered_write(self, txid: int, scope: str, value: int, key: str) -> Effect:
        version = self.new_version(txid, "bufferable", value)

        def apply() -> None:
            for leaf in COVERED[scope]:
                self.write_world(txid, leaf, version)

        return Effect("put", EffectClass.BUFFERABLE, (SCOPE[scope],), key, apply=apply)

    # -- picking -------------------------------------------------------------------------------
    def live(self) -> list[int]:
        return [t for t, m in self.txs.items() if not m.finished]

    def pick(self, pool: list[int], i: int) -> TxModel:
        return self.txs[pool[i % len(pool)]]

    def state_of(self, tx: TxModel) -> str:
        return self.mgr.get(tx.txid).state.value

    # -- expectations the driver computes itself -------------------------------------------------
    def expected_blockers(self, tx: TxModel, scopes: set[str], writes: set[str]) -> set[int]:
        """Earlier unsettled transactions of another group whose access to `scopes` conflicts
        with tx's: they overlap and at least one of the two writes (`writes`: the ones of
        `scopes` tx writes). Reads never conflict with reads."""
        earlier = {
            o.txid
            for o in self.txs.values()
            if o.epoch < tx.epoch
            and not o.finished
            # a sibling branch is no blocker while it speculates; once it has committed (the
            # group's winner, still settling) it is one like any other
            and (tx.group is None or o.group != tx.group or o.state == "committed")
            and any(
                overlaps(a, b) and (a in writes or b in o.writes)
                for a in scopes
                for b in o.footprint
            )
        }
        return earlier | self.compensating_siblings(tx, scopes)

    def unpark(self, tx: TxModel) -> None:
        self.parked.pop(tx.txid, None)
        self.queued.pop(tx.txid, None)

    def read_blockers(self, tx: TxModel, scope: str) -> set[int]:
        """What a read of `scope` waits for: an earlier unsettled eager effect of another
        group there, or an earlier transaction of another group queued to externalise there."""
        def earlier_other(o: TxModel) -> bool:
            return (
                o is not tx
                and not o.finished
                and o.epoch < tx.epoch
                and (tx.group is None or o.group != tx.group)
            )

        eager = {o.txid for o in self.txs.values() if earlier_other(o) and any(overlaps(scope, s) for s in o.eager)}
        queued = {
            t for t, scopes in self.queued.items()
            if earlier_other(self.txs[t]) and any(overlaps(scope, s) for s in scopes)
        }
        return eager | queued

    def woken_by(self, txid: int) -> set[int]:
        """The waiters whose last unsettled blocker was `txid`, which just settled."""
        woken = set()
        for waiter, left in list(self.parked.items()):
            if txid in left:
                left.discard(txid)
                if not left:
                    woken.add(waiter)
                    del self.parked[waiter]
        return woken

    def compensating_siblings(self, tx: TxModel, scopes: set[str]) -> set[int]:
        """Aborted branches of tx's group whose compensations on its scopes are pending."""
        if tx.group is None:
            return set()
        return {
            o.txid
            for o in self.txs.values()
            if o is not tx
            and o.group == tx.group
            and o.state == "aborted"
            and not o.finished
            and any(
                overlaps(a, str(s))
                for e in o.staged
                if e.effect_class is EffectClass.REVERSIBLE
                for s in e.scopes
                for a in scopes
            )
        }

    def check_wait(self, tx: TxModel, decision: Wait, expected: set[int]) -> None:
        assert decision.txid == tx.txid
        assert decision.blockers, "a Wait must name what it waits for"
        siblings = self.compensating_siblings(tx, tx.footprint)
        for b in decision.blockers:
            # only earlier epochs, or an aborted branch of its own group still compensating
            # (which never waits itself, so no cycle can form)
            assert b.epoch < tx.epoch or b.txid in siblings, f"tx {tx.txid} (epoch {tx.epoch}) waits on later {b}"
            assert b.epoch == self.txs[b.txid].epoch
        assert {b.txid for b in decision.blockers} == expected
        # it wakes on some of its blockers, the latest among them (which settles last when
        # they settle in epoch order); so once all its blockers settled, it was woken
        latest = max(decision.blockers, key=lambda b: b.epoch).txid
        assert latest in decision.wake_on and set(decision.wake_on) <= expected
        self.parked[tx.txid] = set(decision.wake_on)
        self.queued.pop(tx.txid, None)  # queued again below if it waits to externalise

    def expect_illegal(self, tx: TxModel, call) -> None:  # noqa: ANN001
        before = self.state_of(tx)
        try:
            call()
        except IllegalTransition:
            pass
        else:
            raise AssertionError(f"{tx.state} transaction {tx.txid} accepted an illegal event")
        assert self.state_of(tx) == before == tx.state

    def aborted(self, tx: TxModel, plan: AbortPlan, source: AbortSource | None = None) -> None:
        assert isinstance(plan, AbortPlan) and plan.txid == tx.txid and plan.epoch == tx.epoch
        if source is not None:
            assert plan.source is source, (plan.source, source)
        # the plan: reversible effects compensated in reverse staging order, the rest dropped
        assert list(plan.compensate) == [
            e for e in reversed(tx.staged) if e.effect_class is EffectClass.REVERSIBLE
        ]
        assert list(plan.drop) == [e for e in tx.staged if e.effect_class is not EffectClass.REVERSIBLE]
        tx.state = "aborted"
        tx.plan = plan
        self.unpark(tx)
        self.stale_aborts += plan.source is AbortSource.STALE_READ

    def decided(self, tx: TxModel, decision: CommitPlan | Wait | AbortPlan) -> None:
        """The answer to a commit attempt of a sealed or waiting transaction."""
        expected = self.expected_blockers(tx, tx.footprint, tx.writes)
        if isinstance(decision, Wait):
            self.check_wait(tx, decision, expected)
            tx.state = "waiting"
            return
        self.unpark(tx)
        # liveness: with every earlier overlapping transaction settled, no Wait
        assert not expected, f"tx {tx.txid} got {type(decision).__name__} despite {expected}"
        if isinstance(decision, AbortPlan):
            if decision.source is AbortSource.LOSING_SPECULATION:
                # only a branch that is not its live group's pick, or of a group that
                # already has a committed branch, loses at commit
                group = self.groups.get(tx.group or "", [])
                assert self.picked.get(tx.group or "") != tx.txid or any(
                    self.txs[m].state == "committed" for m in group
                ), f"the picked winner {tx.txid} lost"
            self.aborted(tx, decision)
            return
        assert isinstance(decision, CommitPlan) and decision.epoch == tx.epoch
        by = {c: [e for e in tx.staged if e.effect_class is c] for c in EffectClass}
        assert list(decision.apply) == by[EffectClass.BUFFERABLE]
        assert list(decision.release) == by[EffectClass.IRREVERSIBLE]
        assert list(decision.accept) == by[EffectClass.REVERSIBLE]
        tx.state = "committed"
        tx.plan = decision
        self.commits.append((self.tick(), tx.txid, tx.epoch))

    def note_access(self, tx: TxModel, scope: str) -> None:
        """Count accesses that come late (a later epoch committed on the scope already): the
        search is steered towards them, as they are where frontiers must hold."""
        self.late_accesses += any(
            c.epoch > tx.epoch and c.state == "committed" and any(overlaps(scope, s) for s in c.footprint)
            for c in self.txs.values()
        )

    def conflict_edges(self, epochs: dict[int, int]) -> set[tuple[object, object]]:
        """The conflict graph of the committed history, from the driver's own log."""
        writers = {(e.leaf, e.version) for e in self.events if e.kind == "w"}

        def node(txid: int, written: tuple[str, tuple[int, str, int, int]] | None = None) -> object:
            if txid in epochs:
                return txid
            if written is not None and written in self.residue:
                return ("residue", txid)  # a failed compensation left it in the world for good
            return None

        edges: set[tuple[object, object]] = set()
        by_leaf: dict[str, list[Event]] = {}
        for e in self.events:
            if e.kind in ("r", "w"):
                by_leaf.setdefault(e.leaf, []).append(e)
        for leaf, evs in by_leaf.items():
            writes = [w for w in evs if w.kind == "w"]
            for j, b in enumerate(evs):
                nb = node(b.txid, (leaf, b.version) if b.kind == "w" else None)
                if nb is None:
                    continue
                # conflicts in the order they happened
                for a in evs[:j]:
                    if a.txid == b.txid or "w" not in (a.kind, b.kind):
                        continue
                    na = node(a.txid, (leaf, a.version) if a.kind == "w" else None)
                    if na is not None:
                        edges.add((na, nb))
                if b.kind != "r":
                    continue
                # reads-from: the writer of the value observed precedes the reader
                if b.version != INITIAL and b.version[0] != b.txid:
                    nw = node(b.version[0], (leaf, b.version))
                    assert nw is not None, f"tx {b.txid} committed a read of an aborted value"
                    assert (leaf, b.version) in writers
                    edges.add((nw, nb))
                # anti-dependency: every later version of the leaf follows the reader
                seen = self.version_time.get((leaf, b.version), 0)
                for w in writes:
                    if w.time > seen and w.txid != b.txid:
                        nw = node(w.txid, (leaf, w.version))
                        if nw is not None:
                            edges.add((nb, nw))
        return edges


def _has_cycle(edges: set[tuple[object, object]]) -> bool:
    succ: dict[object, list[object]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    colour: dict[object, int] = {}
    for start in succ:
        if colour.get(start):
            continue
        stack = [(start, iter(succ.get(start, ())))]
        colour[start] = 1
        while stack:
            n, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[n] = 2
                stack.pop()
            elif colour.get(nxt) == 1:
                return True
            elif not colour.get(nxt):
                colour[nxt] = 1
                stack.append((nxt, iter(succ.get(nxt, ()))))
    return False

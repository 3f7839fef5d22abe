"""Per-resource frontiers over a trie of hierarchical scopes.

A scope's node records which unsettled transactions are registered on it (and which of them
write it) and the commit stamps that make a late access stale. Overlap is
ancestor-or-descendant in the trie, so a table scope meets its rows and a directory its
files. Two accesses conflict when they overlap and at least one of them writes: reads never
conflict with reads.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal, overload

from atomix.decisions import Blocker
from atomix.scopes import Scope
from atomix.transaction import COMMITTED

if TYPE_CHECKING:
    from atomix.transaction import Transaction


class _Node:
    __slots__ = (
        "children",
        "holders",
        "queue",
        "writers",
        "wqueue",
        "text",
        "eager",
        "occupied",
        "w_seq",
        "sub_w_seq",
        "w_epoch",
        "sub_w_epoch",
        "rw_epoch",
        "sub_rw_epoch",
        "touch",
    )

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.holders: dict[int, Transaction] = {}
        # The holders that write this scope (the rest only read it): a reader conflicts with
        # these alone, a writer with every holder.
        self.writers: dict[int, Transaction] = {}
        # Once more than _LAZY_MAX transactions hold the scope at once (contention), each
        # holder's (and writer's) Blocker record, made once and kept in epoch order: the
        # earlier holders a Wait names are a prefix, copied whole, and every Wait that names
        # one shares its record. Until then (None) a query makes the few it needs: most
        # scopes never have a second holder, and keeping records would tax every access.
        self.queue: list[Blocker] | None = None
        self.wqueue: list[Blocker] | None = None
        self.text = ""  # the scope's text, once something registered here
        self.eager: dict[int, Transaction] = {}
        # Nodes of this subtree (itself included) that hold at least one registration (a
        # holder, or an eager registration made by `register_eager` alone): empty
        # subtrees are pruned from walks, and the count changes only when a node's holders go
        # from none to some or back, not on every registration of a busy scope.
        self.occupied = 0
        # Commit stamps. w_seq: log position at which a committed write became visible.
        # w_epoch: latest epoch that committed a write. rw_epoch: latest epoch that committed
        # any access. Each has a subtree maximum so descendant checks are O(depth).
        self.w_seq = 0
        self.sub_w_seq = 0
        self.w_epoch = 0
        self.sub_w_epoch = 0
        self.rw_epoch = 0
        self.sub_rw_epoch = 0
        # The index's `clock` at the node's last stamp: every transaction that began before
        # it (a smaller id) may still be judged by the stamp; later ones never (see `reclaim`).
        self.touch = 0


_ATTR = {name: operator.attrgetter(name) for name in _Node.__slots__}
_EPOCH = operator.itemgetter(1)  # a Blocker's epoch
_LAZY_MAX = 16  # holders of one scope above which its Blocker records are kept in order


def _few_earlier(
    node: _Node, epoch: int, group: str | None, write: bool, latest: list[int] | None
) -> list[Blocker]:
    """`earlier_blockers` when `node` alone holds anything overlapping, and few hold it (its
    records are made now, see `_Node.queue`)."""
    text = node.text
    earlier = [
        Blocker(txid, other.epoch, text)
        for txid, other in (node.holders if write else node.writers).items()
        if other.epoch < epoch
        and (group is None or other.group != group or other.state is COMMITTED)
    ]
    if earlier:
        if len(earlier) > 1:
            earlier.sort(key=_EPOCH)
        if latest is not None:
            latest.append(earlier[-1][0])
    return earlier


def _insert(queue: list[Blocker], mark: Blocker) -> None:
    if not queue or queue[-1][1] < mark[1]:  # registrations mostly come in epoch order
        queue.append(mark)
    else:
        insort(queue, mark, key=_EPOCH)


def _keep_in_order(node: _Node) -> None:
    """Start keeping `node`'s Blocker records in epoch order (see `_Node.queue`)."""
    text = node.text
    node.queue = sorted(
        (Blocker(txid, tx.epoch, text) for txid, tx in node.holders.items()), key=_EPOCH
    )
    writers = node.writers
    node.wqueue = [mark for mark in node.queue if mark[0] in writers]


def _drop(queue: list[Blocker], txid: int, epoch: int) -> None:
    # Mostly the oldest registration finishes first, or the only one: no search then.
    if queue[0][0] == txid:
        del queue[0]
        return
    i = bisect_left(queue, epoch, key=_EPOCH)  # epochs are unique: it is there
    if i < len(queue) and queue[i][0] == txid:
        del queue[i]


class ScopeIndex:
    """Which unsettled transactions hold which scopes, and what has committed where.

    Frontier values only ever grow: they are maxima of commit epochs.
    """

    def __init__(self, *, queues: bool = True) -> None:
        self._root = _Node()
        # Whether registrations keep their Blocker records in epoch order (for
        # `earlier_blockers`); an index asked only about eager effects and stamps needs none.
        self._queues = queues
        self.eager_count = 0  # eager registrations anywhere in the index
        # The largest epoch stamped anywhere: no scope's frontier exceeds it, so an access of
        # a later epoch is known not to be late without a look at the trie.
        self.max_epoch = 0
        # A scope's root-to-node path, once found, stays valid until `reclaim` removes the
        # node (and its entry here): every hot operation is one dict lookup instead of a walk
        # down the trie. Keyed by the scope's (kind, *parts) tuple, its identity: a tuple
        # hashes in C, a Scope in Python.
        self._paths: dict[tuple[str, ...], tuple[_Node, ...]] = {}
        self.nodes = 0  # nodes in the trie (the root aside)
        # The latest epoch stamped on a node since reclaimed: a frontier certified there once
        # stays certified (every unfinished transaction is later), so none reads below it.
        self.floor = 0
        # The id the next transaction to begin will get (its owner keeps it current): a stamp
        # records it as the node's `touch`.
        self.clock = 0

    # A path runs from the kind's node down to the scope's, without the trie's root: no scope
    # names the root, so nothing ever reads its registrations or its subtree stamps.
    @overload
    def _path(self, scope: Scope, create: Literal[True]) -> tuple[_Node, ...]: ...

    @overload
    def _path(self, scope: Scope, create: bool) -> tuple[_Node, ...] | None: ...

    def _path(self, scope: Scope, create: bool) -> tuple[_Node, ...] | None:
        path = self._paths.get(scope._key)
        if path is not None:
            return path
        node = self._root
        nodes: list[_Node] = []
        for part in scope._key:
            child = node.children.get(part)
            if child is None:
                if not create:
                    return None
                child = _Node()
                node.children[part] = child
                self.nodes += 1
            node = child
            nodes.append(child)
        path = self._paths[scope._key] = tuple(nodes)
        return path

    def _nearest(self, scope: Scope) -> tuple[tuple[_Node, ...], bool]:
        """The existing path towards `scope`; the flag says whether the scope's node exists."""
        path = self._paths.get(scope._key)
        if path is not None:
            return path, True
        node = self._root
        nodes: list[_Node] = []
        for part in scope._key:
            child = node.children.get(part)
            if child is None:
                return tuple(nodes), False
            node = child
            nodes.append(child)
        path = self._paths[scope._key] = tuple(nodes)
        return path, True

    # -- registration ----------------------------------------------------------------------
    def register(
        self, scope: Scope, tx: Transaction, *, eager: bool = False, write: bool = True
    ) -> None:
        """Register `tx` on `scope` (idempotent), as a writer of it or (`write=False`) a
        reader; a read registration never downgrades a write. An eager registration also
        counts as an externalised effect there."""
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        assert path is not None
        node = path[-1]
        holders = node.holders
        txid = tx.txid
        if txid not in holders:
            if not holders:
                if not node.eager:
                    for n in path:
                        n.occupied += 1
                node.text = scope._text
            holders[txid] = tx
            if write:
                node.writers[txid] = tx
            queue = node.queue
            if queue is not None:
                mark = Blocker(txid, tx.epoch, node.text)
                _insert(queue, mark)
                if write:
                    wqueue = node.wqueue
                    assert wqueue is not None  # kept (and dropped) together with `queue`
                    _insert(wqueue, mark)
            elif len(holders) > _LAZY_MAX and self._queues:
                _keep_in_order(node)
        elif write and txid not in node.writers:  # a reader now writes it too
            node.writers[txid] = tx
            queue = node.queue
            if queue is not None:
                wqueue = node.wqueue
                assert wqueue is not None  # kept (and dropped) together with `queue`
                _insert(wqueue, queue[bisect_left(queue, tx.epoch, key=_EPOCH)])
        if eager and txid not in node.eager:
            node.eager[txid] = tx
            self.eager_count += 1

    def unregister(self, scope: Scope, tx: Transaction) -> None:
        """Remove `tx`'s registrations on `scope` (none there: nothing changes)."""
        path = self._paths.get(scope._key) or self._path(scope, create=False)
        if path is None:
            return
        node = path[-1]
        txid = tx.txid
        unmarked = node.eager and node.eager.pop(txid, None) is not None
        if unmarked:
            self.eager_count -= 1
        holders = node.holders
        if unmarked and not holders and not node.eager:  # (recorded by register_eager)
            for n in path:
                n.occupied -= 1
        elif holders.pop(txid, None) is not None:
            written = node.writers.pop(txid, None)
            if not holders:
                if not node.eager:
                    for n in path:
                        n.occupied -= 1
                node.queue = node.wqueue = None
            elif node.queue is not None:
                _drop(node.queue, txid, tx.epoch)
                if written is not None:
                    wqueue = node.wqueue
                    assert wqueue is not None  # kept (and dropped) together with `queue`
                    _drop(wqueue, txid, tx.epoch)

    def register_eager(self, scope: Scope, tx: Transaction) -> None:
        """Record `tx`'s externalised effect on `scope` (idempotent), without holding it: an
        index asked only about eager effects (and stamps) keeps no holders."""
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        node = path[-1]
        eager = node.eager
        txid = tx.txid
        if txid not in eager:
            if not eager and not node.holders:
                for n in path:
                    n.occupied += 1
            eager[txid] = tx
            self.eager_count += 1

    def unregister_eager(self, scope: Scope, tx: Transaction) -> None:
        """Remove what `register_eager` recorded (none there: nothing changes)."""
        path = self._paths.get(scope._key)
        if path is None:
            return
        node = path[-1]
        eager = node.eager
        if eager.pop(tx.txid, None) is not None:
            self.eager_count -= 1
            if not eager and not node.holders:
                for n in path:
                    n.occupied -= 1

    # -- queries -----------------------------------------------------------------------------

    def overlapping_holders(self, scope: Scope) -> Iterator[Transaction]:
        """Transactions registered on any scope overlapping `scope` (may repeat a tx)."""
        path, exact = self._nearest(scope)
        last = len(path) - 1
        for i, node in enumerate(path):
            if i == last and exact:
                yield from self._subtree_holders(node)
            elif node.holders:
                yield from node.holders.values()

    def earlier_blockers(
        self,
        scope: Scope,
        epoch: int,
        group: str | None,
        write: bool = True,
        latest: list[int] | None = None,
    ) -> list[Blocker]:
        """The Blocker records (each naming the scope it holds) of the unfinished holders
        overlapping `scope` with an epoch below `epoch` whose access
        conflicts with a write of it (every holder) or, with `write=False`, with a read of it
        (writers only), leaving out uncommitted branches of `group` (may repeat a tx). A
        committed branch still settling counts like any other transaction: it waits for
        nothing any more, so a later branch of its group can wait for it without deadlock,
        and must, or its effects could land under (or be compensated over) the winner's.
        With `latest`, the txid of the latest of them in each node's queue is added to it.
        Tight loops: a commit's hot path."""
        path = self._paths.get(scope._key)
        if path is None:
            path, exact = self._nearest(scope)
            if not path:  # not even its kind is known
                return []
        else:
            exact = True
            last = path[-1]
            occupied = last.occupied
            if not occupied or (occupied == 1 and last.holders and last.queue is None):
                for n in path:
                    if n.holders and n is not last:
                        break  # an ancestor holds it too: the general case below
                else:
                    # The common cases, spelled out: nothing overlapping is held, or only
                    # this node is, by few; often by the asking transaction alone.
                    if not occupied:
                        return []
                    members = last.holders if write else last.writers
                    if len(members) == 1:
                        for other in members.values():
                            if other.epoch >= epoch:
                                return []
                    return _few_earlier(last, epoch, group, write, latest)
        last = path[-1]
        # Ancestors with holders; the scope's own node and what is below it come after.
        nodes = []
        for n in path:
            if n.holders and (n is not last or not exact):
                nodes.append(n)
        if exact and last.occupied:
            if last.occupied == 1 and last.holders:  # nothing registered below it
                nodes.append(last)
            else:
                stack = [last]
                while stack:
                    n = stack.pop()
                    if n.occupied:
                        if n.holders:
                            nodes.append(n)
                        stack.extend(n.children.values())
        # A registration lasts until its transaction finishes (finish unregisters it at once),
        # so every holder here is unfinished: the earlier ones are a prefix of the queue.
        found: list[Blocker] = []
        for node in nodes:
            queue = node.queue if write else node.wqueue
            if queue is not None:
                earlier = queue[: bisect_left(queue, epoch, key=_EPOCH)]
            else:  # a few holders: their records, made now
                text = node.text
                earlier = [
                    Blocker(txid, other.epoch, text)
                    for txid, other in (node.holders if write else node.writers).items()
                    if other.epoch < epoch
                ]
                if len(earlier) > 1:
                    earlier.sort(key=_EPOCH)
            if group is not None:
                holders = node.holders
                earlier = [
                    mark
                    for mark in earlier
                    if (other := holders[mark[0]]).group != group or other.state is COMMITTED
                ]
            if earlier:
                found += earlier
                if latest is not None:
                    latest.append(earlier[-1][0])
        return found

    def _subtree_holders(self, node: _Node) -> Iterator[Transaction]:
        stack = [node]
        while stack:
            n = stack.pop()
            if not n.occupied:
                continue
            if n.holders:
                yield from n.holders.values()
            stack.extend(n.children.values())

    def overlapping_eager(self, scope: Scope) -> Iterator[Transaction]:
        """Transactions with an externalised, unsettled reversible effect overlapping `scope`."""
        return iter(self.eager_owners(scope))

    def eager_owners(self, scope: Scope) -> list[Transaction]:
        """`overlapping_eager` as a list (may repeat a tx). Every access asks: tight code."""
        if not self.eager_count:  # the common case: nothing externalised anywhere
            return []
        path = self._paths.get(scope._key)
        if path is None:
            path, exact = self._nearest(scope)
            if not path:
                return []
        else:
            exact = True
        last = path[-1]
        found: list[Transaction] = []
        for node in path:
            if node.eager and (node is not last or not exact):
                found += node.eager.values()
        if exact and last.occupied:  # an eager registration is a registration too
            if last.occupied == 1 and (last.eager or last.holders):  # nothing below it
                if last.eager:
                    found += last.eager.values()
            else:
                stack = [last]
                while stack:
                    n = stack.pop()
                    if n.occupied:
                        if n.eager:
                            found += n.eager.values()
                        stack.extend(n.children.values())
        return found

    def _max_overlapping(self, scope: Scope, own: str, sub: str) -> int:
        path, exact = self._nearest(scope)
        # Ancestors count with their own stamps, the scope's node with its subtree's (which
        # includes its own, so counting that node's own stamp as well changes nothing).
        best = _ATTR[sub](path[-1]) if exact else 0
        own_of = _ATTR[own]
        for node in path:
            value = own_of(node)
            if value > best:
                best = value
        return best

    def last_write_seq(self, scope: Scope) -> int:
        """Latest log position at which a committed write overlapping `scope` became visible."""
        return self._max_overlapping(scope, "w_seq", "sub_w_seq")

    def last_write_epoch(self, scope: Scope) -> int:
        return self._max_overlapping(scope, "w_epoch", "sub_w_epoch")

    def frontier(self, scope: Scope) -> int:
        """The certified frontier: no work of a smaller epoch on `scope` can still commit.

        A transaction of a smaller epoch that touches `scope` now is late and aborts as stale.
        """
        path = self._paths.get(scope._key)
        if path is None:  # not a known node: walk (rare; the cache fills on registration)
            return self._max_overlapping(scope, "rw_epoch", "sub_rw_epoch")
        best = path[-1].sub_rw_epoch  # the hot case, spelled out: every stage asks this
        for node in path:
            if node.rw_epoch > best:
                best = node.rw_epoch
        return best

    # -- commit stamps -------------------------------------------------------------------------
    def stamp(self, scope: Scope, epoch: int, *, write: bool, visible_seq: int = 0) -> None:
        """Record a commit of `epoch` on `scope`: a write (visible from log position
        `visible_seq`) or a read."""
        if write:
            self.stamp_write(scope, epoch, visible_seq)
            return
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        assert path is not None
        if epoch > self.max_epoch:
            self.max_epoch = epoch
        node = path[-1]
        node.touch = self.clock
        if epoch > node.rw_epoch:
            node.rw_epoch = epoch
        for n in path:
            if epoch > n.sub_rw_epoch:
                n.sub_rw_epoch = epoch

    def stamp_write(self, scope: Scope, epoch: int, visible_seq: int) -> None:
        """`stamp(scope, epoch, write=True, visible_seq=...)`, positionally: every commit
        stamps each scope it writes."""
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        assert path is not None
        if epoch > self.max_epoch:
            self.max_epoch = epoch
        node = path[-1]
        node.touch = self.clock
        if epoch > node.rw_epoch:
            node.rw_epoch = epoch
        if epoch > node.w_epoch:
            node.w_epoch = epoch
        if visible_seq > node.w_seq:
            node.w_seq = visible_seq
        for n in path:  # the subtree maxima of every node on the way down, in one pass
            if epoch > n.sub_rw_epoch:
                n.sub_rw_epoch = epoch
            if epoch > n.sub_w_epoch:
                n.sub_w_epoch = epoch
            if visible_seq > n.sub_w_seq:
                n.sub_w_seq = visible_seq

    def stamp_visible(self, scope: Scope, visible_seq: int) -> None:
        """A committed write on `scope` became visible (again) at log position `visible_seq`;
        its epoch was stamped already."""
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        assert path is not None
        path[-1].touch = self.clock
        _raise_visible(path, visible_seq)

    # -- reclamation ---------------------------------------------------------------------------
    def reclaim(self, scope: Scope, horizon: int | None) -> int:
        """Drop `scope`'s node, and then each ancestor left empty, while nothing there can
        change a decision any more; return how many nodes went.

        `horizon` is the id of the oldest unfinished transaction (None: there is none). A
        node goes when no transaction holds it or has an externalised effect there, nothing
        lies below it, and its stamps can judge no one: every stamp is compared only with
        the epoch or the read position of a transaction that began before it (a later one
        has a larger epoch, and reads after it), so once every transaction that began before
        its last stamp (`touch`) has finished, the stamps are spent. An ancestor goes only
        once childless, so the subtree maxima it held were spent with its descendants. A
        scope touched again later starts from a fresh node, as an untouched one would."""
        key = scope._key
        path = self._paths.get(key)
        if path is None:
            path, exact = self._nearest(scope)
            if not exact:
                return 0
        dropped = 0
        i = len(path) - 1
        while i >= 0:
            node = path[i]
            if (
                node.holders
                or node.eager
                or node.children
                or (horizon is not None and node.touch > horizon)
            ):
                break
            if node.rw_epoch > self.floor:
                self.floor = node.rw_epoch
            parent = path[i - 1] if i else self._root
            del parent.children[key[i]]
            self._paths.pop(key if i == len(key) - 1 else key[: i + 1], None)
            dropped += 1
            i -= 1
        self.nodes -= dropped
        return dropped


def _raise_visible(path: tuple[_Node, ...], visible_seq: int) -> None:
    node = path[-1]
    if visible_seq > node.w_seq:
        node.w_seq = visible_seq
    for n in path:
        if visible_seq > n.sub_w_seq:
            n.sub_w_seq = visible_seq

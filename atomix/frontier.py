"""Per-resource frontiers over a trie of hierarchical scopes.

A scope's node records which unsettled transactions are registered on it and the commit
stamps that make a late access stale. Overlap is ancestor-or-descendant in the trie, so a
table scope meets its rows and a directory its files.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import TYPE_CHECKING

from atomix.scopes import Scope

if TYPE_CHECKING:
    from atomix.transaction import Transaction


class _Node:
    __slots__ = (
        "children",
        "holders",
        "eager",
        "occupied",
        "w_seq",
        "sub_w_seq",
        "w_epoch",
        "sub_w_epoch",
        "rw_epoch",
        "sub_rw_epoch",
    )

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.holders: dict[int, Transaction] = {}
        self.eager: dict[int, Transaction] = {}
        # Nodes of this subtree (itself included) that hold at least one registration: empty
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


_ATTR = {name: operator.attrgetter(name) for name in _Node.__slots__}


class ScopeIndex:
    """Which unsettled transactions hold which scopes, and what has committed where.

    Frontier values only ever grow: they are maxima of commit epochs.
    """

    def __init__(self) -> None:
        self._root = _Node()
        self.eager_count = 0  # eager registrations anywhere in the index
        # The largest epoch stamped anywhere: no scope's frontier exceeds it, so an access of
        # a later epoch is known not to be late without a look at the trie.
        self.max_epoch = 0
        # Nodes are never removed, so a scope's root-to-node path, once found, stays valid:
        # every hot operation is one dict lookup instead of a walk down the trie. Keyed by the
        # scope's (kind, *parts) tuple, its identity: a tuple hashes in C, a Scope in Python.
        self._paths: dict[tuple[str, ...], tuple[_Node, ...]] = {}

    # A path runs from the kind's node down to the scope's, without the trie's root: no scope
    # names the root, so nothing ever reads its registrations or its subtree stamps.
    def _path(self, scope: Scope, create: bool) -> tuple[_Node, ...] | None:
        path = self._paths.get(scope._key)
        if path is not None:
            return path
        node = self._root
        nodes = []
        for part in scope._key:
            child = node.children.get(part)
            if child is None:
                if not create:
                    return None
                child = _Node()
                node.children[part] = child
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
        nodes = []
        for part in scope._key:
            child = node.children.get(part)
            if child is None:
                return tuple(nodes), False
            node = child
            nodes.append(child)
        path = self._paths[scope._key] = tuple(nodes)
        return path, True

    # -- registration ----------------------------------------------------------------------
    def register(self, scope: Scope, tx: Transaction, *, eager: bool = False) -> None:
        """Register `tx` on `scope` (idempotent); an eager registration also counts as an
        externalised effect there."""
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        assert path is not None
        node = path[-1]
        holders = node.holders
        txid = tx.txid
        if txid not in holders:
            if not holders:
                for n in path:
                    n.occupied += 1
            holders[txid] = tx
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
        if node.eager and node.eager.pop(txid, None) is not None:
            self.eager_count -= 1
        holders = node.holders
        if holders.pop(txid, None) is not None and not holders:
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

    def earlier_holders(
        self, scope: Scope, epoch: int, group: str | None
    ) -> list[Transaction]:
        """Unfinished holders overlapping `scope` with an epoch below `epoch`, leaving out
        branches of `group` (may repeat a tx). Tight loops: a commit's hot path."""
        path = self._paths.get(scope._key)
        if path is None:
            path, exact = self._nearest(scope)
            if not path:  # not even its kind is known
                return []
        else:
            exact = True
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
        found: list[Transaction] = []
        for node in nodes:
            for other in node.holders.values():
                if (
                    other.epoch < epoch
                    and not other.finished
                    and (group is None or other.group != group)
                ):
                    found.append(other)
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
        if not self.eager_count:  # the common case: nothing externalised anywhere
            return
        path, exact = self._nearest(scope)
        last = len(path) - 1
        for i, node in enumerate(path):
            if i == last and exact:
                stack = [node]
                while stack:
                    n = stack.pop()
                    if not n.occupied:  # an eager registration is a registration too
                        continue
                    if n.eager:
                        yield from n.eager.values()
                    stack.extend(n.children.values())
            elif node.eager:
                yield from node.eager.values()

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
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        assert path is not None
        if epoch > self.max_epoch:
            self.max_epoch = epoch
        node = path[-1]
        if epoch > node.rw_epoch:
            node.rw_epoch = epoch
        for n in path:
            if epoch > n.sub_rw_epoch:
                n.sub_rw_epoch = epoch
        if write:
            if epoch > node.w_epoch:
                node.w_epoch = epoch
            for n in path:
                if epoch > n.sub_w_epoch:
                    n.sub_w_epoch = epoch
            _raise_visible(path, visible_seq)

    def stamp_visible(self, scope: Scope, visible_seq: int) -> None:
        """A committed write on `scope` became visible (again) at log position `visible_seq`;
        its epoch was stamped already."""
        path = self._paths.get(scope._key) or self._path(scope, create=True)
        assert path is not None
        _raise_visible(path, visible_seq)


def _raise_visible(path: tuple[_Node, ...], visible_seq: int) -> None:
    node = path[-1]
    if visible_seq > node.w_seq:
        node.w_seq = visible_seq
    for n in path:
        if visible_seq > n.sub_w_seq:
            n.sub_w_seq = visible_seq

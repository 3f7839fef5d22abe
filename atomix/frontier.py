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
        "sub_count",
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
        self.sub_count = 0  # registrations in this subtree, to prune empty subtrees quickly
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
        # Nodes are never removed, so a scope's root-to-node path, once found, stays valid:
        # every hot operation is one dict lookup instead of a walk down the trie.
        self._paths: dict[Scope, tuple[_Node, ...]] = {}

    def _path(self, scope: Scope, create: bool) -> tuple[_Node, ...] | None:
        path = self._paths.get(scope)
        if path is not None:
            return path
        node = self._root
        nodes = [node]
        for part in scope.key:
            child = node.children.get(part)
            if child is None:
                if not create:
                    return None
                child = _Node()
                node.children[part] = child
            node = child
            nodes.append(child)
        path = self._paths[scope] = tuple(nodes)
        return path

    def _nearest(self, scope: Scope) -> tuple[tuple[_Node, ...], bool]:
        """The existing path towards `scope`; the flag says whether the scope's node exists."""
        path = self._paths.get(scope)
        if path is not None:
            return path, True
        node = self._root
        nodes = [node]
        for part in scope.key:
            child = node.children.get(part)
            if child is None:
                return tuple(nodes), False
            node = child
            nodes.append(child)
        path = self._paths[scope] = tuple(nodes)
        return path, True

    # -- registration ----------------------------------------------------------------------
    def register(self, scope: Scope, tx: Transaction, *, eager: bool = False) -> None:
        path = self._paths.get(scope) or self._path(scope, create=True)
        assert path is not None
        node = path[-1]
        if tx.txid not in node.holders:
            node.holders[tx.txid] = tx
            for n in path:
                n.sub_count += 1
        if eager and tx.txid not in node.eager:
            node.eager[tx.txid] = tx
            self.eager_count += 1

    def unregister(self, scope: Scope, tx: Transaction) -> None:
        path = self._paths.get(scope) or self._path(scope, create=False)
        if path is None:
            return
        node = path[-1]
        if node.eager.pop(tx.txid, None) is not None:
            self.eager_count -= 1
        if node.holders.pop(tx.txid, None) is not None:
            for n in path:
                n.sub_count -= 1

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
        path = self._paths.get(scope)
        if path is None:
            path, exact = self._nearest(scope)
        else:
            exact = True
        last = path[-1]
        nodes = [n for n in path if n.holders] if not exact else [
            n for n in path if n.holders and n is not last
        ]
        if exact and last.sub_count:
            if last.sub_count == len(last.holders):  # nothing registered below it
                nodes.append(last)
            else:
                stack = [last]
                while stack:
                    n = stack.pop()
                    if n.sub_count:
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
            if n.sub_count == 0:
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
                    if n.sub_count == 0:
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
        path = self._paths.get(scope)
        if path is None:  # not a known node: walk (rare; the cache fills on registration)
            return self._max_overlapping(scope, "rw_epoch", "sub_rw_epoch")
        best = path[-1].sub_rw_epoch  # the hot case, spelled out: every stage asks this
        for node in path:
            if node.rw_epoch > best:
                best = node.rw_epoch
        return best

    # -- commit stamps -------------------------------------------------------------------------
    def stamp(self, scope: Scope, epoch: int, *, write: bool, visible_seq: int = 0) -> None:
        path = self._paths.get(scope) or self._path(scope, create=True)
        assert path is not None
        node = path[-1]
        if epoch > node.rw_epoch:
            node.rw_epoch = epoch
        if write:
            if epoch > node.w_epoch:
                node.w_epoch = epoch
            if visible_seq > node.w_seq:
                node.w_seq = visible_seq
        for n in path:
            if epoch > n.sub_rw_epoch:
                n.sub_rw_epoch = epoch
            if write:
                if epoch > n.sub_w_epoch:
                    n.sub_w_epoch = epoch
                if visible_seq > n.sub_w_seq:
                    n.sub_w_seq = visible_seq

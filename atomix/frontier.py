"""Per-resource frontiers over a trie of hierarchical scopes.

A scope's node records which unsettled transactions are registered on it and the commit
stamps that make a late access stale. Overlap is ancestor-or-descendant in the trie, so a
table scope meets its rows and a directory its files.
"""

from __future__ import annotations

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


class ScopeIndex:
    """Which unsettled transactions hold which scopes, and what has committed where.

    Frontier values only ever grow: they are maxima of commit epochs.
    """

    def __init__(self) -> None:
        self._root = _Node()

    def _path(self, scope: Scope, create: bool) -> list[_Node] | None:
        node = self._root
        path = [node]
        for part in scope.key:
            child = node.children.get(part)
            if child is None:
                if not create:
                    return None
                child = _Node()
                node.children[part] = child
            node = child
            path.append(child)
        return path

    def _nearest(self, scope: Scope) -> tuple[list[_Node], bool]:
        """The existing path towards `scope`; the flag says whether the scope's node exists."""
        node = self._root
        path = [node]
        for part in scope.key:
            child = node.children.get(part)
            if child is None:
                return path, False
            node = child
            path.append(child)
        return path, True

    # -- registration ----------------------------------------------------------------------
    def register(self, scope: Scope, tx: Transaction, *, eager: bool = False) -> None:
        path = self._path(scope, create=True)
        assert path is not None
        node = path[-1]
        if tx.txid not in node.holders:
            node.holders[tx.txid] = tx
            for n in path:
                n.sub_count += 1
        if eager:
            node.eager[tx.txid] = tx

    def unregister(self, scope: Scope, tx: Transaction) -> None:
        path = self._path(scope, create=False)
        if path is None:
            return
        node = path[-1]
        node.eager.pop(tx.txid, None)
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
        best = 0
        last = len(path) - 1
        for i, node in enumerate(path):
            value = getattr(node, sub) if (i == last and exact) else getattr(node, own)
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
        return self._max_overlapping(scope, "rw_epoch", "sub_rw_epoch")

    # -- commit stamps -------------------------------------------------------------------------
    def stamp(self, scope: Scope, epoch: int, *, write: bool, visible_seq: int = 0) -> None:
        path = self._path(scope, create=True)
        assert path is not None
        node = path[-1]
        node.rw_epoch = max(node.rw_epoch, epoch)
        if write:
            node.w_epoch = max(node.w_epoch, epoch)
            node.w_seq = max(node.w_seq, visible_seq)
        for n in path:
            n.sub_rw_epoch = max(n.sub_rw_epoch, epoch)
            if write:
                n.sub_w_epoch = max(n.sub_w_epoch, epoch)
                n.sub_w_seq = max(n.sub_w_seq, visible_seq)

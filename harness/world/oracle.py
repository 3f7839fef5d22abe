"""The oracle: judges a trial from ground truth it reads itself.

Inputs are the substrates' final state, the sink's own file, the operation log written
below every mechanism, the expected state and the agents' own observations (did my commit
return?). Nothing a mode says about itself is trusted, except where the point is to
compare it with the truth (`reported_residue`, to find unclassified residue).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from atomix.adapters import Op

MUTATIONS = frozenset({"write", "delete", "append", "upsert", "insert", "send"})


def _attempt(op: Op) -> tuple[str, int] | None:
    agent, attempt = op.meta.get("agent"), op.meta.get("attempt")
    if agent is None or attempt is None:
        return None
    return str(agent), int(attempt)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The oracle's judgement of one trial. `clean`: the goal reached, and no invariant
    violation, stale commit, leak, duplicate or unreported residue, with a conflict-serialisable
    op log (`judge` computes it)."""

    goal: bool
    invariant_violations: int
    stale_commits: int
    duplicates: int
    leaks: int
    residue: int
    unclassified_residue: int
    serialisable: bool
    clean: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def duplicates(ops: Sequence[Op]) -> int:
    """Applications beyond the first of one logical, non-idempotent call on one scope.

    An undo (compensation, rollback) cancels one application; a substrate's `dedup` is not
    an application at all.
    """
    net: dict[tuple[str, str], int] = defaultdict(int)
    for op in ops:
        op_id = op.meta.get("op")
        if op_id is None or op.kind not in MUTATIONS or op.meta.get("idem"):
            continue
        net[(str(op_id), op.scope)] += -1 if op.meta.get("undo") else 1
    return sum(n - 1 for n in net.values() if n > 1)


def residue(ops: Sequence[Op], committed: set[tuple[str, int]]) -> int:
    """Effects of attempts that did not commit and are still applied: per attempt, logical
    call and scope, the last real mutation is an application, not an undo. (An undo restores
    a before-image, so one undo after a duplicated application still restores the scope.)"""
    last: dict[tuple[str, int, str, str], bool] = {}
    for op in ops:
        who = _attempt(op)
        if who is None or who in committed or op.kind not in MUTATIONS:
            continue
        if op.meta.get("read"):
            continue
        last[(*who, str(op.meta.get("op")), op.scope)] = not op.meta.get("undo")
    return sum(1 for applied in last.values() if applied)


def leaks(messages: Iterable[Mapping[str, Any]], committed: set[tuple[str, int]]) -> int:
    """Messages the sink itself holds for an attempt that did not commit."""
    count = 0
    for message in messages:
        meta = message.get("meta") or {}
        who = (str(meta.get("agent")), int(meta.get("attempt", -1)))
        if who not in committed:
            count += 1
    return count


def _overlap(a: str, b: str) -> bool:
    if a == b:
        return True
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return long_.startswith(short) and long_[len(short)] in ":/"


def conflict_edges(ops: Sequence[Op], committed: set[tuple[str, int]]) -> set[tuple[Any, Any]]:
    """Edges T1 -> T2 between committed attempts whose ops conflict (same or overlapping
    scope, at least one a write, T1's op first in the log)."""
    by_scope: dict[str, list[tuple[int, Any, bool]]] = defaultdict(list)
    for op in ops:
        who = _attempt(op)
        if who is None or who not in committed:
            continue
        if op.kind == "read":
            by_scope[op.scope].append((op.seq, who, False))
        elif op.kind in MUTATIONS and not op.meta.get("undo"):
            by_scope[op.scope].append((op.seq, who, True))
    scopes = sorted(by_scope)
    edges: set[tuple[Any, Any]] = set()
    for i, s in enumerate(scopes):
        group = list(by_scope[s])
        for t in scopes[i + 1 :]:
            if _overlap(s, t):
                group.extend(by_scope[t])
        group.sort(key=lambda x: x[0])
        for j, (_, a, wa) in enumerate(group):
            for _, b, wb in group[j + 1 :]:
                if a != b and (wa or wb):
                    edges.add((a, b))
    return edges


def has_cycle(edges: set[tuple[Any, Any]]) -> bool:
    """Iterative three-colour DFS over the conflict graph."""
    graph: dict[Any, list[Any]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
    colour: dict[Any, int] = {}
    for root in list(graph):
        if colour.get(root):
            continue
        stack = [(root, iter(graph[root]))]
        colour[root] = 1
        while stack:
            node, children = stack[-1]
            for child in children:
                state = colour.get(child, 0)
                if state == 1:
                    return True
                if state == 0:
                    colour[child] = 1
                    stack.append((child, iter(graph.get(child, ()))))
                    break
            else:
                colour[node] = 2
                stack.pop()
    return False


def stale_commits(ops: Sequence[Op], committed: set[tuple[str, int]]) -> int:
    """Committed attempts that wrote a scope after another attempt's write to it landed
    between their read of it and their own write: the lost-update witness."""
    stale: set[tuple[str, int]] = set()
    first_read: dict[tuple[tuple[str, int], str], int] = {}
    writes_by_scope: dict[str, list[tuple[int, tuple[str, int]]]] = defaultdict(list)
    for op in ops:
        who = _attempt(op)
        if who is None or op.meta.get("undo"):
            continue
        if op.kind == "read":
            first_read.setdefault((who, op.scope), op.seq)
        elif op.kind in MUTATIONS:
            writes_by_scope[op.scope].append((op.seq, who))
    for scope, writes in writes_by_scope.items():
        for seq, who in writes:
            if who not in committed:
                continue
            read_at = first_read.get((who, scope))
            if read_at is None or read_at > seq:
                continue
            if any(
                read_at < other_seq < seq and other != who and other in committed
                for other_seq, other in writes
            ):
                stale.add(who)
    return len(stale)


def judge(
    *,
    final: Mapping[str, Any],
    expected: Mapping[str, Any] | None,
    ops: Sequence[Op],
    messages: Iterable[Mapping[str, Any]],
    committed: set[tuple[str, int]],
    invariant_violations: int = 0,
    reported_residue: int = 0,
) -> Verdict:
    """The verdict of one trial. `expected` None means the workload judges by invariants."""
    goal = expected is None or dict(final) == dict(expected)
    dup = duplicates(ops)
    res = residue(ops, committed)
    leak = leaks(messages, committed)
    stale = stale_commits(ops, committed)
    serialisable = not has_cycle(conflict_edges(ops, committed))
    unclassified = max(0, res - reported_residue)
    clean = (
        goal
        and invariant_violations == 0
        and stale == 0
        and leak == 0
        and dup == 0
        and unclassified == 0
        and serialisable
    )
    return Verdict(goal, invariant_violations, stale, dup, leak, res, unclassified, serialisable, clean)

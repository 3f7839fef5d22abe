"""A virtual-clock lock manager for the locking baselines (one per trial, shared by its agents).

Locks are exclusive and taken on scopes; two scopes conflict when they overlap, so a table
lock conflicts with every row lock of that table (`atomix.scopes.Scope.overlaps`). A request
names all the scopes it needs and is granted all at once or not at all; requests wait in one
FIFO queue, and a request is granted only when it conflicts neither with a holder nor with an
earlier request still waiting. Waiting happens on the virtual clock through `ctx.block`, so
the blocked time is charged to the agent, and a wait longer than the time-out raises
`Aborted(TIMEOUT)` (retryable).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from atomix.effects import AbortSource
from atomix.scope_parsing import parse_scope
from atomix.scopes import Scope
from harness.modes.base import Aborted, AgentContext
from harness.world.clock import VirtualClock, VSignal


@dataclass(eq=False, slots=True)
class _Request:
    """One all-or-nothing lock request waiting in the queue."""

    owner: Hashable
    scopes: tuple[Scope, ...]
    signal: VSignal
    seq: int
    # The owner already held locks when it asked (it is growing its lock set mid-workflow).
    holder: bool
    granted: bool = False


@dataclass(slots=True)
class LockStats:
    """Counters for reports and tests (requests, how many had to wait, how many timed out)."""

    requests: int = 0
    waited: int = 0
    timeouts: int = 0
    blocked_ms: float = 0.0


@dataclass(slots=True)
class LockManager:
    """Exclusive scope locks with all-at-once FIFO acquisition, on the virtual clock.

    Guarantees:
    - Mutual exclusion: no two owners ever hold overlapping scopes at the same time.
    - Atomic acquisition: a request is granted whole (every scope it names) or not at all.
    - FIFO fairness: a request never overtakes an earlier waiting request it conflicts with,
      so no request starves while the holders keep releasing.
    - Re-entrancy: an owner's own locks never block it; asking again for a scope it already
      covers is a no-op.
    - Deadlock freedom when every owner takes its whole lock set in one request before it
      releases (lock-up-front, per-call locking): a waiter only ever waits for holders and for
      earlier waiters, and holders never wait. An owner that asks for more scopes while
      holding some (a workflow touching a scope outside its declared footprint) is served
      ahead of plain waiters, since they may be waiting for it; a cycle between two such
      owners is the classic two-phase-locking deadlock, and only the time-out breaks it.
    - Determinism: decisions depend only on the order of requests and releases.
    """

    clock: VirtualClock
    stats: LockStats = field(default_factory=LockStats)
    _held: dict[Hashable, list[Scope]] = field(default_factory=dict)
    _queue: list[_Request] = field(default_factory=list)
    _seq: int = 0

    # -- queries ------------------------------------------------------------------------------
    def held(self, owner: Hashable) -> tuple[Scope, ...]:
        """The scopes `owner` holds now."""
        return tuple(self._held.get(owner, ()))

    def waiting(self) -> int:
        """How many requests are queued."""
        return len(self._queue)

    def _covered(self, owner: Hashable, scope: Scope) -> bool:
        return any(mine.covers(scope) for mine in self._held.get(owner, ()))

    def _blocked_by_holders(self, owner: Hashable, scopes: Iterable[Scope]) -> bool:
        wanted = tuple(scopes)
        for other, theirs in self._held.items():
            if other == owner:
                continue
            if any(a.overlaps(b) for a in wanted for b in theirs):
                return True
        return False

    # -- acquire / release --------------------------------------------------------------------
    async def acquire(
        self,
        ctx: AgentContext,
        scopes: Iterable[str | Scope],
        *,
        owner: Hashable | None = None,
    ) -> None:
        """Take exclusive locks on every scope in `scopes` for `owner` (default `ctx.trace`).

        Returns once all are held. Raises `Aborted(TIMEOUT)` after `ctx.settings.timeout_ms`
        of waiting; the request is then withdrawn, and locks the owner held before stay held
        (the caller releases them as part of its abort).
        """
        who: Hashable = ctx.trace if owner is None else owner
        wanted: list[Scope] = []
        for spec in scopes:
            scope = parse_scope(spec)
            # Re-entrant: what the owner already covers needs no new lock.
            if not self._covered(who, scope) and scope not in wanted:
                wanted.append(scope)
        if not wanted:
            return
        self.stats.requests += 1
        self._seq += 1
        request = _Request(who, tuple(wanted), self.clock.signal(), self._seq, who in self._held)
        self._queue.append(request)
        self._pump()
        if request.granted:
            return
        self.stats.waited += 1
        start = self.clock.now
        await ctx.block(request.signal, ctx.settings.timeout_ms)
        self.stats.blocked_ms += self.clock.now - start
        if request.granted:
            return
        # Timed out: withdraw, since later requests may have been queued behind this one.
        self._queue.remove(request)
        self.stats.timeouts += 1
        self._pump()
        raise Aborted(
            AbortSource.TIMEOUT,
            f"lock wait on {', '.join(map(str, wanted))} exceeded {ctx.settings.timeout_ms:g} ms",
        )

    def release(self, owner: Hashable) -> None:
        """Release every lock `owner` holds and grant whatever that unblocks (FIFO)."""
        if self._held.pop(owner, None) is not None:
            self._pump()

    def _pump(self) -> None:
        """Grant, in queue order, every request that no holder and no earlier waiter blocks."""
        still_waiting: list[_Request] = []
        for request in list(self._queue):
            blocked = self._blocked_by_holders(request.owner, request.scopes)
            if not blocked and not request.holder:
                # FIFO: an earlier conflicting waiter goes first (no starvation). A holder's
                # request skips this check: earlier waiters may be waiting for its locks.
                blocked = any(
                    earlier.owner != request.owner
                    and any(a.overlaps(b) for a in request.scopes for b in earlier.scopes)
                    for earlier in still_waiting
                )
            if blocked:
                still_waiting.append(request)
                continue
            self._queue.remove(request)
            self._held.setdefault(request.owner, []).extend(request.scopes)
            request.granted = True
            request.signal.set()

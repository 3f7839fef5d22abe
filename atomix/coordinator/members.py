"""One process's membership of a coordinator: its lease, its listener, and recovery by any
survivor.

`attach` makes a runtime's core a `ReplicatedCore` on the coordinator's store, registers the
process as a member, replays the log, and starts three daemon threads:

- the listener, while a transaction of this process waits (and never otherwise), catches
  the replica up when the log grows (PostgreSQL: `LISTEN`; SQLite: a poll of the file's
  version), which wakes this process's waiters when another process settles what they wait
  for;
- the heartbeat renews the lease every `heartbeat` seconds, and does nothing else (a
  recovery can take long; the store renews without waiting for the appends' lock);
- the recoverer, as often, fences members whose lease is older than `lease` — except a
  member whose durable log is still locked (the log's lock file, or for a log in the
  coordinator's database its connection's advisory lock, is held by a live process until it
  exits, so that member is alive, only slow) — and recovers them: it claims one (a
  second recoverer skips it), fences it in the log (`ReplicatedCore.fence_member`), opens its
  durable log, finishes its committed transactions by key and compensates the rest
  (`atomix.recovery`), then settles them in the shared core in one append, so their scopes
  are released to everyone else.

A fenced process that comes back finds every write refused with `Fenced`.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atomix.coordinator.db_log import CoordinatorLog, log_held_in, log_name
from atomix.coordinator.db_log_admin import SweptLog, sweep_logs
from atomix.coordinator.replica import ReplicatedCore
from atomix.coordinator.store import CoordinatorError, Member, Store
from atomix.coordinator.urls import open_store
from atomix.log import LOCK_FILE, LogBusy, LogError, TxLog
from atomix.recovery import recover

if TYPE_CHECKING:
    from atomix.manager import RuntimeOptions
    from atomix.session import Coordinator
    from atomix.tools import ToolSpec


#: Seconds without a heartbeat before a member is presumed dead (see CoordinatorSettings).
DEFAULT_LEASE = 30.0


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    """Where the coordinator is and how leases behave.

    - `url`: ``sqlite:///PATH`` (processes of one host) or ``postgresql://...`` (any hosts);
    - `lease`: seconds without a heartbeat after which a member is presumed dead and fenced
      (unless its durable log is still locked, which proves it alive); long by default, so
      that a member on overloaded cores is not taken for dead: a dead member's transactions
      wait that long for a survivor;
    - `heartbeat`: seconds between heartbeats (default: a quarter of the lease);
    - `recover_others`: whether this process recovers dead members (every process may; a
      claim makes sure only one does each).
    """

    url: str
    lease: float = DEFAULT_LEASE
    heartbeat: float | None = None
    recover_others: bool = True

    def __post_init__(self) -> None:
        if not (self.lease > 0):
            raise ValueError(f"CoordinatorSettings.lease must be > 0 seconds, got {self.lease!r}")
        if self.heartbeat is not None and not (0 < self.heartbeat < self.lease):
            raise ValueError(
                f"CoordinatorSettings.heartbeat must be > 0 and below the lease ({self.lease}), "
                f"got {self.heartbeat!r}"
            )

    @property
    def period(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease / 4


@dataclass(slots=True)
class RecoveredMember:
    """One dead member a recoverer settled: its transactions, and how its effects went."""

    member: int
    txids: list[int]
    compensated: bool  # its log was recovered (effects finished or compensated by key)
    log: str | None


@dataclass(slots=True)
class Membership:
    """This process on a coordinator (see the module docstring). `close` ends it."""

    store: Store
    replica: ReplicatedCore
    settings: CoordinatorSettings
    member: int
    log: TxLog | None
    tools: Mapping[str, ToolSpec | None]
    has_waiters: Callable[[], bool]
    recovered: list[RecoveredMember] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    fenced: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _parked: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _closed: bool = False

    def start_heartbeat(self) -> None:
        """Renew the lease from now on: started before the member replays the log and
        recovers dead members, either of which can outlast a lease."""
        self._spawn(self._beat, "heartbeat")

    def start(self) -> None:
        """The listener and the recoverer (the heartbeat runs already)."""
        self._spawn(self._listen, "listener")
        if self.settings.recover_others:
            self._spawn(self._recover_loop, "recoverer")

    def stop_threads(self) -> None:
        self._stop.set()
        self._parked.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"atomix-coordinator-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def out_of_its_hands(self) -> bool:
        """Whether this process was fenced (its lease, or a fence in the log): then its
        unsettled transactions are a survivor's to recover, and it may close regardless."""
        replica = self.replica
        try:
            replica.catch_up()  # a survivor may have fenced or settled it meanwhile
        except Exception:  # noqa: BLE001 - a store that cannot be read proves nothing
            pass
        return self.fenced or replica.member in replica.fenced

    def parked(self) -> None:
        """A transaction of this process started waiting: look for news."""
        self._parked.set()

    # -- threads ---------------------------------------------------------------------------------
    def _listen(self) -> None:
        store, replica = self.store, self.replica
        while not self._stop.is_set():
            try:
                # News matters only to a waiter here: without one, reading the log on every
                # other process's settlement would cost each process a query per commit.
                if not self.has_waiters():
                    store.quiet()
                    self._parked.wait(0.5)
                    self._parked.clear()
                    if not self.has_waiters():
                        continue
                if store.wait_for_news(replica.applied, 0.5):
                    replica.catch_up()
            except Exception as exc:  # noqa: BLE001 - a store hiccup: try again shortly
                if self._stop.is_set():
                    return
                self.errors.append(exc)
                if replica.broken is not None:
                    return
                self._stop.wait(0.05)

    def _beat(self) -> None:
        while not self._stop.wait(self.settings.period):
            try:
                if not self.store.heartbeat(self.member):
                    self.fenced = True
                    return
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                self.errors.append(exc)

    def _recover_loop(self) -> None:
        while not self._stop.wait(self.settings.period):
            if self.fenced:
                return
            try:
                self.recover_dead()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                self.errors.append(exc)

    # -- recovery -----------------------------------------------------------------------------------
    def recover_dead(self) -> list[RecoveredMember]:
        """Fence members whose lease expired and recover every fenced member not claimed by
        a live recoverer (see the module docstring)."""
        return recover_members(
            self.store, self.replica, self.settings.lease, self.tools, own_log=self.log,
            into=self.recovered,
        )

    def close(self) -> None:
        """Stop the threads and end the lease. With transactions of this process still
        unsettled, the lease is fenced instead, so a survivor recovers them."""
        if self._closed:
            return
        self._closed = True
        self.stop_threads()
        try:
            mine = [t for t, m in self.replica.owner.items() if m == self.member]
            if mine:
                self.store.fence(self.member)
            else:
                self.store.leave(self.member)
        except Exception as exc:  # noqa: BLE001 - closing: the lease expires anyway
            self.errors.append(exc)
        self.store.close()


def recover_members(
    store: Store,
    replica: ReplicatedCore,
    lease: float,
    tools: Mapping[str, ToolSpec | None] | None,
    *,
    own_log: TxLog | None = None,
    into: list[RecoveredMember] | None = None,
) -> list[RecoveredMember]:
    """Fence expired members and recover each claimable fenced one (see the module docstring)."""
    url = store.url

    def alive(member: Member) -> bool:  # its log is held: by a live process
        return log_held(member) or log_held_in(url, member.log_dir)

    store.fence_expired(lease, alive)
    done: list[RecoveredMember] = []
    while (dead := store.claim(replica.member)) is not None:
        try:
            # In the log before its durable log is read: an append of the dead member still
            # in flight lands after the fence, so no replica (nor the member) acts on it.
            replica.fence_member(dead.id)
            found = _recover_one(dead, replica, tools, own_log, url)
        except BaseException:
            store.release(dead.id, recovered=False)
            raise
        store.release(dead.id, recovered=found is not None)
        if found is None:
            break  # its log is still held (it lives) or needs a human: try again later
        done.append(found)
        if into is not None:
            into.append(found)
    return done


def _recover_one(
    dead: Member,
    replica: ReplicatedCore,
    tools: Mapping[str, ToolSpec | None] | None,
    own_log: TxLog | None,
    url: str,
) -> RecoveredMember | None:
    compensated = False
    if dead.log_dir:
        if own_log is not None and dead.log_dir == own_log.location:
            # A restarted process recovering its own predecessor: the log is already ours.
            report = recover(own_log, tools=tools)
        else:
            name = log_name(dead.log_dir)  # a log in the coordinator's database, or a directory
            try:
                log = (
                    TxLog(dead.log_dir, create=False) if name is None
                    else CoordinatorLog(url, name, create=False)
                )
            except LogBusy:
                return None  # the process still holds its log: it is alive, wait for it
            except LogError:
                log = None  # nothing logged there: settle without compensating
            if log is None:
                report = None
            else:
                try:
                    report = recover(log, tools=tools)
                finally:
                    log.close()
        if report is not None:
            if not report.clean:
                warnings.warn(
                    f"atomix coordinator: member {dead.id}'s log {dead.log_dir} still needs work "
                    f"({report}); its transactions stay unsettled",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return None
            compensated = True
    txids = replica.settle_member(dead.id, compensated=compensated, by=f"member {replica.member}")
    return RecoveredMember(dead.id, txids, compensated, dead.log_dir)


def log_held(member: Member) -> bool:
    """Whether `member`'s durable log is locked by a live process (this host, or storage
    shared with it): then it is alive, however late its heartbeat. A log this host cannot
    see proves nothing."""
    if not member.log_dir:
        return False
    try:
        fh = open(Path(member.log_dir) / LOCK_FILE, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return False
    try:
        # Shared: probing recoverers do not exclude each other; the holder's is exclusive.
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return False
    finally:
        fh.close()


def attach(
    co: Coordinator,
    coordinator: str | CoordinatorSettings,
    *,
    log: TxLog | None = None,
) -> Membership:
    """Make `co`'s core a replica on the coordinator `coordinator` names, and join it."""
    settings = coordinator if isinstance(coordinator, CoordinatorSettings) else CoordinatorSettings(coordinator)
    store = open_store(settings.url)
    wakers = co._wakers
    membership: Membership | None = None
    try:
        replica = ReplicatedCore(store, co.core.options, lock=co.lock, wake=co._wake)
        member = store.register(
            pid=os.getpid(),
            host=socket.gethostname(),
            log_dir=None if log is None else log.location,
            options=options_fingerprint(co.core.options),
        )
        membership = Membership(
            store, replica, settings, member, log, co.tools, has_waiters=lambda: bool(wakers)
        )
        membership.start_heartbeat()
        replica.join(member)
    except BaseException:
        if membership is not None:
            membership.stop_threads()
        store.close()
        raise
    # The same calls, replicated: the session's steps cannot tell the difference.
    co.core = replica  # type: ignore[assignment]
    # Tell the listener when a transaction here starts to wait (it reads the log only then).
    park = co._park

    def parked(txid: int, signal: Any) -> None:
        park(txid, signal)
        membership.parked()

    setattr(co, "_park", parked)  # noqa: B010 - an instance's hook, not the class's
    if log is not None:
        # A predecessor of this process on the same log (it died): fence it, so that it is
        # recovered from this log at once.
        for other in store.members():
            if other.log_dir == log.location and other.id != member and other.status == "live":
                store.fence(other.id)
    if settings.recover_others:
        try:
            membership.recover_dead()
        except CoordinatorError as exc:
            membership.errors.append(exc)
    membership.start()
    return membership


def options_fingerprint(options: RuntimeOptions) -> str:
    """The options every runtime on one coordinator must share, as text."""
    return repr(options)


def recover_coordinator(
    url: str, *, lease: float = DEFAULT_LEASE, swept: list[SweptLog] | None = None
) -> tuple[list[RecoveredMember], list[Member]]:
    """Join the coordinator at `url` for a moment, as `atomix recover --coordinator URL` does:
    fence the members whose lease is older than `lease` seconds (not those whose log is still
    held), recover every fenced member no live recoverer holds (built-in adapters' effects
    only: the tools of a user's program are not here), and leave. Returns what it recovered
    and the members still fenced (their logs hold work for their program, or are in use).

    With a ``postgresql://`` coordinator it then sweeps the logs in its database
    (`atomix.coordinator.db_log_admin.sweep_logs`): each log no live or fenced member names
    and no live process holds is recovered and dropped if finished; `swept` receives them."""
    settings = CoordinatorSettings(url, lease=lease, recover_others=False)
    store = open_store(settings.url)
    try:
        # A member of its own, without a runtime: a replica to settle the dead ones' work in.
        replica = ReplicatedCore(store, None, lock=threading.RLock(), wake=lambda ids: None)
        member = store.register(
            pid=os.getpid(), host=socket.gethostname(), log_dir=None,
            options=options_fingerprint(replica.options),
        )
        # Its lease is renewed while it replays the log and recovers (either may be long).
        membership = Membership(store, replica, settings, member, None, {}, has_waiters=lambda: False)
        membership.start_heartbeat()
        try:
            replica.join(member)
            done = recover_members(store, replica, settings.lease, None)
            members = store.members()
            left = [m for m in members if m.status == "fenced"]
            if url.startswith(("postgresql://", "postgres://")):
                busy = {m.log_dir for m in members if m.log_dir and m.status in ("live", "fenced")}
                found = sweep_logs(url, busy)
                if swept is not None:
                    swept.extend(found)
        finally:
            membership.stop_threads()
            store.leave(member)
    finally:
        store.close()
    return done, left

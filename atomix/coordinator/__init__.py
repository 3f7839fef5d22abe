"""Many processes, one set of guarantees: the multi-process coordinator.

`Runtime(coordinator="postgresql://..." | "sqlite:///PATH")` makes the runtime's transaction
manager a replica of one shared, totally ordered event log kept in the coordinator's
database (`atomix.coordinator.replica`): every runtime on the same coordinator shares the
epochs, the scope registrations and frontiers, and so conflict detection and waiting, across
processes. Each process holds a lease; when one dies, a survivor recovers its transactions
from its durable log and releases their scopes (`atomix.coordinator.members`). The rules stay
in `atomix.manager`: the coordinator only orders the calls made to it.

Which one: ``sqlite:///PATH`` for processes on one host (no server; appends serialised by a
file lock, waiters poll); ``postgresql://`` for processes on several hosts, or many busy
processes (lock-free appends, LISTEN/NOTIFY, leases on the server's clock).

What is shared and what is not: the coordinator's database holds the event log (epochs,
scope registrations, frontiers, decisions) and the leases. Where each process's durable log
(intents, committed marks, settlements, keys, dead letters) lives, `Runtime(log=...)` says:

- ``log="coordinator"`` (a ``postgresql://`` coordinator only): in the coordinator's database,
  one schema per process (`atomix.coordinator.db_log`). A survivor on any host, or
  ``atomix recover --coordinator URL``, finishes a dead process's committed transactions by
  key and compensates the rest from the database alone. Asked for, not implied by the
  coordinator: a log costs a synchronous commit per transaction with effects, as a directory's
  costs an fsync, and a runtime without one is unchanged.
- ``log=DIR``: a directory of its own; the coordinator records only its path. A survivor
  recovers the dead process's effects only if it can open that directory: always on one host
  (the right choice with a ``sqlite:///`` coordinator, whose processes share a host anyway);
  across hosts only on storage both see. A recoverer that cannot see the log settles the dead
  process's transactions in the shared core all the same (their scopes are released), but
  without finishing or compensating their effects: `atomix recover LOGDIR` on the dead
  process's host does that part.
- no log: a dead process's transactions are settled in the shared core (their scopes
  released), and their effects are neither finished nor compensated.

A second recoverer never repeats the first's work: it takes a dead member only through the
store's claim, and the member's log opens for one process at a time (a lock file; in the
database, an advisory lock of the log's connection).

Cost: a state-changing call is one append, and a transaction of one tool call four (begin,
the call, seal and commit, finish). PostgreSQL appends take no lock: each is one statement
that inserts at the sequence's next position and reads the events before it, and decisions
are made when the events are replayed, so appenders of many processes proceed at once. A
SQLite append is one short write under the file lock, so SQLite appends are one at a time.
Every replica replays every event, so each process's share of the work grows with the number
of processes. Measure with ``python -m harness.bench.coordinator``; disjoint scopes never
wait on each other.
"""

from atomix.coordinator.members import (
    CoordinatorSettings,
    Membership,
    RecoveredMember,
    attach,
    recover_coordinator,
    recover_members,
)
from atomix.coordinator.replica import ReplicaDiverged, ReplicatedCore
from atomix.coordinator.store import CoordinatorError, Fenced, Store
from atomix.coordinator.urls import open_store

__all__ = [
    "CoordinatorError",
    "CoordinatorSettings",
    "Fenced",
    "Membership",
    "RecoveredMember",
    "ReplicaDiverged",
    "ReplicatedCore",
    "Store",
    "attach",
    "open_store",
    "recover_coordinator",
    "recover_members",
]

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
processes (advisory locks, LISTEN/NOTIFY, leases on the server's clock).

What is shared and what is not: the coordinator's database holds the event log (epochs,
scope registrations, frontiers, decisions) and the leases. Each process's durable log
(`Runtime(log=DIR)`: intents, committed marks, settlements, keys, dead letters) stays in
its own directory, and the coordinator records only its path. So a survivor can recover a
dead process's effects only if it can open that directory: always on one host; across hosts
only on storage both see (a shared volume). A recoverer that cannot see the log settles the
dead process's transactions in the shared core all the same (their scopes are released), but
without finishing or compensating their effects: `atomix recover LOGDIR` on the dead
process's host does that part. Every append takes one lock, so the whole coordinator's
appends per second are bounded by one append's time under the lock (measure with
``python -m harness.bench.coordinator``); disjoint scopes never wait on each other, but they
share that bound.
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

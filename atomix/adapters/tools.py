"""Ready-made runtime tools over the real stores: one line per substrate.

    fs = file_tools(rt, FileStore(root))          # fs.write_text(path, text), fs.read_text(path)
    db = sqlite_tools(rt, SQLiteStore(db_path))   # db.put(t, k, v), db.delete(t, k), db.get(t, k)
    mail = mail_tools(rt, MailboxSink(outbox))    # mail.send(to, subject, body)

Each tool is shimmed: inside `with rt.transaction()` (or `rt.run`, or a branch) its effect is
deferred to commit; outside any transaction a call runs in a transaction of its own. The tools
are synchronous and work in `async with rt.atransaction() as tx:` too: writes, rows and mail
stage or queue at once when called directly; a read (`read_text`, `get`) called directly runs
at once unless it must wait for an earlier transaction, and then raises: `await
tx.call(fs.read_text, path)` waits without blocking the loop and reads in a worker thread.

How the idempotency key reaches the store: file writes and mail go through `rt.tool`, whose shim
passes the effect's key to a function parameter named `idempotency_key`. Row writes instead stage
an Effect built by `row_effect` through the transaction handle's `stage()`: only such an effect
carries the store as its batch applier, so that all of a transaction's rows (on one store) apply
in ONE SQLite transaction at commit.

Keys: a message's is `run:trace:epoch:branch:mail.send:#<n>:<digest of the arguments>`, n
being the call's ordinal in its transaction, so two identical sends in one transaction are two
effects and two messages (two reminders sent on purpose), while a retried delivery of one send
reuses its key and lands once. A whole-value write (file, row) instead carries its position
among the transaction's writes to that resource, `...:<tool>:<n>.<digest>`: writing A, B, then
A again leaves A (with content keys alone the second A would be dropped as a duplicate of the
first), and a duplicated delivery is simply written twice, which leaves the same value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atomix.adapters.filesystem import FileStore
from atomix.adapters.mailbox import MailboxSink
from atomix.adapters.sqlite import RowWrite, SQLiteStore, row_effect
from atomix.effects import Effect
from atomix.errors import AtomixError
from atomix.handles import ATx, Tx, current_transaction
from atomix.log_format import REDO_ATTR
from atomix.runtime import Runtime
from atomix.tools import Ack

__all__ = ["FileTools", "MailTools", "SQLiteTools", "file_tools", "mail_tools", "sqlite_tools"]


@dataclass(frozen=True)
class FileTools:
    """Whole-file text tools over one `FileStore`.

    `write_text` is BUFFERABLE: nothing touches the disk before commit; at commit the store
    writes to a temporary file and renames it over the target, with the effect's idempotency
    key, so a retried apply writes once and an aborted transaction leaves no file behind.
    `read_text` registers the file's scope on read and returns this transaction's own latest
    staged text for the file if there is one (read-your-writes), else the committed content
    (None for no file).
    """

    write_text: Callable[[str, str], Ack]
    read_text: Callable[[str], str | None]


@dataclass(frozen=True)
class SQLiteTools:
    """Row tools over one `SQLiteStore`.

    `put` and `delete` are BUFFERABLE row effects made by `row_effect`: at commit all of one
    transaction's rows on this store apply through `apply_batch` in ONE SQLite transaction (all
    or nothing, each at most once by key); aborted rows never land. `get` registers the row's
    scope on read and sees this transaction's own staged row writes (read-your-writes).
    """

    put: Callable[[str, Any, Any], Ack]
    delete: Callable[[str, Any], Ack]
    get: Callable[[str, Any], Any]


@dataclass(frozen=True)
class MailTools:
    """`send` is IRREVERSIBLE and gated: the message waits at the gate and leaves only at commit,
    with its idempotency key, so a retried release appends it once; an abort drops it unsent."""

    send: Callable[[str, str, str], Ack]


# ------------------------------------------------------------------------------------- files
def file_tools(rt: Runtime, store: FileStore) -> FileTools:
    """Shimmed `write_text` / `read_text` over `store` (see `FileTools`)."""

    def write_text(path: str, text: str, idempotency_key: str) -> bool:
        return store.write(path, text, key=idempotency_key)

    # A durable log describes the effect from the store (root) and the arguments, so that
    # `atomix recover` can redo it in a new process without this program.
    setattr(write_text, REDO_ATTR, ("fs.write", store))
    write = rt.tool(
        write_text,
        effect="bufferable",
        writes=lambda path, text: store.scope(path),
        key=lambda path, text: _nth_write_key(rt, store.scope(path), [path, text]),
        name="fs.write_text",
    )

    def read_text(path: str) -> str | None:
        staged = _latest_staged(rt, store.scope(path), lambda e: e.tool == write.spec.name)
        return store.read_text(path) if staged is None else staged.payload["text"]

    read = rt.tool(read_text, reads=lambda path: store.scope(path), name="fs.read_text")
    return FileTools(write_text=write, read_text=read)


# ------------------------------------------------------------------------------------ sqlite
def sqlite_tools(rt: Runtime, store: SQLiteStore) -> SQLiteTools:
    """Shimmed `put` / `delete` / `get` over `store` (see `SQLiteTools`)."""

    def put(table: str, k: Any, value: Any) -> Ack:
        if value is None:
            raise ValueError("sqlite.put: value None is not storable (use delete)")
        return _stage_row(rt, store, "sqlite.put", table, k, value)

    def delete(table: str, k: Any) -> Ack:
        return _stage_row(rt, store, "sqlite.delete", table, k, None)

    def get(table: str, k: Any) -> Any:
        staged = _latest_staged(rt, store.scope(table, k), lambda e: e.batch is store)
        if staged is None:
            return store.get(table, k)
        row: RowWrite = staged.payload
        return row.value

    read = rt.tool(get, reads=lambda table, k: store.scope(table, k), name="sqlite.get")
    return SQLiteTools(put=put, delete=delete, get=read)


def _stage_row(rt: Runtime, store: SQLiteStore, tool: str, table: str, k: Any, value: Any) -> Ack:
    """Stage one row write in the current transaction (or in one of its own)."""
    tx = current_transaction()
    if tx is None:
        with rt._own_transaction(tool):
            return _stage_row(rt, store, tool, table, k, value)
    if not isinstance(tx, (Tx, ATx)) or tx.rt is not rt:
        raise AtomixError(
            f"tool {tool!r}: called inside a transaction of another runtime or driver"
        )
    ck = store.canonical_key(k)
    key = tx.session.key(tool, _nth_write_key(rt, store.scope(table, ck), [table, ck, value]))
    effect = row_effect(store, table, k, value, key=key, tool=tool)
    effect.scopes = tuple(map(rt.coordinator.scope, effect.scopes))  # this runtime's policy
    if isinstance(tx, ATx):  # staging never waits: done at once, from sync code
        tx._drive_inline(tx.stage_steps(effect), tool)
    else:
        tx.stage(effect)
    return Ack("staged", key, tool)


# -------------------------------------------------------------------------------------- mail
def mail_tools(rt: Runtime, sink: MailboxSink) -> MailTools:
    """Shimmed, gated `send` over `sink` (see `MailTools`)."""

    def send(to: str, subject: str, body: str, idempotency_key: str) -> bool:
        return sink.send(to, subject, body, key=idempotency_key)

    setattr(send, REDO_ATTR, ("mail.send", sink))  # see file_tools
    gated = rt.tool(
        send,
        effect="irreversible",
        writes=lambda to, subject, body: sink.scope(to),
        name="mail.send",
    )
    return MailTools(send=gated)


# ----------------------------------------------------------------------------------- helpers
def _nth_write_key(rt: Runtime, scope: str, args: list[Any]) -> str:
    """`<n>.<digest of args>`, n = how many effects the current transaction has staged on
    `scope` so far."""
    tx = current_transaction()
    n = 0
    if tx is not None and tx.rt is rt:
        target = rt.coordinator.scope(scope)
        with rt.coordinator.lock:
            n = sum(target in e.scopes for e in rt.core.get(tx.txid).effects)
    blob = json.dumps(args, sort_keys=True, default=repr).encode()
    return f"{n}.{hashlib.blake2b(blob, digest_size=8).hexdigest()}"


def _latest_staged(rt: Runtime, scope: str, match: Callable[[Effect], bool]) -> Effect | None:
    """The current transaction's last staged effect on exactly `scope` that `match` accepts:
    what its commit will leave there (for read-your-writes)."""
    tx = current_transaction()
    if tx is None or tx.rt is not rt:
        return None
    target = rt.coordinator.scope(scope)
    with rt.coordinator.lock:
        effects = list(rt.core.get(tx.txid).effects)
    for effect in reversed(effects):
        if target in effect.scopes and match(effect):
            return effect
    return None

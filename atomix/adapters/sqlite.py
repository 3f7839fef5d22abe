"""A SQLite store: JSON key-value rows in a real database file, with batched, idempotent commits."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomix.adapters.oplog import OpLog
from atomix.effects import Effect, EffectClass
from atomix.scope_kinds import sqlite_scope, sqlite_table
from atomix.scopes import Scope

SUBSTRATE = "sqlite"
#: The applied-key table. It lives in the same database as the rows so that one SQLite
#: transaction covers a row and its key.
APPLIED_TABLE = "_atomix_applied"
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Seconds a connection waits for another one's lock before it gives up.
_BUSY_TIMEOUT = 30.0


@dataclass(frozen=True)
class RowWrite:
    """One row operation carried as an Effect's payload: put ``value`` at ``(table, k)``.

    ``value`` None means delete the row. ``k`` is the canonical row key
    (`SQLiteStore.canonical_key`).
    """

    table: str
    k: str
    # JSON values and meta may be dicts or lists: keep them out of the hash (table and k suffice).
    value: Any = field(hash=False)
    meta: dict[str, Any] = field(default_factory=dict, hash=False)


class _InjectedFailure(RuntimeError):
    """Raised by the test-only ``_fail_after_rows`` hook of `SQLiteStore.apply_batch`."""


class SQLiteStore:
    """Key-value tables ``(k TEXT PRIMARY KEY, v TEXT NOT NULL)`` of JSON values in one SQLite file.

    Guarantees:
    - Every mutation runs in an explicit ``BEGIN IMMEDIATE ... COMMIT`` (WAL, ``synchronous=FULL``):
      once a method returns, its rows are durable; if it raises, none of its rows are written.
    - With a key, a row operation is applied at most once, across processes and reopenings: the key
      goes into ``_atomix_applied`` in the SAME transaction as the row, so a crash can never leave
      a row without its key or a key without its row. A retry after any failure is therefore safe:
      it applies the row exactly once. (This holds for a compensation too: one that writes with
      ``key=call.compensation_key`` undoes once, however often recovery runs it.) `prune_keys`
      removes a finished run's keys (recovery does, once no retry can come for them).
    - `apply_batch` applies many row operations in ONE transaction: all or nothing.
    - Row keys are canonical: ``42`` and ``"42"`` are one row (and one scope).

    The operation log is appended after COMMIT (a rolled-back row is no mutation), under the
    store's lock, so its order is commit order. It is not in the database: a process killed
    between COMMIT and the append leaves a committed row without its op record.

    Thread-safe: one connection, guarded by one lock.
    """

    def __init__(
        self, path: Path | str, *, oplog: OpLog | None = None, durable: bool = True
    ) -> None:
        # Absolute: the path is part of every row's scope, and scopes name files absolutely
        # (a relative path would also change meaning with the working directory).
        self._path = Path(path).absolute()
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._oplog = oplog
        self._lock = threading.RLock()
        # isolation_level=None: the sqlite3 module issues no implicit BEGIN; we say where each
        # transaction starts and ends. timeout: wait (not fail) while another connection writes.
        self._conn = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT
        )
        _switch_to_wal(self._conn)
        # FULL: a COMMIT that has returned survives power loss (NORMAL could lose the last ones).
        # durable=False (NORMAL in WAL) survives a process crash but not power loss: for
        # throwaway trial databases only.
        self._conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} ("
            "key TEXT PRIMARY KEY, tbl TEXT NOT NULL, k TEXT NOT NULL, kind TEXT NOT NULL)"
        )
        self._tables: set[str] = set()

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- scopes -------------------------------------------------------------------------------

    def scope(self, table: str, k: Any = None) -> str:
        """The canonical scope string of a table (``k`` None) or of one row of this database."""
        return str(self.scope_object(table, k))

    def scope_object(self, table: str, k: Any = None) -> Scope:
        """The `Scope` of a table or row: ``sqlite:/abs/db:table[:k]`` (for building effects)."""
        return sqlite_scope(self._path, _table_name(table), k)

    def canonical_key(self, k: Any) -> str:
        """The canonical text of a row key, the one its scope uses: ``42`` and ``"42"`` are one.

        ValueError (a ScopeError) for a key that is not an int, an integral float or a string.
        """
        return self.scope_object("t", k).parts[-1]

    # ---- reads --------------------------------------------------------------------------------

    def get(
        self,
        table: str,
        k: Any,
        *,
        log_read: bool = False,
        meta: Mapping[str, Any] | None = None,
    ) -> Any | None:
        """The row's value, or None if there is no such row (or table)."""
        name = _table_name(table)
        ck = self.canonical_key(k)
        with self._lock:
            row = None
            if self._table_exists(name):
                row = self._conn.execute(f'SELECT v FROM "{name}" WHERE k = ?', (ck,)).fetchone()
            if log_read and self._oplog is not None:
                self._oplog.append(SUBSTRATE, self.scope(name, ck), "read", key=None, meta=meta)
        return None if row is None else json.loads(row[0])

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every user table's rows, read from the database (not ``_atomix_applied``)."""
        with self._lock:
            out: dict[str, dict[str, Any]] = {}
            for name in self._user_tables():
                rows = self._conn.execute(f'SELECT k, v FROM "{name}" ORDER BY k').fetchall()
                out[name] = {k: json.loads(v) for k, v in rows}
            return out

    def applied_keys(self) -> frozenset[str]:
        """Every idempotency key recorded in ``_atomix_applied``."""
        with self._lock:
            rows = self._conn.execute(f"SELECT key FROM {APPLIED_TABLE}").fetchall()
        return frozenset(r[0] for r in rows)

    # ---- mutations ----------------------------------------------------------------------------

    def ensure_table(self, table: str) -> None:
        """Create the key-value table if it does not exist."""
        name = _table_name(table)
        with self._lock:
            self._create(name)

    def put_many(
        self, rows: Sequence[tuple[str, Any, Any]], *, meta: Mapping[str, Any] | None = None
    ) -> None:
        """Insert or replace many rows ``(table, k, value)`` in one transaction, without keys."""
        self._apply([(self._row(t, k, v, meta), None) for t, k, v in rows])

    def put(
        self,
        table: str,
        k: Any,
        value: Any,
        *,
        key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Insert or replace one row (one transaction); False if ``key`` was already applied.

        ``value`` must be JSON-serialisable and not None (None is how `RowWrite` says delete).
        """
        if value is None:
            raise ValueError("put: value None is not storable (use delete)")
        return self._apply([(self._row(table, k, value, meta), key)])[0]

    def delete(
        self,
        table: str,
        k: Any,
        *,
        key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Delete one row (one transaction); False if ``key`` was already applied.

        Deleting an absent row is a blind write: it returns True and records its key.
        """
        return self._apply([(self._row(table, k, None, meta), key)])[0]

    def apply_batch(self, effects: Sequence[Effect], *, _fail_after_rows: bool = False) -> None:
        """Apply the effects' `RowWrite` payloads in ONE transaction, each at most once by key.

        All or nothing: on any exception the transaction is rolled back and the exception
        re-raised. Effects whose key is already applied (or repeated within the batch) are skipped
        and logged as ``"dedup"``. ``_fail_after_rows`` is a test hook only: it raises after the
        row statements and before the applied-key statements, to show they commit together.
        """
        items: list[tuple[RowWrite, str | None]] = []
        for effect in effects:
            if not isinstance(effect.payload, RowWrite):
                raise TypeError(f"effect of {effect.tool!r}: payload is not a RowWrite")
            if effect.batch is not None and effect.batch is not self:
                raise ValueError(f"effect of {effect.tool!r} belongs to another batch applier")
            items.append((effect.payload, effect.key))
        self._apply(items, fail_after_rows=_fail_after_rows)

    def prune_keys(self, prefix: str) -> int:
        """Delete every applied key that starts with `prefix` (one transaction); returns how
        many went. Only for keys no retry can come for any more (recovery prunes a finished
        run's, ``<run>:``): a pruned key's row operation would apply again."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cur = self._conn.execute(
                    f"DELETE FROM {APPLIED_TABLE} WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
                )
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            return cur.rowcount

    # ---- internals ----------------------------------------------------------------------------

    def _apply(
        self, items: Sequence[tuple[RowWrite, str | None]], *, fail_after_rows: bool = False
    ) -> list[bool]:
        """The one commit path: rows, then their keys, then COMMIT; then the log."""
        if not items:
            return []
        # Encode every value before BEGIN: a value JSON cannot hold fails without a transaction.
        encoded = [None if rw.value is None else _dumps(rw.value) for rw, _ in items]
        with self._lock:
            applied: list[bool] = []
            new_keys: list[tuple[str, str, str, str]] = []
            seen: set[str] = set()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for (rw, key), v in zip(items, encoded, strict=True):
                    if key is not None and (key in seen or self._has_key(key)):
                        applied.append(False)
                        continue
                    self._create(rw.table)
                    if v is None:
                        self._conn.execute(f'DELETE FROM "{rw.table}" WHERE k = ?', (rw.k,))
                    else:
                        self._conn.execute(
                            f'INSERT INTO "{rw.table}" (k, v) VALUES (?, ?) '
                            "ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                            (rw.k, v),
                        )
                    applied.append(True)
                    if key is not None:
                        seen.add(key)
                        new_keys.append((key, rw.table, rw.k, _kind(rw)))
                if fail_after_rows:
                    raise _InjectedFailure("injected failure between row and applied-key writes")
                self._conn.executemany(
                    f"INSERT INTO {APPLIED_TABLE} (key, tbl, k, kind) VALUES (?, ?, ?, ?)",
                    new_keys,
                )
                self._conn.execute("COMMIT")
            except BaseException:
                # SQLite may already have rolled back on its own (e.g. a failed COMMIT); a second
                # ROLLBACK would then raise and hide the real error.
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                # A table created inside the rolled-back transaction is gone again.
                self._tables.clear()
                raise
            # Logged after COMMIT (a rolled-back row is no mutation) and before the lock is
            # released (so log order is commit order).
            if self._oplog is not None:
                for (rw, key), ok in zip(items, applied, strict=True):
                    kind = _kind(rw) if ok else "dedup"
                    self._oplog.append(
                        SUBSTRATE, self.scope(rw.table, rw.k), kind, key=key, meta=rw.meta
                    )
            return applied

    def _row(self, table: str, k: Any, value: Any, meta: Mapping[str, Any] | None) -> RowWrite:
        name = _table_name(table)
        return RowWrite(name, self.canonical_key(k), value, dict(meta) if meta else {})

    def _has_key(self, key: str) -> bool:
        row = self._conn.execute(f"SELECT 1 FROM {APPLIED_TABLE} WHERE key = ?", (key,))
        return row.fetchone() is not None

    def _create(self, name: str) -> None:
        if name not in self._tables:
            self._conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{name}" (k TEXT PRIMARY KEY, v TEXT NOT NULL)'
            )
            self._tables.add(name)

    def _table_exists(self, name: str) -> bool:
        if name in self._tables:
            return True
        row = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return row is not None

    def _user_tables(self) -> list[str]:
        rows = self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall()
        return [r[0] for r in rows if not _reserved(r[0])]


def row_effect(
    store: SQLiteStore,
    table: str,
    k: Any,
    value: Any,
    *,
    key: str,
    tool: str = "sqlite.put",
    meta: Mapping[str, Any] | None = None,
) -> Effect:
    """A BUFFERABLE effect that puts ``value`` at ``(table, k)`` (``value`` None: deletes the row).

    It settles through ``store.apply_batch`` (``batch=store``) or, one row at a time, through
    ``apply``; either way ``key`` makes it apply at most once.
    """
    rw = store._row(table, k, value, meta)
    if value is not None:
        _dumps(value)  # a value JSON cannot hold fails now, at staging, not at commit

    def apply() -> bool:
        if rw.value is None:
            return store.delete(rw.table, rw.k, key=key, meta=rw.meta)
        return store.put(rw.table, rw.k, rw.value, key=key, meta=rw.meta)

    return Effect(
        tool=tool,
        effect_class=EffectClass.BUFFERABLE,
        scopes=(store.scope_object(rw.table, rw.k),),
        key=key,
        apply=apply,
        batch=store,
        payload=rw,
    )


def _switch_to_wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode, waiting (up to `_BUSY_TIMEOUT`) for other processes.

    Switching a new file to WAL needs an exclusive lock, and SQLite reports SQLITE_BUSY for it
    at once, without its busy handler: processes that open one fresh database together would
    fail with "database is locked". So the switch is retried, with a short growing sleep.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _kind(rw: RowWrite) -> str:
    return "delete" if rw.value is None else "upsert"


def _dumps(value: Any) -> str:
    # sort_keys: one value, one text (snapshots and tests compare decoded values anyway).
    return json.dumps(value, sort_keys=True, allow_nan=False)


def _reserved(name: str) -> bool:
    return name.startswith("sqlite_") or name.startswith("_atomix")


def _table_name(table: str) -> str:
    """The canonical table name, as the core spells it in scopes (`sqlite_table`: SQLite
    identifiers are case-insensitive), restricted to names safe to quote in SQL."""
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise ValueError(f"table name {table!r}: letters, digits and _ only, not a leading digit")
    name = sqlite_table(table)
    if _reserved(name):
        raise ValueError(f"table name {table!r} is reserved")
    return name

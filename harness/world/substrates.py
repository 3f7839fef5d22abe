"""The real substrates of one trial, each with its own ground-truth reader.

Every trial gets a fresh temporary directory holding a directory of real files and an
append-only mailbox file, a SQLite database and an in-memory buffer; all of them write every
real mutation to one operation log below the mechanisms under test.

A trial's stores are throwaway: nothing reads them after the trial, and no experiment here
crashes the machine under them. So by default (`durable=False`) the directory is on a RAM-backed
file system when the machine has one (/dev/shm), the file store skips its fsyncs and SQLite
runs in memory: the same code paths and the same records, without a disk in the loop. A
config with `durable: true` puts them on disk, written as a production deployment would
(fsync per file write, SQLite `synchronous=FULL`). The crash and kill tests use the adapters
on real directories of their own, not these trial stores.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from atomix.adapters import FileStore, MailboxSink, OpLog, SQLiteStore
from atomix.adapters.sqlite import APPLIED_TABLE
from atomix.scope_kinds import named_scope
from atomix.scopes import Scope

#: RAM-backed file systems tried, in order, for throwaway trial directories.
RAM_DIRS = (Path("/dev/shm"),)


class BufferStore:
    """An in-memory key-value substrate with idempotency keys and op logging.

    Keys of the store are scoped `buf:<name>`; values are JSON-like and deep-copied in and
    out so no caller can alias the ground truth.
    """

    def __init__(self, oplog: OpLog | None = None) -> None:
        self._data: dict[str, Any] = {}
        self._keys: set[str] = set()
        self._oplog = oplog
        self._lock = threading.Lock()

    @staticmethod
    def scope(name: str) -> str:
        return str(named_scope(f"buf:{name}"))

    def get(self, name: str, *, log_read: bool = False, meta: Mapping[str, Any] | None = None) -> Any:
        with self._lock:
            if log_read and self._oplog is not None:
                self._oplog.append("buffer", self.scope(name), "read", meta=meta)
            return copy.deepcopy(self._data.get(name))

    def _mutate(self, name: str, kind: str, key: str | None, meta: Mapping[str, Any] | None, fn: Any) -> bool:
        with self._lock:
            if key is not None and key in self._keys:
                if self._oplog is not None:
                    self._oplog.append("buffer", self.scope(name), "dedup", key=key, meta=meta)
                return False
            fn()
            if key is not None:
                self._keys.add(key)
            if self._oplog is not None:
                self._oplog.append("buffer", self.scope(name), kind, key=key, meta=meta)
            return True

    def put(self, name: str, value: Any, *, key: str | None = None, meta: Mapping[str, Any] | None = None) -> bool:
        value = copy.deepcopy(value)
        return self._mutate(name, "write", key, meta, lambda: self._data.__setitem__(name, value))

    def delete(self, name: str, *, key: str | None = None, meta: Mapping[str, Any] | None = None) -> bool:
        return self._mutate(name, "delete", key, meta, lambda: self._data.pop(name, None))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._data)


class MemorySQLiteStore(SQLiteStore):
    """A `SQLiteStore` whose database lives in this process's memory, not in a file.

    Same tables, transactions, applied-key table, op log and scopes as a `SQLiteStore` at
    `path` (the path only names the database in scopes; no file is created): every guarantee
    of `SQLiteStore` holds except surviving the process. For throwaway trial databases.
    """

    def __init__(self, path: Path | str, *, oplog: OpLog | None = None) -> None:
        # SQLiteStore.__init__ opens `path` itself; this mirrors its state on ":memory:"
        # (tests/test_retail_cow.py holds both to the same guarantees).
        self._path = Path(path).absolute()
        self._oplog = oplog
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} ("
            "key TEXT PRIMARY KEY, tbl TEXT NOT NULL, k TEXT NOT NULL, kind TEXT NOT NULL)"
        )
        self._tables: set[str] = set()
        self._scopes: dict[tuple[str, type, Any], Scope] = {}

    def scope_object(self, table: str, k: Any = None) -> Scope:
        # A scope is a function of (path, table, key) alone, and `sqlite_scope` resolves the
        # path through the file system on every call; here each one is built once.
        key = (table, type(k), k)
        try:
            return self._scopes[key]
        except KeyError:
            scope = self._scopes[key] = super().scope_object(table, k)
            return scope
        except TypeError:  # an unhashable key: the store's own error
            return super().scope_object(table, k)


@functools.lru_cache(maxsize=1)
def ram_dir() -> Path | None:
    """A writable RAM-backed directory for throwaway trial directories, or None if none."""
    for candidate in RAM_DIRS:
        if candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return None


class TrialEnv:
    """One trial's substrates in a fresh directory; `snapshot()` reads the ground truth.

    The directory and the file, SQLite and mailbox substrates are created on first use, so a
    workload that never touches one pays nothing for it; an untouched substrate reads as empty.
    `durable` (see the module docstring) says whether the stores must survive a power loss:
    False keeps SQLite in memory and lets the file store skip fsync; it changes no result.
    """

    def __init__(self, workdir: Path | None, *, owns_dir: bool = False, durable: bool = False,
                 parent: Path | None = None) -> None:
        self._workdir = workdir
        self._parent = parent  # where `workdir` is made on first use, when it is None
        self.durable = durable
        self.oplog = OpLog()
        self.buffer = BufferStore(self.oplog)
        self.extra: dict[str, Any] = {}
        self._owns_dir = owns_dir
        self._files: FileStore | None = None
        self._db: SQLiteStore | None = None
        self._mailbox: MailboxSink | None = None

    @classmethod
    def create(cls, parent: Path | None = None, *, durable: bool = False) -> TrialEnv:
        """A trial environment whose directory is made, on first use, in `parent` (kept at
        close) or else in a temporary place (removed at close): RAM-backed unless durable."""
        owns_dir = parent is None
        if parent is None and not durable:
            parent = ram_dir()  # None: the system's temporary directory
        return cls(None, owns_dir=owns_dir, durable=durable, parent=parent)

    @property
    def workdir(self) -> Path:
        """The trial's own directory (made on first use)."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="atomix-trial-", dir=self._parent))
        return self._workdir

    @property
    def files(self) -> FileStore:
        if self._files is None:
            self._files = FileStore(self.workdir / "files", oplog=self.oplog, durable=self.durable)
        return self._files

    @property
    def db(self) -> SQLiteStore:
        if self._db is None:
            path = self.workdir / "db.sqlite"
            self._db = (SQLiteStore(path, oplog=self.oplog, durable=True) if self.durable
                        else MemorySQLiteStore(path, oplog=self.oplog))
        return self._db

    @property
    def mailbox(self) -> MailboxSink:
        if self._mailbox is None:
            self._mailbox = MailboxSink(self.workdir / "mailbox.jsonl", oplog=self.oplog)
        return self._mailbox

    def messages(self) -> list[dict[str, Any]]:
        """The sink's own file, read back (empty if nothing was ever sent)."""
        return self._mailbox.messages() if self._mailbox is not None else []

    def snapshot(self) -> dict[str, Any]:
        """Ground truth, read from the substrates themselves (files, database, mailbox file)."""
        files = {}
        if self._files is not None:
            files = {p: b.decode("utf-8", "replace") for p, b in sorted(self._files.snapshot().items())}
        mail = [{"to": m["to"], "subject": m["subject"], "body": m["body"]} for m in self.messages()]
        snap: dict[str, Any] = {
            "buffer": self.buffer.snapshot(),
            "files": files,
            "db": self._db.snapshot() if self._db is not None else {},
            "mailbox": sorted(mail, key=lambda m: json.dumps(m, sort_keys=True)),
        }
        for name, sub in sorted(self.extra.items()):
            if hasattr(sub, "snapshot"):
                snap[name] = sub.snapshot()
        return snap

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
        self.oplog.close()
        if self._owns_dir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

"""The real substrates of one trial, each with its own ground-truth reader.

Every trial gets a fresh temporary directory holding a directory of real files, a SQLite
database file and an append-only mailbox file, plus an in-memory buffer; all of them write
every real mutation to one operation log below the mechanisms under test.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from atomix.adapters import FileStore, MailboxSink, OpLog, SQLiteStore
from atomix.scopes import named_scope


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


class TrialEnv:
    """One trial's substrates in a fresh directory; `snapshot()` reads the ground truth.

    The file, SQLite and mailbox substrates are created on first use, so a workload that
    never touches one pays nothing for it; an untouched substrate reads as empty.
    """

    def __init__(self, workdir: Path, *, owns_dir: bool = False) -> None:
        self.workdir = workdir
        self.oplog = OpLog()
        self.buffer = BufferStore(self.oplog)
        self.extra: dict[str, Any] = {}
        self._owns_dir = owns_dir
        self._files: FileStore | None = None
        self._db: SQLiteStore | None = None
        self._mailbox: MailboxSink | None = None

    @classmethod
    def create(cls, parent: Path | None = None) -> TrialEnv:
        workdir = Path(tempfile.mkdtemp(prefix="atomix-trial-", dir=parent))
        return cls(workdir, owns_dir=parent is None)

    @property
    def files(self) -> FileStore:
        if self._files is None:
            self._files = FileStore(self.workdir / "files", oplog=self.oplog, durable=False)
        return self._files

    @property
    def db(self) -> SQLiteStore:
        if self._db is None:
            self._db = SQLiteStore(self.workdir / "db.sqlite", oplog=self.oplog, durable=False)
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
        """Ground truth, read from the substrates themselves (files, db file, mailbox file)."""
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
        if self._owns_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

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
from dataclasses import dataclass, field
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


@dataclass
class TrialEnv:
    """One trial's substrates in a fresh directory; `snapshot()` reads the ground truth."""

    workdir: Path
    oplog: OpLog
    buffer: BufferStore
    files: FileStore
    db: SQLiteStore
    mailbox: MailboxSink
    extra: dict[str, Any] = field(default_factory=dict)
    _owns_dir: bool = False

    @classmethod
    def create(cls, parent: Path | None = None) -> TrialEnv:
        owns = parent is None
        workdir = Path(tempfile.mkdtemp(prefix="atomix-trial-", dir=parent))
        oplog = OpLog()
        return cls(
            workdir=workdir,
            oplog=oplog,
            buffer=BufferStore(oplog),
            files=FileStore(workdir / "files", oplog=oplog, durable=False),
            db=SQLiteStore(workdir / "db.sqlite", oplog=oplog, durable=False),
            mailbox=MailboxSink(workdir / "mailbox.jsonl", oplog=oplog),
            _owns_dir=owns,
        )

    def snapshot(self) -> dict[str, Any]:
        """Ground truth, read from the substrates themselves (files, db file, mailbox file)."""
        files = {p: b.decode("utf-8", "replace") for p, b in sorted(self.files.snapshot().items())}
        mail = [
            {"to": m["to"], "subject": m["subject"], "body": m["body"]} for m in self.mailbox.messages()
        ]
        snap: dict[str, Any] = {
            "buffer": self.buffer.snapshot(),
            "files": files,
            "db": self.db.snapshot(),
            "mailbox": sorted(mail, key=lambda m: json.dumps(m, sort_keys=True)),
        }
        for name, sub in sorted(self.extra.items()):
            if hasattr(sub, "snapshot"):
                snap[name] = sub.snapshot()
        return snap

    def close(self) -> None:
        self.db.close()
        self.oplog.close()
        if self._owns_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

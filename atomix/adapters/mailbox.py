"""A mail sink: the irreversible substrate, an append-only JSON Lines file of sent messages."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from atomix.adapters.oplog import OpLog, fsync_dir, truncate_torn_tail
from atomix.scope_kinds import mail_address, mail_scope

SUBSTRATE = "mail"


class MailboxSink:
    """An append-only outbox on a real file: what was sent stays sent.

    Guarantees:
    - `send` returns only after its record is written and fsynced; one record is one line, so the
      message and its idempotency key become durable together (there is no window in which one is
      on disk without the other).
    - With a key, a message is appended at most once, also across processes that reopen the file:
      the applied-key set is rebuilt from the file at open.
    - Nothing in this API removes or rewrites a record; the file is only ever opened for append.
      (At open, a final record torn by a crash, i.e. without its newline and never acknowledged,
      is cut off so that the next record does not fuse with it.)
    - `messages` reads the file, never an in-memory copy.

    One `MailboxSink` per file per process: two instances on one file would not see each other's
    keys until reopened.
    """

    def __init__(self, path: Path | str, *, oplog: OpLog | None = None) -> None:
        self._path = Path(path).absolute()  # recovery may run from another directory
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._oplog = oplog
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._count = 0
        if self._path.exists():
            truncate_torn_tail(self._path)
            for record in self._read_records():
                self._count += 1
                if record.get("key") is not None:
                    self._keys.add(record["key"])

    @property
    def path(self) -> Path:
        """The outbox file (the ground truth)."""
        return self._path

    @staticmethod
    def scope(to: str) -> str:
        """The canonical scope of a recipient, the core's `mail_scope`: ``mail:<address folded>``."""
        return str(mail_scope(to))

    def send(
        self,
        to: str,
        subject: str,
        body: str,
        *,
        key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Append one message; False (and nothing appended) if ``key`` was already sent."""
        address = mail_address(to)
        scope = self.scope(address)
        meta_dict = dict(meta) if meta else {}
        with self._lock:
            if key is not None and key in self._keys:
                if self._oplog is not None:
                    self._oplog.append(SUBSTRATE, scope, "dedup", key=key, meta=meta_dict)
                return False
            record = {
                "seq": self._count + 1,
                "to": address,
                "subject": subject,
                "body": body,
                "key": key,
                "meta": meta_dict,
            }
            # Serialise before touching the file: a record JSON cannot hold fails here, cleanly.
            line = json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"
            created = not self._path.exists()
            with open(self._path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            if created:
                # The file's directory entry must be durable too, or a crash could lose the file.
                fsync_dir(self._path.parent)
            self._count += 1
            if key is not None:
                self._keys.add(key)
            if self._oplog is not None:
                self._oplog.append(SUBSTRATE, scope, "append", key=key, meta=meta_dict)
            return True

    def messages(self) -> list[dict[str, Any]]:
        """Every message in the file, in send order (read from the file itself)."""
        with self._lock:
            return self._read_records()

    def applied_keys(self) -> frozenset[str]:
        """The idempotency keys of the messages sent so far."""
        with self._lock:
            return frozenset(self._keys)

    def _read_records(self) -> list[dict[str, Any]]:
        if not self._path.exists():
            return []
        text = self._path.read_text(encoding="utf-8")
        # Everything after the last newline is an unfinished append: not (yet) a message.
        lines = text.split("\n")[:-1]
        out: list[dict[str, Any]] = []
        for n, line in enumerate(lines, start=1):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                # A complete but unreadable line is corruption of the ground truth: say so loudly.
                raise ValueError(f"{self._path}:{n}: corrupt mailbox record") from exc
        return out

"""Stores: the lowest layer, which performs the real I/O on each substrate, and the
ready-made runtime tools over them (`file_tools`, `sqlite_tools`, `mail_tools`).

Every mutation of a substrate passes through exactly one store call per delivery; each store
deduplicates by idempotency key and records what it really did in an `OpLog`.
"""

from __future__ import annotations

from typing import Any

from atomix.adapters.filesystem import FileStore
from atomix.adapters.mailbox import MailboxSink
from atomix.adapters.oplog import Op, OpLog
from atomix.adapters.sqlite import RowWrite, SQLiteStore, row_effect

_TOOLS = frozenset({"FileTools", "MailTools", "SQLiteTools", "file_tools", "mail_tools", "sqlite_tools"})

__all__ = [
    "FileStore",
    "FileTools",
    "MailTools",
    "MailboxSink",
    "Op",
    "OpLog",
    "RowWrite",
    "SQLiteStore",
    "SQLiteTools",
    "file_tools",
    "mail_tools",
    "row_effect",
    "sqlite_tools",
]


def __getattr__(name: str) -> Any:
    # The tools import the runtime, which imports the stores lazily in turn: load them on
    # first use, so `from atomix.adapters import file_tools` works without an import cycle.
    if name in _TOOLS:
        from atomix.adapters import tools

        return getattr(tools, name)
    raise AttributeError(f"module 'atomix.adapters' has no attribute {name!r}")

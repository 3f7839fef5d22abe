"""Stores: the lowest layer, which performs the real I/O on each substrate.

Every mutation of a substrate passes through exactly one store call per delivery; each store
deduplicates by idempotency key and records what it really did in an `OpLog`.
"""

from atomix.adapters.filesystem import FileStore
from atomix.adapters.mailbox import MailboxSink
from atomix.adapters.oplog import Op, OpLog
from atomix.adapters.sqlite import RowWrite, SQLiteStore, row_effect

__all__ = ["FileStore", "MailboxSink", "Op", "OpLog", "RowWrite", "SQLiteStore", "row_effect"]

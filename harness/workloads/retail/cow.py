"""Each trial's own retail DB: copy-on-write over one shared, frozen pristine DB.

A record is copied into the trial the first time it is looked up by key, so a trial costs what
it touches, not a copy of the whole DB. `db_sha256` of a trial's DB is computed from the
pristine DB's text and the records the trial touched, and is the hex digest a full canonical
dump gives (`harness.workloads.retail.data.full_sha256`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import marshal
import threading
from collections import OrderedDict
from collections.abc import ItemsView, Iterator, Mapping, MutableMapping, ValuesView
from dataclasses import dataclass
from typing import Any, NoReturn

from harness.workloads.retail.data import (
    RetailData,
    canonical,
    freeze_long_lived,
    full_sha256,
)

_READ_ONLY = (
    "a record of the shared pristine retail DB is read-only: look it up by key in the trial's "
    "table (db[table][id]) to get the trial's own copy before changing it"
)


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that refuses every change (TypeError); copies of it are plain, mutable dicts.

    Guarantees: no method changes it; `copy.copy` gives a plain dict (children shared, still
    frozen), `copy.deepcopy` a plain deep copy; it reads, compares and encodes to JSON like the
    dict it holds.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(_READ_ONLY)

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        return thaw(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


class FrozenList(list):  # type: ignore[type-arg]
    """A list that refuses every change (TypeError); copies of it are plain, mutable lists."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(_READ_ONLY)

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return thaw(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def freeze(value: Any) -> Any:
    """`value` with every dict and list replaced by a frozen one (JSON-like values)."""
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList([freeze(v) for v in value])
    return value


def thaw(value: Any) -> Any:
    """A plain deep copy of a JSON-like value, frozen or not."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value


def _copy(value: Any) -> Any:
    """A deep copy of a JSON-like value: marshal (fast) for plain data, else copy.deepcopy."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:  # a frozen record or a value marshal cannot hold
        return copy.deepcopy(value)


#: Final states whose changed records add up to at most this many bytes of JSON are cached by
#: those records (most trials of a task end in one of a few states); bigger ones are not.
_CACHE_RECORD_BYTES = 64 * 1024


_CACHE_STATES = 4096


@dataclass(frozen=True)
class _Span:
    """Where one record's canonical JSON sits in the pristine DB's canonical text."""

    start: int
    end: int
    index: int  # position in canonical order, which is also its checkpoint's index


class PristineDB:
    """The initial DB of one `RetailData`, shared read-only by every trial of a process.

    Guarantees: it never changes (records are `FrozenDict`s, tables too); `sha256(db)` equals
    the sha256 of the canonical JSON of `db` for any DB, and for a `cow_db` of this pristine
    DB it costs the records the trial touched plus one sha256 pass over the text from the
    first changed record on (a result seen before costs a dict lookup).
    """

    def __init__(self, image: bytes) -> None:
        plain = marshal.loads(image)  # a private copy: later changes to data.db cannot reach it
        self.tables: dict[str, FrozenDict] = {}
        self.images: dict[str, dict[str, bytes]] = {}
        self.other: dict[str, bytes] = {}  # top-level values that are not tables (none in tau2)
        for name, value in plain.items():
            if isinstance(value, dict) and all(isinstance(r, dict) for r in value.values()):
                self.tables[name] = FrozenDict({rid: freeze(r) for rid, r in value.items()})
                self.images[name] = {rid: marshal.dumps(r) for rid, r in value.items()}
            else:
                self.other[name] = marshal.dumps(value)
        self.keys = tuple(plain)
        self._spans: dict[str, dict[str, _Span]] = {}
        self._states: list[Any] = []  # sha256 of the text before each record, in text order
        self._text = self._build(plain)
        self.sha256_hex = hashlib.sha256(self._text).hexdigest()
        self._cache: OrderedDict[tuple[Any, ...], str] = OrderedDict()
        self._cache_lock = threading.Lock()

    def _build(self, plain: dict[str, Any]) -> bytes:
        """The canonical JSON of the DB, assembled record by record so that every record's
        byte span is known: a dict's canonical JSON is `{k:v,...}` over its sorted keys."""
        out = bytearray(b"{")
        digest = hashlib.sha256()
        hashed = 0
        for t_index, name in enumerate(sorted(plain)):
            out += (("," if t_index else "") + canonical(name) + ":").encode("utf-8")
            if name not in self.tables:
                out += canonical(plain[name]).encode("utf-8")
                continue
            out += b"{"
            spans = self._spans[name] = {}
            records = plain[name]
            for r_index, rid in enumerate(sorted(records)):
                out += (("," if r_index else "") + canonical(rid) + ":").encode("utf-8")
                start = len(out)
                digest.update(out[hashed:start])
                hashed = start
                index = len(self._states)
                self._states.append(digest.copy())
                out += canonical(records[rid]).encode("utf-8")
                spans[rid] = _Span(start, len(out), index)
            out += b"}"
        out += b"}"
        return bytes(out)

    def table(self, name: str) -> RecordTable:
        """A fresh copy-on-write view of table `name` for one trial."""
        return RecordTable(self, name)

    def sha256(self, db: Mapping[str, Any]) -> str:
        """sha256 hex of the canonical JSON of `db` (see the class docstring for the cost)."""
        changes = self._changes(db)
        if changes is None:
            return full_sha256(db)
        if not changes:
            return self.sha256_hex
        cacheable = sum(len(text) for _, _, text in changes) <= _CACHE_RECORD_BYTES
        key = tuple((span.index, text) for span, _, text in changes) if cacheable else None
        if key is not None:
            with self._cache_lock:  # trials may run in threads (e.g. a dask worker's)
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
                    return cached
        view = memoryview(self._text)
        digest = self._states[changes[0][0].index].copy()
        position = changes[0][0].start
        for span, _, text in changes:
            digest.update(view[position : span.start])
            digest.update(text)
            position = span.end
        digest.update(view[position:])
        hex_digest = digest.hexdigest()
        if key is not None:
            with self._cache_lock:
                self._cache[key] = hex_digest
                if len(self._cache) > _CACHE_STATES:
                    self._cache.popitem(last=False)
        return hex_digest

    def _changes(self, db: Mapping[str, Any]) -> list[tuple[_Span, str, bytes]] | None:
        """The records of `db` whose text differs from the pristine text, in text order, as
        (span, table, new text); None when `db` is not a plain `cow_db` of this pristine DB
        with the same records (added or removed records change the text's frame)."""
        if not isinstance(db, dict) or tuple(db) != self.keys or self.other:
            return None
        changes: list[tuple[_Span, str, bytes]] = []
        for name in self.keys:
            table = db[name]
            if not isinstance(table, RecordTable) or table.pristine is not self or table.name != name:
                return None
            if table.reshaped:
                return None
            spans = self._spans[name]
            for rid, record in table.local_items():
                span = spans[rid]
                text = canonical(record).encode("utf-8")
                if text != self._text[span.start : span.end]:
                    changes.append((span, name, text))
        changes.sort(key=lambda change: change[0].index)
        return changes


class _Items(ItemsView):  # type: ignore[type-arg]
    """Items without copying records into the trial (tau2's look-ups scan whole tables)."""

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        table: RecordTable = self._mapping  # type: ignore[assignment]
        return table.current_items()


class _Values(ValuesView):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[Any]:
        table: RecordTable = self._mapping  # type: ignore[assignment]
        return (record for _, record in table.current_items())


class RecordTable(MutableMapping[str, Any]):
    """One table of one trial's retail DB, copy-on-write over the shared pristine table.

    Guarantees: nothing done through it changes the pristine DB or any other table. A record
    looked up by key (`t[k]`, `t.get(k)`, `pop`, `setdefault`) is the trial's own mutable
    copy from then on, exactly as in a plain dict of records; keys, order (pristine order, then
    added keys), `in`, `len` and assignment behave as in a plain dict. A record reached by
    iteration (`values()`, `items()`) that was never looked up by key is the shared frozen
    record: reading it is free, changing it raises TypeError instead of leaking into other
    trials.
    """

    __slots__ = ("name", "pristine", "_base", "_images", "_local", "_deleted", "_added")

    def __init__(self, pristine: PristineDB, name: str) -> None:
        self.pristine = pristine
        self.name = name
        self._base = pristine.tables[name]
        self._images = pristine.images[name]
        self._local: dict[str, Any] = {}  # records of this trial: copied on lookup, or assigned
        self._deleted: set[str] = set()  # pristine keys deleted (perhaps added again since)
        self._added: dict[str, None] = {}  # keys iterated after the pristine ones, in order

    def __getitem__(self, key: str) -> Any:
        try:
            return self._local[key]
        except KeyError:
            pass
        if key in self._deleted or key not in self._base:
            raise KeyError(key)
        record = self._local[key] = marshal.loads(self._images[key])
        return record

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return key in self._local or (key in self._base and key not in self._deleted)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self:
            self._added[key] = None
        self._local[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._local.pop(key, None)
        if key in self._added:
            del self._added[key]
        else:
            self._deleted.add(key)

    def __iter__(self) -> Iterator[str]:
        if self._deleted:
            yield from (key for key in self._base if key not in self._deleted)
        else:
            yield from self._base
        yield from self._added

    def __len__(self) -> int:
        return len(self._base) - len(self._deleted) + len(self._added)

    def items(self) -> ItemsView[str, Any]:
        return _Items(self)

    def values(self) -> ValuesView[Any]:
        return _Values(self)

    def peek(self, key: str) -> Any:
        """The current record at `key` without copying it into the trial (read-only use)."""
        try:
            return self._local[key]
        except KeyError:
            pass
        if key in self._deleted:
            raise KeyError(key)
        return self._base[key]

    def current_items(self) -> Iterator[tuple[str, Any]]:
        """(key, record) in iteration order, without copying records into the trial."""
        local, deleted = self._local, self._deleted
        if not local and not deleted:
            yield from self._base.items()
            return
        for key, record in self._base.items():
            if key not in deleted:
                yield key, local.get(key, record)
        for key in self._added:
            yield key, local[key]

    def local_items(self) -> Iterator[tuple[str, Any]]:
        """(key, record) of every record this trial holds its own copy of."""
        return iter(self._local.items())

    @property
    def reshaped(self) -> bool:
        """Whether records were added or deleted (the key set differs from the pristine one)."""
        return bool(self._deleted or self._added)

    def fork(self) -> RecordTable:
        """An independent copy of this table's current state (costs the records it holds)."""
        twin = RecordTable(self.pristine, self.name)
        twin._local = {key: _copy(record) for key, record in self._local.items()}
        twin._deleted = set(self._deleted)
        twin._added = dict(self._added)
        return twin

    def __repr__(self) -> str:
        return f"<RecordTable {self.name}: {len(self)} records, {len(self._local)} own>"


@functools.lru_cache(maxsize=8)
def pristine(data: RetailData) -> PristineDB:
    """The shared pristine DB of `data` (built once per process, from its private image)."""
    base = PristineDB(data._image)
    freeze_long_lived()
    return base


def cow_db(data: RetailData) -> dict[str, Any]:
    """A trial's own DB: a plain dict of copy-on-write `RecordTable`s over `pristine(data)`.

    The retail tools use it as they use a plain dict DB; it costs what the trial touches.
    """
    base = pristine(data)
    db: dict[str, Any] = {}
    for name in base.keys:
        db[name] = base.table(name) if name in base.tables else marshal.loads(base.other[name])
    return db


def fork_db(db: Mapping[str, Any]) -> dict[str, Any]:
    """An independent copy of a DB's current state: cheap for a `cow_db`, a deep copy else."""
    return {
        name: table.fork() if isinstance(table, RecordTable) else copy.deepcopy(table)
        for name, table in db.items()
    }


def db_sha256(db: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of `db` (sorted keys, compact, UTF-8).

    A `cow_db` is hashed from its pristine DB's text and the records it touched (same digest).
    """
    for table in db.values():
        if isinstance(table, RecordTable):
            return table.pristine.sha256(db)
        break
    return full_sha256(db)

"""Scopes: canonical, hierarchical names of the resources a transaction reads and mutates.

Conflict is decided by overlap, not string equality: `fs:/repo` covers `fs:/repo/src/app.py`,
a table covers its rows, a URL path covers its extensions. This module holds the `Scope` value
and its overlap order, and each kind's canonical spelling of its parts (`FOLDS`: SQLite tables
and mail addresses fold case), which `Scope()` itself enforces so that one resource never has
two scopes. Making scopes from paths, URLs and names is `atomix.scope_kinds`; reading scope
texts, templates and the runtime's scope policy is `atomix.scope_parsing`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from atomix.errors import ScopeError

__all__ = ["FOLDS", "Scope"]

KIND_RE = re.compile(r"[a-z0-9_][a-z0-9_.+-]*")
# Only the canonical decimal form of an integer; "042" is a different (string) key, and
# non-ASCII digits are not integers, though int() would accept them.
INT_RE = re.compile(r"-?(?:0|[1-9][0-9]*)")

# Least number of parts a scope of this kind has (the fs root has none); others need one.
_MIN_PARTS = {"fs": 0}


@dataclass(frozen=True, slots=True, order=True)
class Scope:
    """The canonical name of one resource, a node in a per-kind hierarchy.

    Guarantees: immutable and hashable; equality, hashing and ordering depend only on
    (kind, parts); `a.covers(b)` iff same kind and `a.parts` is a prefix of `b.parts`, so
    `covers` is a partial order and `overlaps` is symmetric; the text `str(s)` is computed
    once, and for scopes built by this package's constructors `parse_scope(str(s)) == s`.
    """

    kind: str
    parts: tuple[str, ...]
    _key: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _text: str = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.parts, list):
            object.__setattr__(self, "parts", tuple(self.parts))
        _check_structure(self.kind, self.parts)
        object.__setattr__(self, "_key", (self.kind, *self.parts))
        object.__setattr__(self, "_text", _render(self.kind, self.parts))
        # Scopes key frontier and version maps; hashing must not rebuild a tuple every time.
        object.__setattr__(self, "_hash", hash(self._key))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Scope:
            return NotImplemented
        return self is other or self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Scope], tuple[str, tuple[str, ...]]]:
        # Rebuild on unpickling: the cached str hash is only valid in the process that made it.
        return (Scope, (self.kind, self.parts))

    def __str__(self) -> str:
        return self._text

    @property
    def key(self) -> tuple[str, ...]:
        """(kind, *parts), precomputed: a trie path on which a prefix covers its extensions."""
        return self._key

    def covers(self, other: Scope) -> bool:
        """True when `other` is this scope or lies below it in the same kind."""
        mine = self._key
        theirs = other._key
        n = len(mine)
        return n <= len(theirs) and theirs[:n] == mine

    def overlaps(self, other: Scope) -> bool:
        """True when the two scopes can name a common resource (one covers the other)."""
        a = self._key
        b = other._key
        if len(a) > len(b):
            a, b = b, a
        return b[: len(a)] == a

    def parent(self) -> Scope | None:
        """The scope one level up, or None at the top of the kind (fs root, URL origin, ...)."""
        if len(self.parts) <= _MIN_PARTS.get(self.kind, 1) or self.kind == "raw":
            return None
        return Scope(self.kind, self.parts[:-1])


def _check_structure(kind: object, parts: object) -> None:
    """Reject a (kind, parts) pair whose text would not parse back to the same scope."""
    if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
        raise ScopeError(f"scope kind must match {KIND_RE.pattern!r}, got {kind!r}")
    if not isinstance(parts, tuple) or not all(isinstance(p, str) and p for p in parts):
        raise ScopeError(f"scope parts must be a tuple of non-empty strings, got {parts!r}")
    if len(parts) < _MIN_PARTS.get(kind, 1):
        raise ScopeError(f"a {kind!r} scope needs at least one part, got {parts!r}")
    if kind == "fs":
        for p in parts:
            if "/" in p or p in (".", ".."):
                raise ScopeError(f"fs scope part {p!r} is not a single path component")
    elif kind == "raw":
        if len(parts) != 1:
            raise ScopeError(f"a raw scope has exactly one part, got {parts!r}")
    elif kind == "url":
        if "://" not in parts[0]:
            raise ScopeError(f"url scope must start with scheme://host, got {parts[0]!r}")
        last = len(parts) - 1
        for i, p in enumerate(parts[1:], start=1):
            is_query = p.startswith("?")
            if (is_query and i != last) or (not is_query and "/" in p):
                raise ScopeError(f"url scope part {p!r} is not a path segment or final query")
    elif kind == "sqlite" and parts[0].startswith("/"):
        # A real database file: (db, table[, key]); only the key may hold ':'.
        if len(parts) > 3 or any(":" in p for p in parts[:2]):
            raise ScopeError(f"sqlite scope parts must be (db, table[, key]), got {parts!r}")
    else:
        for p in parts:
            if ":" in p or p != named_part(p, p):
                raise ScopeError(f"scope part {p!r} of kind {kind!r} is not canonical")
    fold = FOLDS.get(kind)
    if fold is not None and fold(parts) != parts:
        # Otherwise one resource would have two scopes (and parse_scope(str(s)) != s).
        raise ScopeError(f"scope parts {parts!r} of kind {kind!r} are not in canonical spelling")


def _render(kind: str, parts: tuple[str, ...]) -> str:
    if kind == "fs":
        return "fs:/" + "/".join(parts)
    if kind == "raw":
        return parts[0]
    if kind == "url":
        tail = parts[1:]
        query = ""
        if tail and tail[-1].startswith("?"):
            query = tail[-1]
            tail = tail[:-1]
        return parts[0] + "/" + "/".join(tail) + query
    return kind + ":" + ":".join(parts)


def named_part(part: str, text: str) -> str:
    """One part of a `kind:part:part` name: trimmed, and an integer in its canonical form."""
    stripped = part.strip()
    if not stripped:
        raise ScopeError(f"scope {text!r} has an empty part")
    if INT_RE.fullmatch(stripped):
        return "0" if stripped == "-0" else stripped
    return stripped


# --------------------------------------------------------------------------- spelling

# SQLite folds identifiers for ASCII letters only ("Orders" is "orders", "Ä" is not "ä"), so
# folding exactly those neither misses a conflict nor orders two distinct tables.
ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _fold_sqlite(parts: tuple[str, ...]) -> tuple[str, ...]:
    # (db, table[, key]) for a database file, (table, ...) for a named handle: fold the table.
    i = 1 if parts[0].startswith("/") else 0
    if len(parts) <= i:
        return parts
    return (*parts[:i], parts[i].translate(ASCII_LOWER), *parts[i + 1 :])


def _fold_mail(parts: tuple[str, ...]) -> tuple[str, ...]:
    # Domains are case-insensitive (RFC 5321); local parts may be case-sensitive by the letter
    # of it, yet practically every server folds them. Folding them too can at worst order two
    # sends that needed no ordering; not folding could miss a conflict between two spellings
    # of one mailbox. So the whole address (every part) is folded.
    return tuple(p.lower() for p in parts)


#: Each kind's canonical parts, idempotent: applied by `named_scope` and required by Scope()
#: itself. A kind without an entry keeps its parts as `named_part` makes them.
FOLDS: dict[str, Callable[[tuple[str, ...]], tuple[str, ...]]] = {
    "sqlite": _fold_sqlite,
    "mail": _fold_mail,
}

"""Scopes: canonical, hierarchical names of the resources a transaction reads and mutates.

Conflict is decided by overlap, not string equality: `fs:/repo` covers `fs:/repo/src/app.py`,
a table covers its rows, a URL path covers its extensions. Canonicalisation makes aliases of one
resource (`/repo/./src/../src/app.py`, a symlink to it, the row key `"42"` and `42`) one scope.
Each kind's spelling rules (SQLite tables and mail addresses fold case, paths resolve, URLs
normalise) live here, in one registry (`_SCHEMES`), and the adapters take them from here.
"""

from __future__ import annotations

import math
import operator
import os
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from atomix.errors import ScopeError

__all__ = [
    "CANONICAL",
    "NAIVE",
    "Scope",
    "ScopePolicy",
    "fs_scope",
    "mail_address",
    "mail_scope",
    "named_scope",
    "naive_scope",
    "parse_scope",
    "root_is_checked",
    "scope_within",
    "sqlite_scope",
    "sqlite_table",
    "template_root",
    "url_scope",
]

_KIND_RE = re.compile(r"[a-z0-9_][a-z0-9_.+-]*")
# Only the canonical decimal form of an integer; "042" is a different (string) key, and
# non-ASCII digits are not integers, though int() would accept them.
_INT_RE = re.compile(r"-?(?:0|[1-9][0-9]*)")
_URL_PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.-]*")

# Kinds whose text is not "kind:part:part"; named_scope must not be able to forge them.
_RESERVED_KINDS = frozenset({"fs", "url", "raw"})
# Least number of parts a scope of this kind has (the fs root has none); others need one.
_MIN_PARTS = {"fs": 0}

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_PCHAR = _UNRESERVED | frozenset("!$&'()*+,;=:@")
_QCHAR = _PCHAR | frozenset("/?")
_HEX = frozenset(string.hexdigits)


@dataclass(frozen=True, slots=True, order=True)
class Scope:
    """The canonical name of one resource, a node in a per-kind hierarchy.

    Guarantees: immutable and hashable; equality, hashing and ordering depend only on
    (kind, parts); `a.covers(b)` iff same kind and `a.parts` is a prefix of `b.parts`, so
    `covers` is a partial order and `overlaps` is symmetric; the text `str(s)` is computed
    once, and for scopes built by this module's constructors `parse_scope(str(s)) == s`.
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
        return self is other or self._key == other._key  # type: ignore[attr-defined]

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
    if not isinstance(kind, str) or not _KIND_RE.fullmatch(kind):
        raise ScopeError(f"scope kind must match {_KIND_RE.pattern!r}, got {kind!r}")
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
            if ":" in p or p != _named_part(p, p):
                raise ScopeError(f"scope part {p!r} of kind {kind!r} is not canonical")
    scheme = _SCHEMES.get(kind)
    if scheme is not None and scheme.fold is not None and scheme.fold(parts) != parts:
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


# --------------------------------------------------------------------------- file system


def _abs_path(path: object, *, resolve_symlinks: bool, what: str) -> str:
    try:
        text = os.fsdecode(os.fspath(path))  # type: ignore[arg-type]
    except TypeError:
        raise ScopeError(f"{what} must be a path, got {path!r}") from None
    if not text:
        raise ScopeError(f"{what} must not be empty, got {path!r}")
    if "\x00" in text:
        raise ScopeError(f"{what} contains a NUL byte: {path!r}")
    if not os.path.isabs(text):
        raise ScopeError(f"{what} must be absolute, got {path!r}")
    try:
        # realpath resolves symlinks before applying '..', which lexical normpath gets wrong.
        return os.path.realpath(text) if resolve_symlinks else os.path.normpath(text)
    except (OSError, ValueError) as exc:
        raise ScopeError(f"{what} {path!r} cannot be resolved: {exc}") from None


def _components(path: str) -> tuple[str, ...]:
    # Filtering empties also folds the POSIX-preserved leading '//' into '/'.
    return tuple(p for p in path.split("/") if p)


def fs_scope(
    path: str | os.PathLike[str], *, casefold: bool = False, resolve_symlinks: bool = True
) -> Scope:
    """Scope of a file or directory: `fs:/abs/path`; a directory covers everything below it."""
    resolved = _abs_path(path, resolve_symlinks=resolve_symlinks, what="fs scope path")
    if casefold:
        resolved = resolved.casefold()
    return Scope("fs", _components(resolved))


# --------------------------------------------------------------------------- sqlite


def _int_text(value: int) -> str:
    try:
        return str(value)
    except ValueError:  # more digits than sys.get_int_max_str_digits(); repr() fails alike
        raise ScopeError(f"row key (an int of {value.bit_length()} bits) is too large") from None


def _canonical_key(key: object) -> str:
    if isinstance(key, bool):
        raise ScopeError(f"row key must not be a bool, got {key!r}")
    if isinstance(key, int):
        return _int_text(int(key))  # int(): an IntEnum's str() would be its name
    if isinstance(key, float):
        if not math.isfinite(key) or not key.is_integer():
            raise ScopeError(f"row key float must be integral, got {key!r}")
        return str(int(key))
    if isinstance(key, str):
        if not key:
            raise ScopeError(f"row key must not be empty, got {key!r}")
        if _INT_RE.fullmatch(key):
            return "0" if key == "-0" else key
        return key
    if hasattr(type(key), "__index__"):  # numpy integers and the like
        try:
            value = operator.index(key)  # type: ignore[call-overload]
        except TypeError:
            pass
        else:
            return _int_text(value)
    raise ScopeError(f"row key must be an int, integral float or str, got {key!r}")


# SQLite folds identifiers for ASCII letters only ("Orders" is "orders", "Ä" is not "ä"), so
# folding exactly those neither misses a conflict nor orders two distinct tables.
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def sqlite_table(table: object) -> str:
    """The canonical spelling of a SQLite table name: SQLite identifiers are case-insensitive,
    so `Orders` and `orders` are one table and get one scope."""
    if not isinstance(table, str) or not table:
        raise ScopeError(f"sqlite table must be a non-empty string, got {table!r}")
    if ":" in table or table != table.strip() or any(ord(c) < 32 or ord(c) == 127 for c in table):
        raise ScopeError(f"sqlite table name {table!r} is not identifier-like")
    return table.translate(_ASCII_LOWER)


def _fold_sqlite(parts: tuple[str, ...]) -> tuple[str, ...]:
    # (db, table[, key]) for a database file, (table, ...) for a named handle: fold the table.
    i = 1 if parts[0].startswith("/") else 0
    if len(parts) <= i:
        return parts
    return (*parts[:i], parts[i].translate(_ASCII_LOWER), *parts[i + 1 :])


def _sqlite_db(db: object, casefold: bool) -> str:
    resolved = _abs_path(db, resolve_symlinks=True, what="sqlite database path")
    if casefold:
        resolved = resolved.casefold()
    if ":" in resolved:
        # The text form separates db, table and key with ':'; a db path holding one is ambiguous.
        raise ScopeError(f"sqlite database path must not contain ':', got {db!r}")
    return "/" + "/".join(_components(resolved))


def sqlite_scope(
    db: str | os.PathLike[str], table: str, key: object | None = None, *, casefold: bool = False
) -> Scope:
    """Scope of a table or one row of a SQLite file: `sqlite:/abs/shop.db:orders[:42]`.

    The database path is resolved like an fs path; the table name is folded (`sqlite_table`);
    the key `42`, `42.0`, `"42"` is one row.
    """
    parts = (_sqlite_db(db, casefold), sqlite_table(table))
    if key is not None:
        parts += (_canonical_key(key),)
    return Scope("sqlite", parts)


# --------------------------------------------------------------------------- URLs


def _normalise_pct(text: str, safe: frozenset[str]) -> str:
    """Decode escapes of unreserved characters, upper-case the rest, escape unsafe ones."""
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "%" and i + 2 < n and text[i + 1] in _HEX and text[i + 2] in _HEX:
            ch = chr(int(text[i + 1 : i + 3], 16))
            out.append(ch if ch in _UNRESERVED else "%" + text[i + 1 : i + 3].upper())
            i += 3
            continue
        if c in safe:
            out.append(c)
        else:
            try:
                raw = c.encode("utf-8")
            except UnicodeEncodeError:
                raise ScopeError(f"URL part {text!r} holds an unencodable character") from None
            out.append("".join(f"%{b:02X}" for b in raw))
        i += 1
    return "".join(out)


def _url_host(host: str, url: str) -> str:
    if any(c.isspace() or ord(c) < 32 for c in host):
        raise ScopeError(f"URL host must not contain whitespace or controls: {url!r}")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ScopeError(f"URL host is not a valid IDN: {url!r}") from None
    host = host.lower()
    return f"[{host}]" if ":" in host else host


def url_scope(url: str) -> Scope:
    """Scope of a URL, normalised per RFC 3986 §6.2.2; a path covers its extensions."""
    if not isinstance(url, str):
        raise ScopeError(f"URL must be a string, got {url!r}")
    text = url.strip()
    try:
        split = urlsplit(text)
        port = split.port
    except ValueError as exc:
        raise ScopeError(f"malformed URL {url!r}: {exc}") from None
    scheme = split.scheme.lower()
    if not scheme or not _SCHEME_RE.fullmatch(scheme):
        raise ScopeError(f"URL has no scheme: {url!r}")
    host = split.hostname
    if not split.netloc or not host:
        raise ScopeError(f"URL has no host: {url!r}")
    # Userinfo is dropped: it is a credential, not part of the resource's identity, and
    # keeping it would both split one resource into several scopes and leak secrets into logs.
    authority = _url_host(host, url)
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        authority += f":{port}"
    segments: list[str] = []
    for raw in split.path.split("/"):
        seg = _normalise_pct(raw, _PCHAR)
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    parts = (f"{scheme}://{authority}", *segments)
    params: list[tuple[str, str]] = []
    for item in split.query.split("&"):
        if not item:
            continue
        name, eq, value = item.partition("=")
        params.append((_normalise_pct(name, _QCHAR), eq + _normalise_pct(value, _QCHAR)))
    if params:
        # Sorted by name only, and stably: the order of repeated names can carry meaning.
        params.sort(key=lambda p: p[0])
        parts += ("?" + "&".join(name + rest for name, rest in params),)
    return Scope("url", parts)


# --------------------------------------------------------------------------- named scopes


def _named_part(part: str, text: str) -> str:
    stripped = part.strip()
    if not stripped:
        raise ScopeError(f"scope {text!r} has an empty part")
    if _INT_RE.fullmatch(stripped):
        return "0" if stripped == "-0" else stripped
    return stripped


def named_scope(text: str) -> Scope:
    """Scope of an opaque hierarchical name `kind:part:part`; a prefix covers its extensions."""
    if not isinstance(text, str):
        raise ScopeError(f"scope name must be a string, got {text!r}")
    if ":" not in text:
        raise ScopeError(f"scope name needs 'kind:part', got {text!r}")
    if _URL_PREFIX_RE.match(text.lstrip()):
        raise ScopeError(f"scope name {text!r} is a URL; use url_scope")
    head, *rest = text.split(":")
    kind = head.strip().lower()
    if not _KIND_RE.fullmatch(kind):
        raise ScopeError(f"scope kind {head!r} of {text!r} must match {_KIND_RE.pattern!r}")
    if kind in _RESERVED_KINDS:
        raise ScopeError(f"scope name {text!r} uses reserved kind {kind!r}")
    parts = tuple(_named_part(p, text) for p in rest)
    if kind == "sqlite" and parts[0].startswith("/"):
        raise ScopeError(f"scope name {text!r} names a database file; use sqlite_scope")
    scheme = _SCHEMES.get(kind)
    if scheme is not None and scheme.fold is not None:
        parts = scheme.fold(parts)
    return Scope(kind, parts)


# --------------------------------------------------------------------------- mail


def mail_address(address: object) -> str:
    """The canonical spelling of a mail address: trimmed and lower-cased as a whole."""
    if not isinstance(address, str) or not address.strip():
        raise ScopeError(f"mail address must be a non-empty string, got {address!r}")
    if ":" in address:
        # ':' separates scope parts: "a:b@x" would become a two-level scope, not one address.
        raise ScopeError(f"mail address must not contain ':', got {address!r}")
    return address.strip().lower()


def mail_scope(address: str) -> Scope:
    """Scope of one mailbox: `mail:alice@example.com`, spelt as `mail_address` spells it, so a
    user template `mail:{to}` and the mailbox adapter name one recipient alike."""
    return named_scope("mail:" + mail_address(address))


def _fold_mail(parts: tuple[str, ...]) -> tuple[str, ...]:
    # Domains are case-insensitive (RFC 5321); local parts may be case-sensitive by the letter
    # of it, yet practically every server folds them. Folding them too can at worst order two
    # sends that needed no ordering; not folding could miss a conflict between two spellings
    # of one mailbox. So the whole address (every part) is folded.
    return tuple(p.lower() for p in parts)


def naive_scope(text: str) -> Scope:
    """The naive-string ablation: the text itself, unnormalised; only identical texts overlap."""
    if not isinstance(text, str) or not text:
        raise ScopeError(f"naive scope needs a non-empty string, got {text!r}")
    return Scope("raw", (text,))


# --------------------------------------------------------------------------- parsing


def _parse_fs(rest: str, text: str, casefold: bool) -> Scope:
    # Leading blanks cannot start an absolute path; trailing ones may be in a file name.
    return fs_scope(rest.lstrip(), casefold=casefold)


def _parse_url(rest: str, text: str, casefold: bool) -> Scope:
    return url_scope(rest)


def _parse_sqlite(rest: str, text: str, casefold: bool) -> Scope:
    if not rest.startswith("/"):
        return named_scope(text)  # a handle such as `sqlite:orders:42`, not a file
    db, *fields = rest.split(":", 2)
    if not fields:
        # The whole database: the parent of its table scopes.
        return Scope("sqlite", (_sqlite_db(db, casefold),))
    return sqlite_scope(db, fields[0], fields[1] if len(fields) > 1 else None, casefold=casefold)


def _sqlite_within(root: Scope, scope: Scope) -> bool:
    # A root of one path part is a database file or a directory of them (a template's literal
    # prefix `sqlite:/data/` is cut back to `sqlite:/data`): compare the paths component-wise.
    if scope.kind != "sqlite" or len(root.parts) != 1 or not root.parts[0].startswith("/"):
        return root.covers(scope)
    if not scope.parts[0].startswith("/"):
        return False
    mine = _components(root.parts[0])
    return _components(scope.parts[0])[: len(mine)] == mine


@dataclass(frozen=True, slots=True)
class _Scheme:
    """The spelling rules of one scope kind; a kind without an entry is a plain name
    (`kind:part:part`, parts trimmed, canonical integers folded)."""

    # Canonical parts of a scope of this kind, idempotent; applied by named_scope and required
    # by Scope() itself. None: the parts as named_scope makes them.
    fold: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None
    # Its own text syntax, from (text after "kind:", whole text, casefold); None: a name.
    parse: Callable[[str, str, bool], Scope] | None = None
    # The characters between components of its text: where a template's literal prefix is cut.
    seps: str = ":"
    # Whether a value put into a template can climb out of the template's literal prefix ('..',
    # '/', symlinks). A name cannot (a value only adds parts), so its roots need no call-time check.
    climbs: bool = False
    # Whether a root scope contains a scope of this kind.
    within: Callable[[Scope, Scope], bool] = Scope.covers


# One entry per kind with rules of its own: a new scheme is one line here.
_SCHEMES: dict[str, _Scheme] = {
    "fs": _Scheme(parse=_parse_fs, seps="/", climbs=True),
    "url": _Scheme(parse=_parse_url, seps="/", climbs=True),
    "sqlite": _Scheme(
        fold=_fold_sqlite, parse=_parse_sqlite, seps="/:", climbs=True, within=_sqlite_within
    ),
    "mail": _Scheme(fold=_fold_mail),
}
_NAME = _Scheme()


def _kind_of(text: str) -> str | None:
    """The kind a scope text parses to (without parsing it), or None if it has none yet."""
    if text.startswith("/"):
        return "fs"
    if _URL_PREFIX_RE.match(text.lstrip()):
        return "url"
    head, sep, _ = text.partition(":")
    return head.strip().lower() if sep else None


def _parse(text: str, casefold: bool) -> Scope:
    if text.startswith("/"):
        return fs_scope(text, casefold=casefold)
    head, sep, rest = text.partition(":")
    if not sep:
        raise ScopeError(f"not a scope: {text!r} (no kind and not an absolute path)")
    scheme = _SCHEMES.get(head.strip().lower())
    if scheme is not None and scheme.parse is not None:
        return scheme.parse(rest, text, casefold)
    if _URL_PREFIX_RE.match(text.lstrip()):
        return url_scope(text)
    return named_scope(text)


def parse_scope(text: str | Scope, *, casefold: bool = False) -> Scope:
    """Scope from its text: `fs:`, `sqlite:/db:table[:key]`, URLs, bare absolute paths, names.

    A Scope passes through unchanged. `casefold` folds file-system paths (fs and sqlite files).
    """
    if isinstance(text, Scope):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ScopeError(f"scope text must be a non-empty string, got {text!r}")
    try:
        return _parse(text, casefold)
    except ScopeError as exc:
        if repr(text) in str(exc):
            raise
        raise ScopeError(f"cannot parse scope {text!r}: {exc}") from exc


# --------------------------------------------------------------------------- template roots


def template_root(prefix: str) -> str | None:
    """The default root of a scope template whose literal text before its first field is
    `prefix`: the prefix cut back to its last complete component (`fs:/tmp/demo/` and
    `fs:/tmp/demo/f-` give `fs:/tmp/demo`), or None when that leaves no more than the kind
    (`kv:`, `fs:/`, `https://`): then there is nothing a value could escape."""
    kind = _kind_of(prefix)
    if kind is None:
        return None
    seps = _SCHEMES.get(kind, _NAME).seps
    cut = max(prefix.rfind(c) for c in seps)
    if cut <= 0:
        return None
    text = prefix[:cut]
    try:
        root = parse_scope(text)
    except ScopeError:
        return None
    return text if root.kind == kind else None


def root_is_checked(kind: str) -> bool:
    """Whether a value in a template of this kind can climb out of its root ('..', '/',
    symlinks), so that the root must be checked at every call; names only ever add parts."""
    return _SCHEMES.get(kind, _NAME).climbs


def scope_within(root: Scope, scope: Scope) -> bool:
    """True when `scope` lies within `root`, by the rules of its kind: a scope covers its
    extensions, and a `sqlite:` directory root covers the database files below it."""
    return _SCHEMES.get(root.kind, _NAME).within(root, scope)


@dataclass(frozen=True, slots=True)
class ScopePolicy:
    """How a runtime turns scope specs into Scopes: canonical parsing or the naive ablation.

    Guarantees: `resolve` is deterministic, and under a canonical policy aliases of one
    resource resolve to one Scope; under a naive one, only identical texts do.
    """

    canonical: bool = True
    casefold: bool = False

    def resolve(self, spec: str | Scope) -> Scope:
        if self.canonical:
            return parse_scope(spec, casefold=self.casefold)
        if isinstance(spec, Scope):
            return naive_scope(str(spec))
        return naive_scope(spec)


CANONICAL = ScopePolicy()
NAIVE = ScopePolicy(canonical=False)

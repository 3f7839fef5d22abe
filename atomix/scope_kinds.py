"""Canonical scopes of each kind of resource: one scope per resource, whatever its spelling.

Aliases of one resource become one scope: `/repo/./src/../src/app.py` and a symlink to it,
the row keys `"42"` and `42`, two spellings of one URL or mail address. File paths resolve
(`fs_scope`), SQLite table names drop their quoting and the `main.` schema and fold case
(`sqlite_scope`), URLs normalise per RFC 3986 (`url_scope`), mail addresses take Unicode NFC
and an IDNA (punycode) domain (`mail_scope`), names trim and fold integers (`named_scope`);
`naive_scope` is the ablation that does none of it. The adapters take their scopes from here, so a user's template and an
adapter name one resource alike.
"""

from __future__ import annotations

import math
import operator
import os
import re
import string
import unicodedata
from typing import SupportsIndex
from urllib.parse import urlsplit

from atomix.errors import ScopeError
from atomix.scopes import ASCII_LOWER, FOLDS, INT_RE, KIND_RE, Scope, named_part

__all__ = [
    "fs_scope",
    "mail_address",
    "mail_scope",
    "naive_scope",
    "named_scope",
    "sqlite_scope",
    "sqlite_table",
    "url_scope",
]

URL_PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.-]*")

# Kinds whose text is not "kind:part:part"; named_scope must not be able to forge them.
_RESERVED_KINDS = frozenset({"fs", "url", "raw"})

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_PCHAR = _UNRESERVED | frozenset("!$&'()*+,;=:@")
_QCHAR = _PCHAR | frozenset("/?")
_HEX = frozenset(string.hexdigits)


# --------------------------------------------------------------------------- file system


def _abs_path(path: object, *, resolve_symlinks: bool, what: str) -> str:
    # Checked first so that os.fspath is only handed what it accepts; it still raises
    # TypeError for a __fspath__ that returns neither str nor bytes.
    if not isinstance(path, str | bytes | os.PathLike):
        raise ScopeError(f"{what} must be a path, got {path!r}")
    try:
        text = os.fsdecode(os.fspath(path))
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


def path_components(path: str) -> tuple[str, ...]:
    """The components of an absolute path, without empty ones."""
    # Filtering empties also folds the POSIX-preserved leading '//' into '/'.
    return tuple(p for p in path.split("/") if p)


def fs_scope(
    path: str | os.PathLike[str], *, casefold: bool = False, resolve_symlinks: bool = True
) -> Scope:
    """Scope of a file or directory: `fs:/abs/path`; a directory covers everything below it."""
    resolved = _abs_path(path, resolve_symlinks=resolve_symlinks, what="fs scope path")
    if casefold:
        resolved = resolved.casefold()
    return Scope("fs", path_components(resolved))


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
        if INT_RE.fullmatch(key):
            return "0" if key == "-0" else key
        return key
    if isinstance(key, SupportsIndex):  # numpy integers and the like
        try:
            value = operator.index(key)
        except TypeError:
            pass
        else:
            return _int_text(value)
    raise ScopeError(f"row key must be an int, integral float or str, got {key!r}")


# A quoted SQL identifier and what closes it: "x" (standard), [x] (MS Access/SQL Server),
# `x` (MySQL) and 'x' (SQLite's leniency); a doubled closer inside quotes is one character.
_QUOTES = {'"': '"', "`": "`", "'": "'", "[": "]"}


def _identifier_parts(text: str) -> list[str]:
    """A possibly quoted, possibly schema-qualified SQL name split at the dots outside quotes,
    each part unquoted; ScopeError if it is malformed."""
    parts: list[str] = []
    current: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _QUOTES and not current:
            close = _QUOTES[c]
            i += 1
            while True:
                end = text.find(close, i)
                if end < 0:
                    raise ScopeError(f"sqlite table name {text!r}: unterminated quote {c}")
                current.append(text[i:end])
                i = end + 1
                if close != "]" and i < n and text[i] == close:  # a doubled quote: literal
                    current.append(close)
                    i += 1
                    continue
                break
            if i < n and text[i] != ".":
                raise ScopeError(f"sqlite table name {text!r}: text after a closing quote")
            continue
        if c == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    if any(not p for p in parts) or len(parts) > 2:
        raise ScopeError(f"sqlite table name {text!r} is not [schema.]table")
    return parts


def sqlite_table(table: object) -> str:
    """The canonical spelling of a SQLite table name, as SQLite resolves it: quoting
    (`"Orders"`, `[Orders]`, `` `Orders` ``) and the default schema (`main.orders`) are
    dropped, and identifiers are case-insensitive for ASCII, so all of these and `Orders`
    are the table `orders`, with one scope. Another schema stays in the name
    (`temp.orders`)."""
    if not isinstance(table, str) or not table:
        raise ScopeError(f"sqlite table must be a non-empty string, got {table!r}")
    if table != table.strip():
        raise ScopeError(f"sqlite table name {table!r} is not identifier-like")
    parts = _identifier_parts(table) if any(c in table for c in '."`[\'') else [table]
    if len(parts) == 2 and parts[0].translate(ASCII_LOWER) == "main":
        parts = parts[1:]
    name = ".".join(parts)
    if ":" in name or any(ord(c) < 32 or ord(c) == 127 for c in name) or name != name.strip():
        raise ScopeError(f"sqlite table name {table!r} is not identifier-like")
    return name.translate(ASCII_LOWER)


def sqlite_db(db: object, casefold: bool) -> str:
    """The canonical text of a SQLite database file's path (the first part of its scopes)."""
    resolved = _abs_path(db, resolve_symlinks=True, what="sqlite database path")
    if casefold:
        resolved = resolved.casefold()
    if ":" in resolved:
        # The text form separates db, table and key with ':'; a db path holding one is ambiguous.
        raise ScopeError(f"sqlite database path must not contain ':', got {db!r}")
    return "/" + "/".join(path_components(resolved))


def sqlite_scope(
    db: str | os.PathLike[str], table: str, key: object | None = None, *, casefold: bool = False
) -> Scope:
    """Scope of a table or one row of a SQLite file: `sqlite:/abs/shop.db:orders[:42]`.

    The database path is resolved like an fs path; the table name is folded (`sqlite_table`);
    the key `42`, `42.0`, `"42"` is one row.
    """
    parts: tuple[str, ...] = (sqlite_db(db, casefold), sqlite_table(table))
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


def named_scope(text: str) -> Scope:
    """Scope of an opaque hierarchical name `kind:part:part`; a prefix covers its extensions."""
    if not isinstance(text, str):
        raise ScopeError(f"scope name must be a string, got {text!r}")
    if ":" not in text:
        raise ScopeError(f"scope name needs 'kind:part', got {text!r}")
    if URL_PREFIX_RE.match(text.lstrip()):
        raise ScopeError(f"scope name {text!r} is a URL; use url_scope")
    head, *rest = text.split(":")
    kind = head.strip().lower()
    if not KIND_RE.fullmatch(kind):
        raise ScopeError(f"scope kind {head!r} of {text!r} must match {KIND_RE.pattern!r}")
    if kind in _RESERVED_KINDS:
        raise ScopeError(f"scope name {text!r} uses reserved kind {kind!r}")
    parts = tuple(named_part(p, text) for p in rest)
    if kind == "sqlite" and parts[0].startswith("/"):
        raise ScopeError(f"scope name {text!r} names a database file; use sqlite_scope")
    if kind == "sqlite":  # a handle `sqlite:"Orders":42` names the table `orders`
        parts = (named_part(sqlite_table(parts[0]), text), *parts[1:])
    elif kind == "mail":  # every spelling of one mailbox is one scope (see mail_scope)
        parts = tuple(_mail_part(p) for p in parts)
    fold = FOLDS.get(kind)
    if fold is not None:
        parts = fold(parts)
    return Scope(kind, parts)


# --------------------------------------------------------------------------- mail


def mail_address(address: object) -> str:
    """The spelling a message is addressed with: trimmed, lower-cased, Unicode NFC (the
    domain keeps the form it was given; its scope is `mail_scope`'s)."""
    if not isinstance(address, str) or not address.strip():
        raise ScopeError(f"mail address must be a non-empty string, got {address!r}")
    if ":" in address:
        # ':' separates scope parts: "a:b@x" would become a two-level scope, not one address.
        raise ScopeError(f"mail address must not contain ':', got {address!r}")
    return unicodedata.normalize("NFC", address.strip().lower())


def _mail_part(part: str) -> str:
    """One part of a mail scope: an address as `mail_scope` spells it; any other part NFC
    and lower-cased."""
    local, at, domain = part.rpartition("@")
    if not at:
        return unicodedata.normalize("NFC", part.lower())
    local = unicodedata.normalize("NFC", unicodedata.normalize("NFC", local).lower())
    domain = domain.strip(".")
    if not domain.isascii():
        try:
            domain = unicodedata.normalize("NFC", domain).encode("idna").decode("ascii")
        except UnicodeError:
            raise ScopeError(f"mail address {part!r}: its domain is not a valid IDN") from None
    return f"{local}@{domain.lower()}"


def mail_scope(address: str) -> Scope:
    """Scope of one mailbox: `mail:alice@example.com`. Every spelling of one mailbox is one
    scope: case (the whole address is folded, see `atomix.scopes`), Unicode NFC and NFD of
    the local part, and an internationalised domain and its punycode (IDNA) form, so a user
    template `mail:{to}` and the mailbox adapter name one recipient alike."""
    return named_scope("mail:" + mail_address(address))


def naive_scope(text: str) -> Scope:
    """The naive-string ablation: the text itself, unnormalised; only identical texts overlap."""
    if not isinstance(text, str) or not text:
        raise ScopeError(f"naive scope needs a non-empty string, got {text!r}")
    return Scope("raw", (text,))

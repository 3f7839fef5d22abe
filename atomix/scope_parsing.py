"""Scope texts: parsing them, the roots of scope templates, and a runtime's scope policy.

Each kind with a text syntax of its own (`fs:` and bare absolute paths, URLs, `sqlite:/db`
files) has one entry in the registry `_SCHEMES`: how to parse it, where a template's literal
prefix is cut, whether a template value can climb out of its root, and what a root contains.
Any other text is a name (`kind:part:part`). The spelling of each kind's parts is
`atomix.scopes.FOLDS`; the canonical constructors are `atomix.scope_kinds`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from atomix.errors import ScopeError
from atomix.scope_kinds import (
    URL_PREFIX_RE,
    fs_scope,
    naive_scope,
    named_scope,
    path_components,
    sqlite_db,
    sqlite_scope,
    url_scope,
)
from atomix.scopes import Scope

__all__ = [
    "CANONICAL",
    "NAIVE",
    "ScopePolicy",
    "parse_scope",
    "root_is_checked",
    "scope_within",
    "template_root",
]


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
        return Scope("sqlite", (sqlite_db(db, casefold),))
    return sqlite_scope(db, fields[0], fields[1] if len(fields) > 1 else None, casefold=casefold)


def _sqlite_within(root: Scope, scope: Scope) -> bool:
    # A root of one path part is a database file or a directory of them (a template's literal
    # prefix `sqlite:/data/` is cut back to `sqlite:/data`): compare the paths component-wise.
    if scope.kind != "sqlite" or len(root.parts) != 1 or not root.parts[0].startswith("/"):
        return root.covers(scope)
    if not scope.parts[0].startswith("/"):
        return False
    mine = path_components(root.parts[0])
    return path_components(scope.parts[0])[: len(mine)] == mine


@dataclass(frozen=True, slots=True)
class _Scheme:
    """The text rules of one scope kind; a kind without an entry is a plain name
    (`kind:part:part`, parts trimmed, canonical integers folded)."""

    # Its own text syntax, from (text after "kind:", whole text, casefold); None: a name.
    parse: Callable[[str, str, bool], Scope] | None = None
    # The characters between components of its text: where a template's literal prefix is cut.
    seps: str = ":"
    # Whether a value put into a template can climb out of the template's literal prefix ('..',
    # '/', symlinks). A name cannot (a value only adds parts), so its roots need no call-time check.
    climbs: bool = False
    # Whether a root scope contains a scope of this kind.
    within: Callable[[Scope, Scope], bool] = Scope.covers


# One entry per kind with text rules of its own: a new scheme is one line here.
_SCHEMES: dict[str, _Scheme] = {
    "fs": _Scheme(parse=_parse_fs, seps="/", climbs=True),
    "url": _Scheme(parse=_parse_url, seps="/", climbs=True),
    "sqlite": _Scheme(parse=_parse_sqlite, seps="/:", climbs=True, within=_sqlite_within),
}
_NAME = _Scheme()


def _kind_of(text: str) -> str | None:
    """The kind a scope text parses to (without parsing it), or None if it has none yet."""
    if text.startswith("/"):
        return "fs"
    if URL_PREFIX_RE.match(text.lstrip()):
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
    if URL_PREFIX_RE.match(text.lstrip()):
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

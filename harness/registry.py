"""One registry style for everything a config names: modes, workloads, agent kinds, executors
and fault classes.

A `Registry[T]` is an ordered table of `Entry` rows. A row's target is either the object itself
or a lazy `"module:attr"` reference, imported on first use, so that listing names costs no
import and an optional dependency (dask, an LLM SDK) is imported only when a config asks for
it. Adding a mode, workload, agent kind, executor or fault class is one module and one row.

This module sits below every wing (it imports nothing from the harness), as does
`harness.errors`.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")

__all__ = ["Entry", "Registry", "UnknownName", "did_you_mean"]


def did_you_mean(word: str, choices: Sequence[str], sep: str = "; ") -> str:
    """`; did you mean X?` for the closest of `choices` to a mistyped `word`, else ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"{sep}did you mean {close[0]}?" if close else ""


class UnknownName(KeyError):
    """A name no row of a registry has; the message lists what is allowed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One row: a name, its target (an object, or `"module:attr"` loaded on first use), a
    one-line description and free-form facts (`meta`) that listings and callers may read."""

    name: str
    target: T | str
    description: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def module(self) -> str:
        """The module that defines the target."""
        if isinstance(self.target, str):
            return self.target.partition(":")[0]
        return str(getattr(self.target, "__module__", "?"))


class Registry(Generic[T]):
    """An ordered, read-only table of named `T`s.

    Guarantees: names are unique (a duplicate row is refused when the table is built); a lazy
    target is imported on lookup (Python's module cache makes a repeat cheap); an unknown name raises
    `UnknownName` whose message says what it is, offers the closest name and lists the
    allowed ones.
    """

    def __init__(self, what: str, entries: Iterable[Entry[T]]) -> None:
        self.what = what
        self._entries: dict[str, Entry[T]] = {}
        for entry in entries:
            if entry.name in self._entries:
                raise ValueError(f"{what} {entry.name!r} is registered twice")
            self._entries[entry.name] = entry

    def extended(self, entries: Iterable[Entry[T]]) -> Registry[T]:
        """A new registry: these rows, then `entries` (for a plug-in or a test's own row)."""
        return Registry(self.what, [*self._entries.values(), *entries])

    def names(self) -> list[str]:
        """Every name, in table order."""
        return list(self._entries)

    def entries(self) -> list[Entry[T]]:
        """Every row, in table order (nothing is imported)."""
        return list(self._entries.values())

    def entry(self, name: str) -> Entry[T]:
        """The row of `name`; UnknownName if there is none."""
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(self.unknown(name)) from None

    def unknown(self, name: str) -> str:
        """The message for an unknown `name`: what it is, the closest name, what is allowed."""
        return (
            f"unknown {self.what} {name!r}{did_you_mean(name, self.names())}; "
            f"allowed: {', '.join(self.names())}"
        )

    def __getitem__(self, name: str) -> T:
        target = self.entry(name).target
        if not isinstance(target, str):
            return target
        # No cache of our own: sys.modules is one, and a test that hides a module there
        # (an optional dependency "not installed") must see the import fail.
        module, _, attr = target.partition(":")
        return cast(T, getattr(importlib.import_module(module), attr))

    def get(self, name: str, default: T | None = None) -> T | None:
        return self[name] if name in self._entries else default

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """Every (name, target), importing lazy targets."""
        return [(name, self[name]) for name in self._entries]

    def describe(self) -> list[tuple[str, str]]:
        """Every (name, description), in table order. A row without a description of its own
        is described by its target's `description` attribute or the first line of its
        docstring (which imports it); a target that cannot be imported says so instead of
        failing the listing."""
        out = []
        for entry in self._entries.values():
            text = entry.description
            if not text:
                try:
                    target: Any = self[entry.name]
                except Exception as exc:  # noqa: BLE001 - one broken row must not hide the rest
                    text = f"(cannot import: {exc})"
                else:
                    text = str(getattr(target, "description", "") or "") or (
                        (target.__doc__ or "").strip().split("\n")[0]
                    )
            out.append((entry.name, text))
        return out

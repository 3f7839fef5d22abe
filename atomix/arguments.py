"""Checking the arguments a model produced against a tool, in words the model can act on.

Decoded JSON arguments are checked against the tool's signature (an unknown or missing name)
and converted to its parameter types by pydantic, leniently ("3" for an int is 3, a dict for
a dataclass becomes one). pydantic is imported at a tool's first check, not before.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from atomix.tools import ToolSpec
from atomix.type_schemas import admits_null, nullable, type_hints

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = ["ArgumentsError", "check_arguments"]


class ArgumentsError(ValueError):
    """Arguments a model produced do not fit the tool; the text says what to change."""


_adapters: dict[int, tuple[ToolSpec, dict[str, TypeAdapter[Any]]]] = {}
_adapters_lock = threading.Lock()


def check_arguments(tool: Any, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """`arguments` (decoded JSON) checked against the tool's signature and converted to its
    parameter types (pydantic, lax: "3" for an int is 3, a dict for a dataclass becomes one),
    in signature order. What does not fit raises ArgumentsError, in words a model can act on:
    an unknown or missing name, or a value of the wrong type. Unannotated parameters, and
    types pydantic cannot validate (typing.TypedDict before Python 3.12), pass unchanged."""
    spec = tool if isinstance(tool, ToolSpec) else getattr(tool, "spec", None)
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"check_arguments: {tool!r} is not a tool (an rt.tool shim or a ToolSpec)")
    if not isinstance(arguments, Mapping):
        raise ArgumentsError(
            f"the arguments must be a JSON object, not {type(arguments).__name__}"
        )
    params = spec.signature.parameters
    unknown = [k for k in arguments if k not in params]
    missing = [
        p.name for p in params.values() if p.default is p.empty and p.name not in arguments
    ]
    problems = []
    if unknown:
        problems.append(f"unknown argument(s) {', '.join(map(repr, unknown))}")
    if missing:
        problems.append(f"missing required argument(s) {', '.join(map(repr, missing))}")
    if problems:
        raise ArgumentsError(
            f"{'; '.join(problems)}; {spec.name} takes: {', '.join(params) or 'no arguments'}"
        )
    adapters = _adapters_of(spec)
    out: dict[str, Any] = {}
    errors: list[str] = []
    for name in params:
        if name not in arguments:
            continue
        value = arguments[name]
        adapter = adapters.get(name)
        if adapter is not None:
            try:
                value = adapter.validate_python(value)
            except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError
                errors.extend(_describe(name, exc))
                continue
        out[name] = value
    if errors:
        raise ArgumentsError("; ".join(errors))
    return out


def _describe(name: str, exc: Exception) -> list[str]:
    details = getattr(exc, "errors", None)
    if not callable(details):
        return [f"argument {name!r}: {exc}"]
    lines = []
    for error in details(include_url=False):
        where = "".join(f"[{part!r}]" for part in error.get("loc", ()))
        got = error.get("input")
        shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
        lines.append(f"argument {name!r}{where}: {error.get('msg')} (got {shown})")
    return lines


def _adapters_of(spec: ToolSpec) -> dict[str, TypeAdapter[Any]]:
    """One pydantic TypeAdapter per annotated parameter, built at the tool's first check."""
    hit = _adapters.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    params = spec.signature.parameters
    hints = type_hints(spec.fn, spec.name) if any(
        p.annotation is not p.empty for p in params.values()
    ) else {}
    adapters: dict[str, TypeAdapter[Any]] = {}
    for p in params.values():
        hint = hints.get(p.name, Any)
        if hint is Any or hint is p.empty:
            continue
        if p.default is None and not admits_null(hint):
            hint = nullable(hint)
        try:
            from pydantic import TypeAdapter

            adapters[p.name] = TypeAdapter(hint)
        except Exception:  # noqa: BLE001, S112 - a type pydantic cannot validate passes as is
            continue
    with _adapters_lock:
        _adapters[id(spec)] = (spec, adapters)
    return adapters

"""JSON schemas of tools, derived from their signature, type hints, defaults and docstring.

A schema is what an LLM sees of a tool: its name, a description (the docstring's first
paragraph, see `atomix.docstrings`) and a JSON Schema object of its parameters (see
`atomix.type_schemas`), with each parameter's description taken from `Annotated[X, "text"]` or
from the docstring. It exports in the OpenAI tools format (`ToolSchema.openai()`) and as an
MCP tool definition (`ToolSchema.mcp()`). Checking the arguments a model produced against a
tool is `atomix.arguments`.

Schemas are computed on first use and cached per tool, never at a call. A tool's
`idempotency_key` parameter (the shim fills it) never appears in its schema.
"""

from __future__ import annotations

import copy
import inspect
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from atomix.docstrings import parse_docstring
from atomix.tools import KEY_PARAM, ToolSpec
from atomix.type_schemas import SchemaBuilder, type_hints

__all__ = ["ToolSchema", "function_schema", "tool_schema"]

# OpenAI accepts function names of this form only; MCP is laxer, so only openai() checks it.
_OPENAI_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolSchema:
    """A tool's name, description and JSON Schema of its parameters (an object schema that
    allows no other properties). `parameters` is shared by every user of the cached schema:
    treat it as read-only; `openai()` and `mcp()` return fresh copies that may be changed."""

    name: str
    description: str
    parameters: dict[str, Any] = field(hash=False)

    def openai(self) -> dict[str, Any]:
        """The entry of `tools=` for the OpenAI chat completions API."""
        if not _OPENAI_NAME.match(self.name):
            raise ValueError(
                f"tool {self.name!r}: OpenAI function names are 1-64 letters, digits, '_' or "
                "'-'; give the tool such a name (rt.tool(name=...))"
            )
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }

    def mcp(self) -> dict[str, Any]:
        """The entry of an MCP `tools/list` answer."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": copy.deepcopy(self.parameters),
        }



def function_schema(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    skip: Iterable[str] = (),
) -> ToolSchema:
    """The schema of calling `fn` by keyword: each parameter (except `idempotency_key` and
    those in `skip`) with its type's schema, description and default; a parameter without a
    default is required. A parameter that cannot be passed by keyword (`*args`, `**kwargs`,
    positional-only) or a type with no JSON form raises ValueError."""
    spec = getattr(fn, "spec", None)
    if isinstance(spec, ToolSpec):  # an rt.tool shim: its own function, as tool_schema does
        return _schema(spec.fn, spec.signature, name or spec.name, description, skip)
    return _schema(fn, None, name, description, skip)


def _schema(
    fn: Callable[..., Any],
    signature: inspect.Signature | None,
    name: str | None,
    description: str | None,
    skip: Iterable[str],
) -> ToolSchema:
    title = name or getattr(fn, "__name__", None) or type(fn).__name__
    if signature is None:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{title}: no signature to derive a schema from: {exc}") from None
    skipped = set(skip)
    unknown = sorted(skipped - set(signature.parameters))
    if unknown:
        raise ValueError(
            f"{title}: skip names {unknown}, which are not parameters; "
            f"parameters: {list(signature.parameters)}"
        )
    params = [
        p for p in signature.parameters.values() if p.name != KEY_PARAM and p.name not in skipped
    ]
    odd = [p.name for p in params if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if odd:
        raise ValueError(
            f"{title}: parameters {odd} cannot be passed by keyword, so a JSON object of "
            "arguments cannot fill them; name each one (or leave it out with skip=)"
        )
    # get_type_hints follows __wrapped__ to the module whose names the hints use.
    owner: Any = fn
    if inspect.isclass(fn):
        owner = fn.__init__
    elif not (inspect.isroutine(fn) or hasattr(fn, "__wrapped__")):
        owner = type(fn).__call__  # a callable object
    hints = type_hints(owner, title) if any(p.annotation is not p.empty for p in params) else {}
    summary, documented = parse_docstring(inspect.getdoc(fn))
    builder = SchemaBuilder()
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in params:
        hint = hints.get(p.name, p.annotation)
        properties[p.name] = builder.property(p.name, hint, p.default, documented, title)
        if p.default is p.empty:
            required.append(p.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    parameters["required"] = required
    parameters["additionalProperties"] = False
    if builder.defs:
        parameters["$defs"] = builder.defs
    return ToolSchema(
        name=title,
        description=summary if description is None else description,
        parameters=parameters,
    )


_cache: dict[int, tuple[ToolSpec, ToolSchema]] = {}
_cache_lock = threading.Lock()


def tool_schema(tool: Any) -> ToolSchema:
    """The schema of a tool (an `rt.tool` shim or its ToolSpec), computed once per tool."""
    spec = tool if isinstance(tool, ToolSpec) else getattr(tool, "spec", None)
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"tool_schema: {tool!r} is not a tool (an rt.tool shim or a ToolSpec)")
    # By identity: a ToolSpec need not be hashable (a list default); the entry keeps the spec
    # alive, so its id cannot be reused by another.
    hit = _cache.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    schema = _schema(spec.fn, spec.signature, spec.name, None, ())
    with _cache_lock:
        _cache[id(spec)] = (spec, schema)
    return schema

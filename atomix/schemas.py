"""JSON schemas of tools, derived from their signature, type hints, defaults and docstring.

A schema is what an LLM sees of a tool: its name, a description (the docstring's first
paragraph) and a JSON Schema object of its parameters, with each parameter's description
taken from `Annotated[X, "text"]` or from the docstring's Google (`Args:`), NumPy
(`Parameters` / `----------`) or Sphinx (`:param x:`) section. It exports in the OpenAI tools
format (`ToolSchema.openai()`) and as an MCP tool definition (`ToolSchema.mcp()`).

Schemas are computed on first use and cached per tool, never at a call. A tool's
`idempotency_key` parameter (the shim fills it) never appears in its schema.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import inspect
import json
import pathlib
import re
import sys
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atomix.tools import KEY_PARAM, ToolSpec

__all__ = [
    "ArgumentsError",
    "ToolSchema",
    "check_arguments",
    "function_schema",
    "parse_docstring",
    "tool_schema",
]

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


# --------------------------------------------------------------------------- docstrings

_GOOGLE_PARAMS = {
    "args",
    "arguments",
    "parameters",
    "params",
    "keyword args",
    "keyword arguments",
    "kwargs",
    "other parameters",
    "attributes",
}
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:(?:\s+(.*))?$")
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::.*)?$")
_SPHINX_PARAM = re.compile(
    r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\*{0,2}([A-Za-z_]\w*)\s*:\s*(.*)$"
)
_SPHINX_FIELD = re.compile(r"^:\w+[^:]*:")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(lines: Iterable[str]) -> str:
    return " ".join(s.strip() for s in lines if s.strip())


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and each parameter's description of a docstring in
    Google, NumPy or Sphinx style. Text it does not recognise is left out, never guessed."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    params: dict[str, str] = {}

    def is_header(i: int) -> bool:
        line = lines[i]
        if _GOOGLE_HEADER.match(line.strip()) and _indent(line) == 0:
            return True
        return i + 1 < len(lines) and bool(line.strip()) and bool(_NUMPY_RULE.match(lines[i + 1]))

    summary: list[str] = []
    for i, line in enumerate(lines):
        if not line.strip() or is_header(i) or _SPHINX_FIELD.match(line.strip()):
            break
        summary.append(line)

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        numpy = i + 1 < len(lines) and stripped and _NUMPY_RULE.match(lines[i + 1])
        google = _GOOGLE_HEADER.match(stripped) if not numpy else None
        if numpy and stripped.lower() in _GOOGLE_PARAMS:
            i = _numpy_section(lines, i + 2, _indent(line), params)
            continue
        if google and google.group(1).lower() in _GOOGLE_PARAMS:
            i = _google_section(lines, i + 1, _indent(line), params)
            continue
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            text = [sphinx.group(2)]
            base = _indent(line)
            i += 1
            while i < len(lines) and lines[i].strip() and _indent(lines[i]) > base:
                text.append(lines[i])
                i += 1
            params.setdefault(sphinx.group(1), _join(text))
            continue
        i += 1
    return _join(summary), params


def _google_section(lines: list[str], i: int, header: int, out: dict[str, str]) -> int:
    """Parse the entries of an `Args:` section from line i; return the line after it."""
    entry: int | None = None  # the indentation of entries, set by the first one
    name: str | None = None
    text: list[str] = []

    def flush() -> None:
        if name is not None:
            out.setdefault(name, _join(text))

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        indent = _indent(line)
        if indent <= header:
            break
        if entry is None:
            entry = indent
        if indent == entry:
            match = _GOOGLE_ENTRY.match(line.strip())
            if match is None:
                break  # not an entry at the entries' indentation: the section is over
            flush()
            name, text = match.group(1), [match.group(2) or ""]
        elif indent > entry and name is not None:
            text.append(line)
        else:
            break
        i += 1
    flush()
    return i


def _numpy_section(lines: list[str], i: int, header: int, out: dict[str, str]) -> int:
    """Parse the entries of a NumPy `Parameters` section from line i (after its rule)."""
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        for n in names:
            out.setdefault(n, _join(text))

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1]):
            break  # the next section's header
        indent = _indent(line)
        if indent < header:
            break
        if indent == header:
            match = _NUMPY_ENTRY.match(line.strip())
            if match is None:
                break
            flush()
            names = [n.strip().lstrip("*") for n in match.group(1).split(",")]
            text = []
        elif names:
            text.append(line)
        i += 1
    flush()
    return i


# --------------------------------------------------------------------------- types

_Required = getattr(typing, "Required", None)
_NotRequired = getattr(typing, "NotRequired", None)
_UNION_TYPES: tuple[Any, ...] = (typing.Union, types.UnionType)
_SIMPLE = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    bytes: {"type": "string"},
}
# By module and name, so that importing this module does not import theirs.
_SIMPLE_BY_NAME = {
    ("datetime", "datetime"): {"type": "string", "format": "date-time"},
    ("datetime", "date"): {"type": "string", "format": "date"},
    ("datetime", "time"): {"type": "string", "format": "time"},
    ("uuid", "UUID"): {"type": "string", "format": "uuid"},
    ("decimal", "Decimal"): {"type": "number"},
}
_ALLOWED = (
    "str, int, float, bool, None, Optional/X | None, list/tuple/set, dict[str, X], Literal, "
    "Enum, Annotated, TypedDict, dataclass, pydantic BaseModel, datetime/date/time, UUID, "
    "Path, Decimal, bytes, Any"
)
_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


class _Unsupported(Exception):
    def __init__(self, hint: Any, why: str = "") -> None:
        self.hint = hint
        self.why = why


def _json_type(value: Any) -> str | None:
    if value is None:
        return "null"
    for kind, name in _JSON_TYPES:
        if isinstance(value, kind):
            return name
    return None


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    kinds = {_json_type(v) for v in values}
    if None in kinds:
        raise _Unsupported(values, "Literal and Enum values must be str, int, float, bool or None")
    schema: dict[str, Any] = {"enum": values}
    if len(kinds) == 1:
        schema = {"type": kinds.pop(), "enum": values}
    return schema


def _as_json(value: Any) -> Any:
    """`value` as plain JSON (enum members as their values, tuples as lists), or raise."""
    plain = json.dumps(value, allow_nan=False, default=_json_default)
    return json.loads(plain)


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _admits_null(hint: Any) -> bool:
    if hint is None or hint is type(None) or hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _admits_null(typing.get_args(hint)[0])
    if origin in _UNION_TYPES:
        return any(_admits_null(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return None in typing.get_args(hint)
    return False


class _Builder:
    """Turns type hints into JSON Schema; named object types that recur go to `$defs`."""

    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}
        self.names: dict[Any, str] = {}  # a recursive type -> its $defs name
        self.stack: list[Any] = []

    def schema(self, hint: Any) -> dict[str, Any]:
        if hint is Any or hint is inspect.Parameter.empty or hint is object:
            return {}
        if hint is None:
            return {"type": "null"}
        if isinstance(hint, str | typing.ForwardRef):
            raise _Unsupported(hint, "a forward reference that could not be resolved")
        simple = _SIMPLE.get(hint)
        if simple is not None:
            return dict(simple)
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is typing.Annotated:
            return self._annotated(args[0], args[1:])
        if origin is not None and origin in (_Required, _NotRequired):
            return self.schema(args[0])
        if origin in _UNION_TYPES:
            return self._union(args)
        if origin is typing.Literal:
            return _enum_schema([a.value if isinstance(a, enum.Enum) else a for a in args])
        if isinstance(hint, typing.TypeVar):
            bound = hint.__bound__
            if hint.__constraints__:
                return self._union(hint.__constraints__)
            return {} if bound is None else self.schema(bound)
        supertype = getattr(hint, "__supertype__", None)  # typing.NewType
        if supertype is not None:
            return self.schema(supertype)
        if origin is not None:
            return self._generic(hint, origin, args)
        if not isinstance(hint, type):
            raise _Unsupported(hint)
        named = _SIMPLE_BY_NAME.get((hint.__module__, hint.__qualname__))
        if named is not None:
            return dict(named)
        if issubclass(hint, enum.Enum):
            return _enum_schema([m.value for m in hint])
        if issubclass(hint, pathlib.PurePath):
            return {"type": "string"}
        if hint in (list, tuple, set, frozenset):
            return self._generic(hint, hint, ())
        if hint is dict:
            return {"type": "object"}
        if typing.is_typeddict(hint) or dataclasses.is_dataclass(hint) or _is_pydantic(hint):
            return self._named(hint)
        raise _Unsupported(hint)

    def _annotated(self, base: Any, metadata: tuple[Any, ...]) -> dict[str, Any]:
        schema = self.schema(base)
        for meta in metadata:
            if isinstance(meta, str):
                schema.setdefault("description", meta)
                continue
            description = getattr(meta, "description", None)  # pydantic's FieldInfo
            if isinstance(description, str):
                schema.setdefault("description", description)
            for constraint in [meta, *(getattr(meta, "metadata", None) or ())]:
                _constrain(schema, constraint)
        return schema

    def _union(self, members: Iterable[Any]) -> dict[str, Any]:
        schemas: list[dict[str, Any]] = []
        for member in members:
            schema = self.schema(member)
            if schema == {}:
                return {}  # Any absorbs the rest
            if schema not in schemas:
                schemas.append(schema)
        if len(schemas) == 1:
            return schemas[0]
        # Plain types only: a list of types reads better and every consumer supports it.
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in schemas):
            return {"type": [s["type"] for s in schemas]}
        return {"anyOf": schemas}

    def _generic(self, hint: Any, origin: Any, args: tuple[Any, ...]) -> dict[str, Any]:
        if not isinstance(origin, type):
            raise _Unsupported(hint)
        if issubclass(origin, tuple) and origin is tuple:
            if not args:
                return {"type": "array"}
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.schema(args[0])}
            if args == ((),):  # tuple[()]
                return {"type": "array", "maxItems": 0}
            items = [self.schema(a) for a in args]
            return {
                "type": "array",
                "prefixItems": items,
                "minItems": len(items),
                "maxItems": len(items),
            }
        if issubclass(origin, str | bytes):
            raise _Unsupported(hint)
        if issubclass(origin, Mapping) or origin is dict:
            schema: dict[str, Any] = {"type": "object"}
            if args:
                key, value = args
                if key not in (str, Any) and not (
                    typing.get_origin(key) is typing.Literal
                    and all(isinstance(k, str) for k in typing.get_args(key))
                ):
                    raise _Unsupported(hint, "JSON object keys are strings: use dict[str, X]")
                values = self.schema(value)
                if values:
                    schema["additionalProperties"] = values
            return schema
        if issubclass(origin, set | frozenset):
            schema = {"type": "array", "uniqueItems": True}
        elif issubclass(origin, Iterable):  # list, Sequence, Iterable, deque, ...
            schema = {"type": "array"}
        else:
            raise _Unsupported(hint)
        if args:
            items = self.schema(args[0])
            if items:
                schema["items"] = items
        return schema

    def _named(self, cls: type) -> dict[str, Any]:
        """An object type's schema, inline, or a `$ref` to `$defs` when it refers to itself."""
        if cls in self.stack:
            return {"$ref": f"#/$defs/{self._def_name(cls)}"}
        if cls in self.names:  # recursive, and built already
            return {"$ref": f"#/$defs/{self.names[cls]}"}
        self.stack.append(cls)
        try:
            schema = self._pydantic(cls) if _is_pydantic(cls) else self._object(cls)
        finally:
            self.stack.pop()
        name = self.names.get(cls)
        if name is None:
            return schema
        self.defs[name] = schema
        return {"$ref": f"#/$defs/{name}"}

    def _def_name(self, cls: type) -> str:
        name = self.names.get(cls)
        if name is None:
            name = self._free_name(cls.__name__)
            self.names[cls] = name
            self.defs[name] = {}  # reserved; filled when the type is done
        return name

    def _free_name(self, base: str) -> str:
        name, n = base, 1
        while name in self.defs:
            n += 1
            name = f"{base}{n}"
        return name

    def _object(self, cls: type) -> dict[str, Any]:
        """A TypedDict's or dataclass's schema: its fields, their descriptions from the class
        docstring (`Attributes:` / `Args:`) or Annotated, required unless they have a default."""
        hints = _hints(cls, cls.__name__)
        doc = cls.__doc__ if "__doc__" in vars(cls) else None
        if doc and dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "("):
            doc = None  # the text dataclass() makes up, not a description
        description, documented = parse_docstring(doc)
        properties: dict[str, Any] = {}
        required: list[str] = []
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if not f.init:
                    continue
                default = f.default
                if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
                    default = f.default_factory()
                prop = self.property(f.name, hints.get(f.name, Any), default, documented, cls)
                properties[f.name] = prop
                if default is dataclasses.MISSING:
                    required.append(f.name)
        else:  # TypedDict
            keys = getattr(cls, "__required_keys__", frozenset(hints))
            for key, hint in hints.items():
                properties[key] = self.property(key, hint, dataclasses.MISSING, documented, cls)
                # Under `from __future__ import annotations` Python cannot see NotRequired
                # when it makes __required_keys__; the resolved hint still says it.
                qualifier = typing.get_origin(hint)
                if qualifier is _NotRequired:
                    continue
                if key in keys or qualifier is _Required:
                    required.append(key)
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        schema["additionalProperties"] = False
        if description:
            schema["description"] = description
        return schema

    def property(
        self, name: str, hint: Any, default: Any, documented: dict[str, str], owner: Any
    ) -> dict[str, Any]:
        """One parameter's or field's schema, with its default and description."""
        if default is None and hint is not inspect.Parameter.empty and not _admits_null(hint):
            hint = _nullable(hint)  # `x: str = None` takes None, as Python lets it
        try:
            schema = self.schema(hint)
        except _Unsupported as exc:
            where = f"{getattr(owner, '__qualname__', owner)}: parameter {name!r}"
            why = f" ({exc.why})" if exc.why else ""
            raise ValueError(
                f"{where}: type {_show(exc.hint)} has no JSON schema{why}; supported: {_ALLOWED}"
            ) from None
        if "description" not in schema and name in documented and documented[name]:
            schema = {**schema, "description": documented[name]}
        if default is not dataclasses.MISSING and default is not inspect.Parameter.empty:
            try:
                schema = {**schema, "default": _as_json(default)}
            except (TypeError, ValueError):
                pass  # a default JSON cannot carry: the parameter is just optional
        return schema

    def _pydantic(self, cls: type) -> dict[str, Any]:
        """A pydantic model's own schema, with its `$defs` merged into ours (renamed where a
        name is taken by another type, and every `$ref` to it rewritten)."""
        schema = cls.model_json_schema(ref_template="#/$defs/{model}")  # type: ignore[attr-defined]
        defs = schema.pop("$defs", {})
        renames: dict[str, str] = {}
        for name in defs:
            if name in self.defs and self.defs[name] != defs[name]:
                renames[name] = self._free_name(name)
                self.defs[renames[name]] = {}  # reserved
        if renames:
            schema = _rename_refs(schema, renames)
            defs = {renames.get(k, k): _rename_refs(v, renames) for k, v in defs.items()}
        self.defs.update(defs)
        return schema


def _nullable(hint: Any) -> Any:
    """`hint | None`, with Annotated metadata kept outside (so its description stays on top)."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *metadata = typing.get_args(hint)
        return typing.Annotated[(typing.Optional[base], *metadata)]  # noqa: UP045
    return typing.Optional[hint]  # noqa: UP045


def _constrain(schema: dict[str, Any], meta: Any) -> None:
    """Bounds from annotated_types (which pydantic's Field uses) that JSON Schema has too."""
    kind = type(meta).__name__
    is_array = schema.get("type") == "array"
    bounds = {
        "Ge": ("ge", "minimum"),
        "Gt": ("gt", "exclusiveMinimum"),
        "Le": ("le", "maximum"),
        "Lt": ("lt", "exclusiveMaximum"),
        "MinLen": ("min_length", "minItems" if is_array else "minLength"),
        "MaxLen": ("max_length", "maxItems" if is_array else "maxLength"),
        "MultipleOf": ("multiple_of", "multipleOf"),
    }
    if kind in bounds and type(meta).__module__ == "annotated_types":
        attr, key = bounds[kind]
        schema[key] = getattr(meta, attr)
    pattern = getattr(meta, "pattern", None)
    if isinstance(pattern, str) and type(meta).__module__.startswith("pydantic"):
        schema["pattern"] = pattern


def _rename_refs(node: Any, renames: dict[str, str]) -> Any:
    if isinstance(node, dict):
        out = {k: _rename_refs(v, renames) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = ref[len("#/$defs/") :]
            out["$ref"] = "#/$defs/" + renames.get(target, target)
        return out
    if isinstance(node, list):
        return [_rename_refs(v, renames) for v in node]
    return node


def _is_pydantic(cls: Any) -> bool:
    # Only if pydantic is loaded already: a model class cannot exist otherwise.
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(cls, type) and issubclass(cls, pydantic.BaseModel)


def _show(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__qualname__
    return repr(hint)


def _hints(obj: Any, what: str) -> dict[str, Any]:
    """Resolved type hints (Annotated kept), or a ValueError naming what did not resolve."""
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except Exception as exc:  # noqa: BLE001 - NameError, TypeError, SyntaxError from eval
        raise ValueError(
            f"{what}: its type hints cannot be resolved ({type(exc).__name__}: {exc}); define "
            "every type an annotation names at module level"
        ) from None


# --------------------------------------------------------------------------- schemas


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
    if isinstance(fn, type):
        owner = fn.__init__
    elif not (inspect.isroutine(fn) or hasattr(fn, "__wrapped__")):
        owner = type(fn).__call__  # a callable object
    hints = _hints(owner, title) if any(p.annotation is not p.empty for p in params) else {}
    summary, documented = parse_docstring(inspect.getdoc(fn))
    builder = _Builder()
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


# --------------------------------------------------------------------------- arguments


class ArgumentsError(ValueError):
    """Arguments a model produced do not fit the tool; the text says what to change."""


_adapters: dict[int, tuple[ToolSpec, dict[str, Any]]] = {}


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


def _adapters_of(spec: ToolSpec) -> dict[str, Any]:
    """One pydantic TypeAdapter per annotated parameter, built at the tool's first check."""
    hit = _adapters.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    params = spec.signature.parameters
    hints = _hints(spec.fn, spec.name) if any(
        p.annotation is not p.empty for p in params.values()
    ) else {}
    adapters: dict[str, Any] = {}
    for p in params.values():
        hint = hints.get(p.name, Any)
        if hint is Any or hint is p.empty:
            continue
        if p.default is None and not _admits_null(hint):
            hint = _nullable(hint)
        try:
            from pydantic import TypeAdapter

            adapters[p.name] = TypeAdapter(hint)
        except Exception:  # noqa: BLE001, S112 - a type pydantic cannot validate passes as is
            continue
    with _cache_lock:
        _adapters[id(spec)] = (spec, adapters)
    return adapters

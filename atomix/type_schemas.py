"""JSON Schema of Python type hints: what a model may pass for a parameter of each type.

Supported: str, int, float, bool, None, Optional and unions, list/tuple/set, dict[str, X],
Literal, Enum, Annotated (a str is a description; annotated_types bounds become JSON Schema
bounds), TypedDict, dataclasses, pydantic models, datetime/date/time, UUID, Path, Decimal,
bytes and Any. Named object types that refer to themselves go to `$defs`. A type with no JSON
form raises ValueError naming the parameter and what is supported.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import pathlib
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

from atomix.docstrings import parse_docstring

if TYPE_CHECKING:
    from pydantic import BaseModel

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


def admits_null(hint: Any) -> bool:
    """Whether a value of type `hint` may be None."""
    if hint is None or hint is type(None) or hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return admits_null(typing.get_args(hint)[0])
    if origin in _UNION_TYPES:
        return any(admits_null(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return None in typing.get_args(hint)
    return False


class SchemaBuilder:
    """Turns type hints into JSON Schema, for the parameters of one schema.

    Guarantees: a named object type (TypedDict, dataclass, pydantic model) that refers to
    itself is one entry of `defs`, referred to by `$ref`, under a name no other type of this
    schema has; any other type is inlined. A type with no JSON form raises ValueError.
    """

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
            prefix = [self.schema(a) for a in args]
            return {
                "type": "array",
                "prefixItems": prefix,
                "minItems": len(prefix),
                "maxItems": len(prefix),
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
        hints = type_hints(cls, cls.__name__)
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
        if default is None and hint is not inspect.Parameter.empty and not admits_null(hint):
            hint = nullable(hint)  # `x: str = None` takes None, as Python lets it
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

    def _pydantic(self, cls: type[BaseModel]) -> dict[str, Any]:
        """A pydantic model's own schema, with its `$defs` merged into ours (renamed where a
        name is taken by another type, and every `$ref` to it rewritten)."""
        schema = cls.model_json_schema(ref_template="#/$defs/{model}")
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


def nullable(hint: Any) -> Any:
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


def _is_pydantic(cls: Any) -> TypeGuard[type[BaseModel]]:
    # Only if pydantic is loaded already: a model class cannot exist otherwise.
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(cls, type) and issubclass(cls, pydantic.BaseModel)


def _show(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__qualname__
    return repr(hint)


def type_hints(obj: Any, what: str) -> dict[str, Any]:
    """Resolved type hints (Annotated kept), or a ValueError naming what did not resolve."""
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except Exception as exc:  # noqa: BLE001 - NameError, TypeError, SyntaxError from eval
        raise ValueError(
            f"{what}: its type hints cannot be resolved ({type(exc).__name__}: {exc}); define "
            "every type an annotation names at module level"
        ) from None

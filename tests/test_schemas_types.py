"""Tool schemas (atomix.schemas) of every supported type form: scalars, optionals and unions,
collections, literals and enums, Annotated descriptions and bounds, dataclasses, TypedDicts,
recursive types and pydantic models; each generated schema checked by a real JSON Schema
validator against good and bad calls."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, Optional, TypedDict

import pydantic
from schemas_support import Color, Point, assert_accepts, assert_rejects

from atomix import function_schema

# --------------------------------------------------------------------------- types


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Tree:
    label: str
    children: list[Tree] = dataclasses.field(default_factory=list)


class Address(TypedDict):
    street: str
    zip: NotRequired[str]


class Loose(TypedDict, total=False):
    note: str


class Item(pydantic.BaseModel):
    sku: str
    qty: int = pydantic.Field(default=1, ge=1, description="How many")


class Order(pydantic.BaseModel):
    """An order of items."""

    items: list[Item]
    rush: bool = False


def scalars(s: str, i: int, f: float, b: bool, n: None = None) -> None:
    """Scalars."""


def test_scalar_types_and_required() -> None:
    schema = function_schema(scalars)
    props = schema.parameters["properties"]
    assert props["s"] == {"type": "string"}
    assert props["i"] == {"type": "integer"}
    assert props["f"] == {"type": "number"}
    assert props["b"] == {"type": "boolean"}
    assert props["n"] == {"type": "null", "default": None}
    assert schema.parameters["required"] == ["s", "i", "f", "b"]
    assert schema.parameters["additionalProperties"] is False
    assert_accepts(schema, {"s": "a", "i": 1, "f": 1.5, "b": True}, {"s": "", "i": 0, "f": 2, "b": False, "n": None})
    assert_rejects(
        schema,
        {"s": "a", "i": 1.5, "f": 1.0, "b": True},
        {"s": 1, "i": 1, "f": 1.0, "b": True},
        {"s": "a", "i": 1, "f": 1.0, "b": "yes"},
        {"s": "a", "i": 1, "f": 1.0},
        {"s": "a", "i": 1, "f": 1.0, "b": True, "extra": 1},
    )


def optionals(a: Optional[int], b: str | None, c: int | str, d: list[int] | None = None) -> None:  # noqa: UP045
    pass


def test_optional_and_unions() -> None:
    schema = function_schema(optionals)
    props = schema.parameters["properties"]
    assert props["a"] == {"type": ["integer", "null"]}
    assert props["b"] == {"type": ["string", "null"]}
    assert props["c"] == {"type": ["integer", "string"]}
    assert props["d"]["anyOf"] == [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]
    assert schema.parameters["required"] == ["a", "b", "c"]
    assert_accepts(schema, {"a": None, "b": None, "c": 1}, {"a": 1, "b": "x", "c": "y", "d": [1, 2]})
    assert_rejects(schema, {"a": "1", "b": None, "c": 1}, {"a": 1, "b": None, "c": 1, "d": ["x"]})


def collections(
    tags: list[str],
    pair: tuple[int, str],
    many: tuple[float, ...],
    unique: set[int],
    counts: dict[str, int],
    anything: list,  # type: ignore[type-arg]
    blob: dict,  # type: ignore[type-arg]
) -> None:
    pass


def test_collections() -> None:
    schema = function_schema(collections)
    props = schema.parameters["properties"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    assert props["many"] == {"type": "array", "items": {"type": "number"}}
    assert props["unique"] == {"type": "array", "uniqueItems": True, "items": {"type": "integer"}}
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["anything"] == {"type": "array"}
    assert props["blob"] == {"type": "object"}
    good = {
        "tags": ["a"],
        "pair": [1, "x"],
        "many": [1.0, 2],
        "unique": [1, 2],
        "counts": {"a": 1},
        "anything": [1, "a"],
        "blob": {"k": [1]},
    }
    assert_accepts(schema, good)
    assert_rejects(
        schema,
        {**good, "pair": [1, "x", 3]},
        {**good, "pair": ["x", 1]},
        {**good, "unique": [1, 1]},
        {**good, "counts": {"a": "1"}},
        {**good, "tags": "a"},
    )


def choices(mode: Literal["fast", "slow"], color: Color, level: Level = Level.LOW, mixed: Literal[1, "a"] = 1) -> None:
    pass


def test_literal_and_enum() -> None:
    schema = function_schema(choices)
    props = schema.parameters["properties"]
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    # An enum default is given as its value, which is what the model sends.
    assert props["level"] == {"type": "integer", "enum": [1, 2], "default": 1}
    assert props["mixed"] == {"enum": [1, "a"], "default": 1}
    assert_accepts(schema, {"mode": "fast", "color": "red"}, {"mode": "slow", "color": "blue", "level": 2, "mixed": "a"})
    assert_rejects(schema, {"mode": "medium", "color": "red"}, {"mode": "fast", "color": "RED"}, {"mode": "fast", "color": "red", "level": 3})


def annotated(
    path: Annotated[str, "Where to write"],
    count: Annotated[int, pydantic.Field(description="How many times", ge=0, le=10)] = 1,
) -> None:
    """Write.

    Args:
        path: This docstring text loses to the Annotated one.
    """


def test_annotated_descriptions_and_bounds() -> None:
    schema = function_schema(annotated)
    props = schema.parameters["properties"]
    assert props["path"] == {"type": "string", "description": "Where to write"}
    assert props["count"] == {
        "type": "integer",
        "description": "How many times",
        "minimum": 0,
        "maximum": 10,
        "default": 1,
    }
    assert_accepts(schema, {"path": "a", "count": 10})
    assert_rejects(schema, {"path": "a", "count": 11}, {"path": "a", "count": -1})


def objects(where: Point, address: Address, extra: Loose, tree: Tree | None = None) -> None:
    pass


def test_dataclass_typeddict_and_recursion() -> None:
    schema = function_schema(objects)
    props = schema.parameters["properties"]
    assert props["where"] == {
        "type": "object",
        "properties": {
            "x": {"type": "integer", "description": "Horizontal position."},
            "y": {"type": "integer", "description": "Vertical position.", "default": 0},
        },
        "required": ["x"],
        "additionalProperties": False,
        "description": "A point on the plane.",
    }
    # NotRequired is honoured although this module uses `from __future__ import annotations`.
    assert props["address"]["required"] == ["street"]
    assert "required" not in props["extra"]
    # A type that contains itself goes to $defs, referred to by $ref.
    assert props["tree"]["anyOf"][0] == {"$ref": "#/$defs/Tree"}
    tree = schema.parameters["$defs"]["Tree"]
    assert tree["properties"]["children"]["items"] == {"$ref": "#/$defs/Tree"}
    good = {
        "where": {"x": 1},
        "address": {"street": "Main"},
        "extra": {},
        "tree": {"label": "a", "children": [{"label": "b", "children": []}]},
    }
    assert_accepts(schema, good, {**good, "address": {"street": "Main", "zip": "123"}})
    assert_rejects(
        schema,
        {**good, "where": {"y": 1}},
        {**good, "where": {"x": 1, "z": 2}},
        {**good, "address": {"zip": "1"}},
        {**good, "tree": {"label": "a", "children": [{"children": []}]}},
    )


def shop(order: Order, backup: Item | None = None) -> None:
    """Place an order."""


def test_pydantic_models_keep_valid_refs() -> None:
    schema = function_schema(shop)
    params = schema.parameters
    assert params["properties"]["order"]["properties"]["items"]["items"] == {"$ref": "#/$defs/Item"}
    assert params["$defs"]["Item"]["properties"]["qty"]["minimum"] == 1
    good = {"order": {"items": [{"sku": "a", "qty": 2}]}, "backup": {"sku": "b"}}
    assert_accepts(schema, good)
    assert_rejects(schema, {"order": {"items": [{"sku": "a", "qty": 0}]}}, {"order": {"items": [{"qty": 1}]}})


class Clash(pydantic.BaseModel):
    item: Item


def two_items(a: Clash, b: Annotated[Order, "another model using Item"]) -> None:
    pass


def test_pydantic_defs_merge_without_clobbering() -> None:
    schema = function_schema(two_items)
    defs = schema.parameters["$defs"]
    assert list(defs) == ["Item"]  # one Item, shared by both models
    assert_accepts(schema, {"a": {"item": {"sku": "x"}}, "b": {"items": []}})


OtherItem = pydantic.create_model("Item", code=(int, ...))  # another model named Item
OtherOrder = pydantic.create_model("OtherOrder", items=(list[OtherItem], ...))  # type: ignore[valid-type]


def clashing(a: Order, b: OtherOrder) -> None:  # type: ignore[valid-type]
    pass


def test_pydantic_defs_of_the_same_name_are_renamed() -> None:
    schema = function_schema(clashing)
    defs = schema.parameters["$defs"]
    assert sorted(defs) == ["Item", "Item2"]
    assert defs["Item2"]["required"] == ["code"]
    assert schema.parameters["properties"]["b"]["properties"]["items"]["items"] == {
        "$ref": "#/$defs/Item2"
    }
    good = {"a": {"items": [{"sku": "s"}]}, "b": {"items": [{"code": 1}]}}
    assert_accepts(schema, good)
    assert_rejects(schema, {**good, "b": {"items": [{"sku": "s"}]}})


def anything(a, b: Any, c: object = None) -> None:  # noqa: ANN001
    pass


def test_any_and_unannotated_accept_anything() -> None:
    schema = function_schema(anything)
    props = schema.parameters["properties"]
    assert props["a"] == {}
    assert props["b"] == {}
    assert props["c"] == {"default": None}
    assert_accepts(schema, {"a": [1], "b": {"x": None}}, {"a": "s", "b": 3, "c": 2})


def misc(day: __import__("datetime").date, where: Path, token: bytes = b"") -> None:
    pass


def test_strings_of_other_types() -> None:
    props = function_schema(misc).parameters["properties"]
    assert props["day"] == {"type": "string", "format": "date"}
    assert props["where"] == {"type": "string"}
    assert props["token"] == {"type": "string"}  # b"" is not JSON: no default shown

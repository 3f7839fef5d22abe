"""Tool schemas (atomix.schemas): every supported type form, the three docstring styles,
defaults and required parameters, the hidden idempotency key, the OpenAI and MCP shapes, and
each generated schema checked by a real JSON Schema validator against good and bad calls."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, Optional, TypedDict

import pydantic
import pytest

from atomix import Runtime, ToolSchema, function_schema, tool_schema
from atomix.schemas import ArgumentsError, check_arguments, parse_docstring
from atomix.tools import define_tool


def validator(schema: dict[str, Any]) -> Any:
    """A validator for the draft the schemas are written in (2020-12: prefixItems, $defs),
    after checking that the schema itself is valid JSON Schema. (jsonschema comes with the
    mcp package; without it a test skips at its first validation, its other checks done.)"""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def assert_accepts(schema: ToolSchema, *good: dict[str, Any]) -> None:
    check = validator(schema.parameters)
    for args in good:
        errors = [e.message for e in check.iter_errors(args)]
        assert not errors, (args, errors)


def assert_rejects(schema: ToolSchema, *bad: dict[str, Any]) -> None:
    check = validator(schema.parameters)
    for args in bad:
        assert not check.is_valid(args), args


# --------------------------------------------------------------------------- types


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Point:
    """A point on the plane.

    Attributes:
        x: Horizontal position.
        y: Vertical position.
    """

    x: int
    y: int = 0


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


# --------------------------------------------------------------------------- defaults


ORIGIN = Point(0)


def defaults(a: int, b: str = "x", c: list[int] = [1, 2], d: str = None, e: Point = ORIGIN) -> None:  # noqa: B006, RUF013
    pass


def test_defaults_required_and_implicit_optional() -> None:
    schema = function_schema(defaults)
    props = schema.parameters["properties"]
    assert schema.parameters["required"] == ["a"]
    assert props["b"]["default"] == "x"
    assert props["c"]["default"] == [1, 2]
    # `d: str = None` takes None, as Python lets a caller pass it.
    assert props["d"] == {"type": ["string", "null"], "default": None}
    assert "default" not in props["e"]  # not JSON: optional without a shown default
    assert_accepts(schema, {"a": 1, "d": None})


def test_function_without_future_annotations() -> None:
    namespace: dict[str, Any] = {}
    source = (
        "from typing import Annotated, Optional\n"
        "def plain(a: int, b: Annotated[Optional[str], 'the b'] = None) -> None:\n"
        "    'Plain.'\n"
    )
    exec(compile(source, "<plain>", "exec", dont_inherit=True), namespace)  # noqa: S102
    schema = function_schema(namespace["plain"])
    assert schema.description == "Plain."
    assert schema.parameters["properties"] == {
        "a": {"type": "integer"},
        "b": {"type": ["string", "null"], "description": "the b", "default": None},
    }


# --------------------------------------------------------------------------- docstrings


def google(path: str, text: str, mode: str = "w") -> None:
    """Write text to a file.

    The file is created if it does not exist.

    Args:
        path (str): Where to write,
            relative to the root.
        text: What to write.
        mode: How to open it.

    Returns:
        Nothing.
    """


def numpy_style(path: str, text: str, mode: str = "w") -> None:
    """Write text to a file.

    Parameters
    ----------
    path : str
        Where to write,
        relative to the root.
    text, mode : str
        What to write, and how.

    Returns
    -------
    None
    """


def sphinx(path: str, text: str, mode: str = "w") -> None:
    """Write text to a file.

    :param path: Where to write,
        relative to the root.
    :param str text: What to write.
    :type text: str
    :returns: nothing
    """


@pytest.mark.parametrize(
    ("fn", "text", "mode"),
    [
        (google, "What to write.", "How to open it."),
        (numpy_style, "What to write, and how.", "What to write, and how."),
        (sphinx, "What to write.", None),
    ],
)
def test_docstring_styles(fn: Any, text: str, mode: str | None) -> None:
    schema = function_schema(fn)
    assert schema.description == "Write text to a file."
    props = schema.parameters["properties"]
    assert props["path"]["description"] == "Where to write, relative to the root."
    assert props["text"]["description"] == text
    assert props["mode"].get("description") == mode


def test_docstring_edge_cases() -> None:
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("One line.") == ("One line.", {})
    # A summary running straight into a section stops at the section.
    assert parse_docstring("Summary\nacross lines.\nArgs:\n    a: The a.") == (
        "Summary across lines.",
        {"a": "The a."},
    )
    # Returns/Raises entries are not parameters.
    doc = "Do.\n\nRaises:\n    ValueError: when bad.\n\nArgs:\n    x: The x.\n"
    assert parse_docstring(doc) == ("Do.", {"x": "The x."})
    assert function_schema(google, description="Override").description == "Override"


# --------------------------------------------------------------------------- tools


def test_rt_tool_schema_hides_idempotency_key_and_is_cached(tmp_path: Path) -> None:
    rt = Runtime()

    @rt.tool(effect="bufferable", writes=f"fs:{tmp_path}/{{name}}")
    def save(name: str, body: str = "", idempotency_key: str = "") -> None:
        """Save a note.

        Args:
            name: The note's file name.
            body: Its text.
        """

    schema = tool_schema(save)
    assert schema.name == "save"
    assert "idempotency_key" not in schema.parameters["properties"]
    assert schema.parameters["required"] == ["name"]
    assert schema.parameters["properties"]["name"]["description"] == "The note's file name."
    assert tool_schema(save) is schema  # cached per tool
    assert tool_schema(save.spec) is schema
    assert function_schema(save) == schema
    assert rt.tool_schemas() == [schema]
    assert_rejects(schema, {"name": "a", "idempotency_key": "k"})


def test_runtime_tool_schemas_skip_names_two_functions_share() -> None:
    rt = Runtime()

    def first(a: int) -> int:
        return a

    def second(b: str) -> str:
        return b

    rt.tool(first, name="same")
    rt.tool(second, name="same")
    ok = rt.tool(lambda x: x, name="other")
    assert [s.name for s in rt.tool_schemas()] == ["other"]
    assert tool_schema(ok).parameters["properties"] == {"x": {}}


def test_tool_schema_of_a_spec_with_an_unhashable_default() -> None:
    spec = define_tool(lambda tags=[]: tags, name="tags")  # noqa: B006
    assert tool_schema(spec).parameters["properties"]["tags"] == {"default": []}


def test_openai_and_mcp_shapes() -> None:
    schema = function_schema(google)
    openai = schema.openai()
    assert openai == {
        "type": "function",
        "function": {
            "name": "google",
            "description": "Write text to a file.",
            "parameters": schema.parameters,
        },
    }
    mcp = schema.mcp()
    assert mcp == {
        "name": "google",
        "description": "Write text to a file.",
        "inputSchema": schema.parameters,
    }
    # Exports are copies: changing one does not change the cached schema.
    openai["function"]["parameters"]["properties"].clear()
    mcp["inputSchema"]["required"].append("x")
    assert set(schema.parameters["properties"]) == {"path", "text", "mode"}
    assert schema.parameters["required"] == ["path", "text"]
    json.dumps(schema.openai())  # plain JSON


def test_openai_refuses_a_name_it_would_reject() -> None:
    schema = function_schema(google, name="files.write")
    assert schema.mcp()["name"] == "files.write"
    with pytest.raises(ValueError, match="1-64 letters"):
        schema.openai()


# --------------------------------------------------------------------------- errors


def db_first(db: object, query: str) -> None:
    pass


def test_skip_drops_parameters_and_names_unknown_ones() -> None:
    schema = function_schema(db_first, skip=["db"])
    assert list(schema.parameters["properties"]) == ["query"]
    with pytest.raises(ValueError, match=r"skip names \['nope'\]"):
        function_schema(db_first, skip=["nope"])


def star(a: int, *rest: int, **more: int) -> None:
    pass


def positional(a: int, /, b: int) -> None:
    pass


def test_parameters_not_passable_by_keyword_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\['rest', 'more'\] cannot be passed by keyword"):
        function_schema(star)
    with pytest.raises(ValueError, match=r"\['a'\] cannot be passed by keyword"):
        function_schema(positional)
    assert list(function_schema(positional, skip=["a"]).parameters["properties"]) == ["b"]


class Opaque:
    pass


def opaque(x: Opaque) -> None:
    pass


def int_keys(m: dict[int, str]) -> None:
    pass


def unresolved(x: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
    pass


def test_types_without_a_json_form_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"parameter 'x': type Opaque has no JSON schema"):
        function_schema(opaque)
    with pytest.raises(ValueError, match="JSON object keys are strings"):
        function_schema(int_keys)
    with pytest.raises(ValueError, match=r"unresolved: its type hints cannot be resolved.*NoSuchType"):
        function_schema(unresolved)
    with pytest.raises(TypeError, match="is not a tool"):
        tool_schema(opaque)


# --------------------------------------------------------------------------- arguments


def test_check_arguments_converts_and_explains() -> None:
    rt = Runtime()

    @rt.tool
    def plan(where: Point, color: Color, when: int = 0, note: str = None) -> None:  # noqa: RUF013
        pass

    args = check_arguments(plan, {"where": {"x": 1}, "color": "red", "when": "3"})
    assert args == {"where": Point(1, 0), "color": Color.RED, "when": 3}
    assert check_arguments(plan, {"where": {"x": 1}, "color": "red", "note": None})["note"] is None
    with pytest.raises(ArgumentsError, match=r"unknown argument\(s\) 'size'; missing required argument\(s\) 'where'"):
        check_arguments(plan, {"color": "red", "size": 2})
    with pytest.raises(ArgumentsError, match=r"argument 'color': Input should be 'red' or 'blue'"):
        check_arguments(plan, {"where": {"x": 1}, "color": "green"})
    with pytest.raises(ArgumentsError, match=r"argument 'where'\['x'\]: Field required"):
        check_arguments(plan, {"where": {}, "color": "red"})
    with pytest.raises(ArgumentsError, match="must be a JSON object, not list"):
        check_arguments(plan, [1])  # type: ignore[arg-type]

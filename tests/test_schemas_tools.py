"""Tool schemas (atomix.schemas) beyond the type forms: defaults and required parameters, the
three docstring styles, the schema of a tool (hidden idempotency key, cached), the OpenAI and
MCP shapes, clear errors, and argument checking against a tool's parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from schemas_support import Color, Point, assert_accepts, assert_rejects

from atomix import Runtime, function_schema, tool_schema
from atomix.arguments import ArgumentsError, check_arguments
from atomix.docstrings import parse_docstring
from atomix.tools import define_tool

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

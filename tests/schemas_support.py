"""Shared by the tool-schema tests (test_schemas_*.py): a real JSON Schema validator for the
generated schemas, checks that one accepts good calls and rejects bad ones, and two of the
types the schemas are generated for (an enum and a documented dataclass)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pytest

from atomix import ToolSchema


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


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    """A point on the plane.

    Attributes:
        x: Horizontal position.
        y: Vertical position.
    """

    x: int
    y: int = 0

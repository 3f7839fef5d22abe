"""Reading tool calls off the wire: a ChatCompletion, a choice, a message or a list of calls
(openai SDK objects or plain dicts of the same shapes), checked against the offered tools."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from atomix.arguments import ArgumentsError, check_arguments
from atomix.tools import ToolSpec


@dataclasses.dataclass(slots=True)
class ToolCall:
    """One tool call as parsed: what to run, or why it cannot run.

    Guarantees: exactly one of (`spec` and `args`) or `error` describes the call; a call with
    an error is never run.
    """

    id: str
    name: str
    spec: ToolSpec | None = None
    args: dict[str, Any] | None = None
    error: str | None = None  # set when the call is invalid: it never runs


def parse(tool_calls: Any, catalog: Mapping[str, ToolSpec]) -> list[ToolCall]:
    """The calls of `tool_calls`, in order, each bound to its tool of `catalog` with checked
    arguments, or carrying the error the model will read. A malformed container (not a
    completion, message or call; a call without an id) raises: that is the caller's mistake,
    not the model's."""
    calls = []
    for index, raw in enumerate(_tool_calls(tool_calls)):
        call_id, kind, name, arguments = _fields(raw, index)
        call = ToolCall(call_id, name if isinstance(name, str) else repr(name))
        calls.append(call)
        if kind != "function":
            call.error = f"only function tool calls are supported, not type {kind!r}"
            continue
        spec = catalog.get(name) if isinstance(name, str) else None
        if spec is None:
            offered = ", ".join(catalog) or "none"
            call.error = f"there is no tool named {call.name!r}; the tools are: {offered}"
            continue
        call.spec = spec
        if arguments is None or arguments == "":
            arguments = "{}"  # a call of a tool without parameters
        if isinstance(arguments, str | bytes):
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                call.error = (
                    f"the arguments of {call.name} are not valid JSON ({exc}); send one "
                    "JSON object of the parameters"
                )
                continue
        try:
            call.args = check_arguments(spec, arguments)
        except ArgumentsError as exc:
            call.error = f"wrong arguments for {call.name}: {exc}"
    return calls


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _tool_calls(obj: Any) -> list[Any]:
    """The tool calls of a ChatCompletion, a choice, a message, or a list of calls (SDK
    objects or dicts); a ChatCompletion's first choice is the one taken."""
    if obj is None:
        return []
    if isinstance(obj, str | bytes):
        raise TypeError(
            "tool calls: got a string; pass the ChatCompletion, its message or its tool_calls"
        )
    choices = _get(obj, "choices")
    if choices is not None:
        if not choices:
            raise ValueError("tool calls: the ChatCompletion has no choices")
        return _tool_calls(_get(choices[0], "message"))
    message = _get(obj, "message")
    if message is not None and _get(obj, "function") is None:  # a Choice
        return _tool_calls(message)
    if isinstance(obj, Mapping):
        if "tool_calls" in obj or "role" in obj:
            return list(obj.get("tool_calls") or [])
        if "function" in obj:
            return [obj]
        raise TypeError(
            f"tool calls: a dict with keys {sorted(obj)} is not a ChatCompletion, a message or "
            "a tool call"
        )
    if hasattr(obj, "tool_calls"):
        return list(obj.tool_calls or [])
    if hasattr(obj, "function"):
        return [obj]
    if isinstance(obj, Sequence | Iterable):
        return list(obj)
    raise TypeError(
        f"tool calls: {type(obj).__name__} is not a ChatCompletion, a message or a tool call"
    )


def _fields(call: Any, index: int) -> tuple[str, Any, Any, Any]:
    """(id, type, function name, arguments) of one tool call."""
    call_id = _get(call, "id")
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(
            f"tool call #{index}: it has no id ({call!r}); each tool message must name the id "
            "of its call"
        )
    kind = _get(call, "type") or "function"
    function = _get(call, "function")
    if function is None:
        return call_id, kind, None, None
    return call_id, kind, _get(function, "name"), _get(function, "arguments")

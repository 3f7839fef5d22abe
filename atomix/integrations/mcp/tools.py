"""How a policy turns the upstream server's tools into runtime tools.

`build_tools` matches the policy to the upstream listing (each tool gets its rule, its
arguments' template names, and what the client is offered); `UpstreamShims` defines one
runtime tool per upstream tool, whose call is forwarded to the upstream session and whose
compensation (reversible tools) calls the compensating upstream tool with the policy's
arguments rendered from the original call (`render`). docs/mcp-proxy.md documents the
template syntax.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import keyword
import os
import re
import string
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, TypeVar, cast

import mcp.types as types
from mcp import ClientSession

from atomix.effects import EffectClass
from atomix.errors import ToolDefinitionError
from atomix.runtime import Runtime
from atomix.scope_parsing import parse_scope
from atomix.tools import Call, ToolSpec, define_tool

from .policy import DefaultPolicy, PolicyError, ProxyPolicy, ToolPolicy, did_you_mean

__all__ = [
    "ABORT",
    "COMMIT",
    "CONTROL_TOOLS",
    "KEY_PARAM",
    "META_KEY",
    "STATUS",
    "ProxiedTool",
    "SchemaValidator",
    "Shim",
    "UpstreamShims",
    "UpstreamToolError",
    "argument_problem",
    "build_tools",
    "definition_problems",
    "render",
    "result_text",
    "schema_validator",
    "template_name",
]

T = TypeVar("T")
COMMIT, ABORT, STATUS = "atomix_commit", "atomix_abort", "atomix_status"
#: The proxy's own tools; no upstream tool may take one of these names.
CONTROL_TOOLS = (COMMIT, ABORT, STATUS)
#: The `_meta` key under which an effect's idempotency key travels to the upstream server
#: (a server that honours it can drop a duplicate; others ignore `_meta`).
META_KEY = "atomix/idempotency_key"
#: The parameter through which the runtime hands an effect's tool its idempotency key.
KEY_PARAM = "idempotency_key"


def template_name(argument: str) -> str:
    """How a template names an upstream argument: the argument itself when it is a Python
    identifier; else each other character becomes `_`; a keyword (and `idempotency_key`,
    which the runtime reserves) gains a trailing `_`."""
    name = re.sub(r"\W", "_", argument)
    if not name or name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name) or name == KEY_PARAM:
        name += "_"
    return name


@dataclass(frozen=True, slots=True)
class ProxiedTool:
    """One upstream tool as the proxy offers and settles it. `offered` is the upstream
    listing, unchanged except that a deferred tool (bufferable, irreversible) loses its
    output schema: its immediate result is an acknowledgement, not the tool's output."""

    name: str
    offered: types.Tool
    rule: ToolPolicy | DefaultPolicy
    rule_key: str  # where its rule is in the policy: "tools.NAME" or "default"
    params: dict[str, str]  # template name -> upstream argument name
    required: frozenset[str]  # template names
    # template name -> the schema's `default`, used (and forwarded) when a call omits it
    defaults: dict[str, Any] = field(default_factory=dict)
    # template names whose schema accepts null: an omitted one (no default) is sent as null;
    # any other omitted argument is not sent at all
    nullable: frozenset[str] = frozenset()

    @property
    def effect(self) -> EffectClass | None:
        return self.rule.effect_class

    @property
    def deferred(self) -> bool:
        return self.effect in (EffectClass.BUFFERABLE, EffectClass.IRREVERSIBLE)


# --------------------------------------------------------------------------- matching


def build_tools(
    policy: ProxyPolicy, path: str | os.PathLike[str], upstream: Sequence[types.Tool]
) -> dict[str, ProxiedTool]:
    """Match the policy to the upstream listing; raise PolicyError for every mismatch (a tool
    the policy names but the server lacks, a compensation naming an unknown tool or
    argument, an upstream tool that shadows a control tool)."""
    problems: list[str] = []
    by_name = {t.name: t for t in upstream}
    for name in policy.tools:
        if name not in by_name:
            problems.append(
                f"tools.{name}: the upstream server has no tool {name!r}"
                f"{did_you_mean(name, by_name)}; it has: {', '.join(sorted(by_name))}"
            )
    for name in CONTROL_TOOLS:
        if name in by_name:
            problems.append(
                f"(upstream): the upstream server has a tool named {name!r}, which the proxy "
                "reserves for its own control tools"
            )
    out: dict[str, ProxiedTool] = {}
    for tool in upstream:
        rule: ToolPolicy | DefaultPolicy = policy.tools.get(tool.name) or policy.default
        where = f"tools.{tool.name}" if tool.name in policy.tools else "default"
        schema = tool.input_schema or {}
        properties = schema.get("properties") or {}
        params: dict[str, str] = {}
        for argument in properties:
            name = template_name(argument)
            if name in params:
                problems.append(
                    f"{where}: upstream tool {tool.name!r}: arguments {params[name]!r} and "
                    f"{argument!r} are both spelled {{{name}}} in templates"
                )
            params[name] = argument
        names = {v: k for k, v in params.items()}
        required = frozenset(names[a] for a in schema.get("required") or [] if a in names)
        defaults = {
            names[a]: p["default"]
            for a, p in properties.items()
            if isinstance(p, Mapping) and "default" in p and names[a] not in required
        }
        offered = tool
        if rule.effect in (EffectClass.BUFFERABLE.value, EffectClass.IRREVERSIBLE.value):
            offered = tool.model_copy(update={"output_schema": None})
        entry = ProxiedTool(
            tool.name, offered, rule, where, params, required, defaults, _nullable(schema, names)
        )
        if rule.compensate is not None:
            problems += _compensation_problems(entry, by_name)
        problems += definition_problems(entry)
        out[tool.name] = entry
    if problems:
        raise PolicyError(path, problems)
    return out


def _nullable(schema: Mapping[str, Any], names: Mapping[str, str]) -> frozenset[str]:
    """The template names of the arguments whose schema accepts null (checked against the
    whole input schema, so that a `$ref` resolves)."""
    validator = schema_validator(schema)
    if validator is None:
        return frozenset()
    out = set()
    for argument, name in names.items():
        errors = validator.iter_errors({argument: None})
        if not any(list(e.absolute_path)[:1] == [argument] for e in errors):
            out.add(name)
    return frozenset(out)


def _compensation_problems(entry: ProxiedTool, by_name: Mapping[str, types.Tool]) -> list[str]:
    comp = entry.rule.compensate
    assert comp is not None
    where = f"{entry.rule_key}.compensate"
    target = by_name.get(comp.tool)
    if target is None:
        return [
            f"{where}.tool: the upstream server has no tool {comp.tool!r}"
            f"{did_you_mean(comp.tool, by_name)}; it has: {', '.join(sorted(by_name))}"
        ]
    problems = []
    schema = target.input_schema or {}
    properties = schema.get("properties")
    for param, value in comp.args.items():
        if properties is not None and param not in properties:
            problems.append(
                f"{where}.args.{param}: {comp.tool!r} has no argument {param!r}"
                f"{did_you_mean(param, properties)}; it has: {', '.join(sorted(properties))}"
            )
        if isinstance(value, str):
            for _, name, _, _ in string.Formatter().parse(value):
                if (
                    name and name.isidentifier() and name not in ("result", "before")
                    and name not in entry.params
                ):
                    problems.append(
                        f"{where}.args.{param}: template {value!r} names {{{name}}}, which is "
                        f"not an argument of {entry.name!r} (it has: "
                        f"{', '.join(sorted(entry.params)) or 'none'}; or use {{result.FIELD}})"
                    )
    missing = [a for a in schema.get("required") or [] if a not in comp.args]
    if missing:
        problems.append(f"{where}.args: {comp.tool!r} requires {', '.join(map(repr, missing))}")
    before = entry.rule.before
    if before is not None:
        reader = by_name.get(before.tool)
        here = f"{entry.rule_key}.before"
        if reader is None:
            problems.append(
                f"{here}.tool: the upstream server has no tool {before.tool!r}"
                f"{did_you_mean(before.tool, by_name)}; it has: {', '.join(sorted(by_name))}"
            )
        else:
            props = (reader.input_schema or {}).get("properties")
            for param, value in before.args.items():
                if props is not None and param not in props:
                    problems.append(
                        f"{here}.args.{param}: {before.tool!r} has no argument {param!r}"
                        f"{did_you_mean(param, props)}; it has: {', '.join(sorted(props))}"
                    )
                for name in _fields(value):
                    if name.isidentifier() and name not in entry.params:
                        problems.append(
                            f"{here}.args.{param}: template {value!r} names {{{name}}}, which is "
                            f"not an argument of {entry.name!r}"
                        )
            needed = [a for a in (reader.input_schema or {}).get("required") or [] if a not in before.args]
            if needed:
                problems.append(f"{here}.args: {before.tool!r} requires {', '.join(map(repr, needed))}")
    return problems


def _fields(value: Any) -> list[str]:
    if not isinstance(value, str):
        return []
    return [f for _, f, _, _ in string.Formatter().parse(value) if f]


# --------------------------------------------------------------------------- runtime tools


class _ToolMetadata(TypedDict):
    """The keyword arguments of `define_tool` (and `rt.tool`) for one upstream tool."""

    effect: EffectClass | None
    reads: list[str] | None
    writes: list[str] | None
    key: str | None
    compensate: Callable[[Call], Any] | None
    before: Callable[..., Any] | None
    name: str


def _tool_metadata(
    entry: ProxiedTool,
    forward: Callable[..., Any],
    compensate: Callable[[Call], Any],
    before: Callable[..., Any] | None = None,
) -> _ToolMetadata:
    """What `rt.tool` (or `define_tool`) needs for one upstream tool. `forward` gets the
    signature of the tool's arguments (keyword-only, by template name; an optional one
    defaults to its schema default, else None), plus `idempotency_key` for an effect."""
    params = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=(
                inspect.Parameter.empty if name in entry.required else entry.defaults.get(name)
            ),
        )
        for name in entry.params
    ]
    if entry.effect is not None:  # the runtime hands each effect its key through it
        params.append(inspect.Parameter(KEY_PARAM, inspect.Parameter.KEYWORD_ONLY, default=None))
    # define_tool reads the tool's arguments with inspect.signature, which honours
    # `__signature__`: `forward` itself takes **kwargs whatever the upstream tool is.
    forward.__dict__["__signature__"] = inspect.Signature(params)
    writes: list[str] = list(entry.rule.writes)
    if entry.effect is not None and not writes:
        writes = [_tool_scope(entry.name)]
    return {
        "effect": entry.effect,
        "reads": list(entry.rule.reads) or None,
        "writes": writes or None,
        "key": entry.rule.key,
        "compensate": compensate if entry.rule.compensate is not None else None,
        "before": before if entry.rule.before is not None else None,
        "name": entry.name,
    }


def _tool_scope(tool: str) -> str:
    """The scope of an effect tool whose rule names none: one per tool."""
    text = "mcp:tool:" + re.sub(r"[^A-Za-z0-9_.-]", "_", tool)
    parse_scope(text)
    return text


def definition_problems(entry: ProxiedTool) -> list[str]:
    """The runtime's own checks of the tool's scope and key templates, as policy problems."""

    async def forward(**kwargs: Any) -> None:
        return None

    async def compensate(call: Call) -> None:
        return None

    async def before(**kwargs: Any) -> None:
        return None

    try:
        define_tool(forward, **_tool_metadata(entry, forward, compensate, before))
    except ToolDefinitionError as exc:
        why = str(exc).removeprefix(f"tool {exc.tool!r}: field {exc.field!r}: ")
        where = f"{entry.rule_key}.{exc.field}"
        if entry.rule_key == "default":
            where += f" (for upstream tool {entry.name!r})"
        return [f"{where}: {why}"]
    return []


class Shim(Protocol):
    """A runtime tool as `rt.tool` makes it: callable like the tool, with its spec."""

    spec: ToolSpec

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class UpstreamToolError(RuntimeError):
    """The upstream server answered a call with an error result."""

    def __init__(self, tool: str, result: types.CallToolResult) -> None:
        self.result = result
        super().__init__(f"{tool}: {result_text(result) or 'error result'}")


class UpstreamShims:
    """One runtime tool per proxied upstream tool, on one Runtime and one upstream session.

    Guarantees: every upstream call runs on the event loop that owns the session (also when
    the runtime's recovery calls a tool from a worker thread); a delivery the server answers
    with an error raises (so the runtime counts a failed apply, not a success); a call whose
    result says it failed is not compensated; a deferred call's delivered result is kept by
    its key in `delivered` until the settlement report takes it.
    """

    def __init__(
        self, rt: Runtime, upstream: ClientSession, tools: Mapping[str, ProxiedTool]
    ) -> None:
        self.upstream = upstream
        self.delivered: dict[str, types.CallToolResult] = {}
        self._loop = asyncio.get_running_loop()
        self._shims = {name: self._define(rt, entry) for name, entry in tools.items()}

    def __getitem__(self, name: str) -> Shim:
        return self._shims[name]

    def _define(self, rt: Runtime, entry: ProxiedTool) -> Shim:
        async def forward(**kwargs: Any) -> dict[str, Any]:
            return await self._main_loop(self._forward(entry, kwargs))

        async def compensate(call: Call) -> None:
            await self._main_loop(self._compensate(entry, call))

        async def before(**kwargs: Any) -> Any:
            return await self._main_loop(self._before(entry, kwargs))

        shim: Shim = rt.tool(forward, **_tool_metadata(entry, forward, compensate, before))
        return shim

    async def _before(self, entry: ProxiedTool, kwargs: dict[str, Any]) -> Any:
        """The before-image: the policy's `before` call's result as the wire's JSON (None if
        the server answered it with an error, e.g. there was nothing there yet)."""
        rule = entry.rule.before
        assert rule is not None
        args = {p: render(v, kwargs, None) for p, v in rule.args.items()}
        result = await self.upstream.call_tool(rule.tool, args)
        return None if result.is_error else _wire(result)

    async def _main_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the proxy's event loop, which owns the upstream session. Recovery
        runs a tool in a worker thread under a loop of its own (see
        TransactionalProxy.recover)."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _forward(self, entry: ProxiedTool, kwargs: dict[str, Any]) -> dict[str, Any]:
        key = kwargs.pop(KEY_PARAM, None)
        arguments = {
            entry.params[n]: v for n, v in kwargs.items() if v is not None or n in entry.nullable
        }
        # RequestParamsMeta is an open map (extra_items=Any), which mypy does not model yet.
        meta = cast(types.RequestParamsMeta, {META_KEY: key}) if key else None
        result = await self.upstream.call_tool(entry.name, arguments, meta=meta)
        if entry.deferred:
            self.delivered[key] = result
            if result.is_error:  # a delivery the server refused did not land: a failed apply
                raise UpstreamToolError(entry.name, result)
        return _wire(result)

    async def _compensate(self, entry: ProxiedTool, call: Call) -> None:
        if call.error is None and isinstance(call.result, Mapping) and call.result.get("isError"):
            return  # the server said the call failed: nothing to undo
        comp = entry.rule.compensate
        assert comp is not None
        args = {p: render(v, call.args, call.result, call.before) for p, v in comp.args.items()}
        result = await self.upstream.call_tool(comp.tool, args)
        if result.is_error:
            raise UpstreamToolError(comp.tool, result)


# --------------------------------------------------------------------------- compensations


def render(template: Any, args: Mapping[str, Any], result: Any, before: Any = None) -> Any:
    """One compensation argument: a non-string as it is; a template that is exactly one
    field gives that value with its own type; otherwise the fields' text is substituted.
    `{result...}` reads the call's result, `{before...}` its before-image."""
    if not isinstance(template, str):
        return template
    parsed = list(string.Formatter().parse(template))
    if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1] and not parsed[0][2]:
        return _lookup(parsed[0][1], args, result, before)
    out = []
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is not None:
            value = _lookup(name, args, result, before)
            out.append(format(repr(value) if conversion == "r" else value, spec or ""))
    return "".join(out)


def _lookup(name: str, args: Mapping[str, Any], result: Any, before: Any = None) -> Any:
    head = name.split(".")[0]
    if head in ("result", "before"):
        if head == "before" and before is None:
            raise LookupError(
                "{before}: there is no before-image (the `before` call failed or answered an error)"
            )
        value = _result_data(result if head == "result" else before)
        for part in name.split(".")[1:]:
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                what = "result" if head == "result" else "before-image"
                raise LookupError(f"{{{name}}}: the original call's {what} has no {part!r}")
        return value
    return args[name]


def _result_data(result: Mapping[str, Any] | None) -> Any:
    """A tool result (as the wire's JSON) as data for templates: its structured content,
    else its text as JSON, else its text."""
    if result is None:
        raise LookupError("the original call returned no result")
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    text = _wire_text(result)
    try:
        return json.loads(text)
    except ValueError:
        return text


def _wire(result: types.CallToolResult) -> dict[str, Any]:
    """A result as the wire's JSON: what a tool function returns, so that a durable log
    records it exactly (a compensation after a crash reads it from there)."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _wire_text(result: Mapping[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result.get("content") or [] if c.get("type") == "text")


def result_text(result: types.CallToolResult) -> str:
    """The text content of a result, joined."""
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


# --------------------------------------------------------------------------- a call's arguments


class _SchemaError(Protocol):
    """What is read of a jsonschema ValidationError."""

    absolute_path: Sequence[str | int]
    message: str


class SchemaValidator(Protocol):
    """What is used of a jsonschema validator (jsonschema ships no types)."""

    def iter_errors(self, instance: object) -> Iterator[_SchemaError]: ...


def schema_validator(schema: Mapping[str, Any]) -> SchemaValidator | None:
    """A JSON-schema validator of a tool's input, or None if the server's schema is itself
    invalid (then the server alone judges its arguments)."""
    from jsonschema import SchemaError  # type: ignore[import-untyped]
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]

    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    validator: SchemaValidator = cls(schema)
    return validator


def argument_problem(
    entry: ProxiedTool, arguments: Mapping[str, Any], validator: SchemaValidator | None
) -> str | None:
    """Why the arguments do not fit the tool's input schema (so a gated call that could
    never be delivered is refused now, not at commit), or None."""
    from jsonschema.exceptions import best_match  # type: ignore[import-untyped]

    unknown = [a for a in arguments if a not in entry.params.values()]
    if unknown:
        return f"unknown argument(s) {unknown}; {entry.name!r} takes {sorted(entry.params.values())}"
    if validator is None:
        return None
    error: _SchemaError | None = best_match(validator.iter_errors(dict(arguments)))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"

"""`atomix mcp-proxy`: an MCP server (stdio) that fronts another MCP server and settles its
tool calls in Atomix transactions.

The proxy starts the upstream server as a subprocess, lists its tools and offers them to the
client unchanged (names, descriptions, input schemas), plus `atomix_status` and, with
`boundary: explicit`, `atomix_commit` and `atomix_abort`. A policy file gives each upstream
tool its effect class and scopes; every call then goes through one `Runtime`:

- read-only: forwarded now;
- reversible: forwarded now; at abort its compensating upstream tool runs;
- bufferable: staged; forwarded at commit, dropped at abort;
- irreversible: held at the gate (the client gets a "queued" result with the effect's key);
  forwarded at commit, exactly once, and never if the transaction aborts.

A transaction begins with the first call after the previous one settled, and settles by an
explicit control tool, after `timeout_s` seconds without a call (`on_timeout`), or when the
client's session ends (`on_session_end`, also on SIGTERM/SIGINT).

How the runtime is used across requests: the MCP server runs each request in its own task,
so no `async with rt.atransaction()` block can span them. The proxy keeps the `ATx` handle
that `rt.atransaction()` returns (it is begun at once) and drives it only through its public
coroutines `tx.call(tool, ...)`, `tx.commit()` and `tx.abort(source, detail)`, from whichever
request task needs them; it never enters the handle as a context manager, so the
`current_transaction` context variable is never set (nothing here needs it: `tx.call` names
the transaction explicitly). Calls and settlement are serialised by a gate: a settlement
waits for the calls in flight and holds new ones until it is done, so no call can reach a
transaction that is already sealed.

Limitation: a read in the same transaction does not see that transaction's queued or staged
writes (the upstream server has not received them yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import inspect
import json
import keyword
import os
import re
import signal
import string
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import mcp.types as types
import yaml
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from atomix.decisions import Settlement
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import (
    CommitIncomplete,
    ScopeError,
    ToolDefinitionError,
    TransactionAborted,
)
from atomix.log import LogError
from atomix.recovery import RecoveryReport
from atomix.runtime import ATx, Runtime
from atomix.scopes import parse_scope
from atomix.tools import Ack, Call, define_tool

__all__ = [
    "CONTROL_TOOLS",
    "EFFECTS",
    "CompensationPolicy",
    "DefaultPolicy",
    "PolicyError",
    "ProxiedTool",
    "ProxyPolicy",
    "ProxyStartError",
    "ToolPolicy",
    "TransactionalProxy",
    "build_tools",
    "load_policy",
    "run_proxy",
    "serve",
]

T = TypeVar("T")
READ_ONLY = "read-only"
#: The effect classes a policy may name: read-only (no effect) and atomix.EffectClass's.
EFFECTS: tuple[str, ...] = (READ_ONLY, *(c.value for c in EffectClass))
COMMIT, ABORT, STATUS = "atomix_commit", "atomix_abort", "atomix_status"
CONTROL_TOOLS = (COMMIT, ABORT, STATUS)
#: The `_meta` key under which an effect's idempotency key travels to the upstream server
#: (a server that honours it can drop a duplicate; others ignore `_meta`).
META_KEY = "atomix/idempotency_key"
KEY_PARAM = "idempotency_key"
_RESULT_FIELD = re.compile(r"result(\.[A-Za-z0-9_-]+)*")


# --------------------------------------------------------------------------- the policy


class PolicyError(ValueError):
    """A policy is wrong: each problem names the file, the key and what is allowed."""

    def __init__(self, path: str | os.PathLike[str], problems: Sequence[str]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        super().__init__("\n".join(f"{self.path}: {p}" for p in self.problems))


class ProxyStartError(RuntimeError):
    """The upstream server could not be started or listed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class CompensationPolicy(_Strict):
    """The upstream call that undoes a reversible one: `tool` with `args`, each a value or a
    template over the original call's arguments (`{name}`) or its result (`{result.id}`)."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class _Rule(_Strict):
    effect: str
    reads: list[str] = Field(default_factory=list)
    writes: list[str] = Field(default_factory=list)

    @field_validator("reads", "writes", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return _as_list(value)

    @property
    def effect_class(self) -> EffectClass | None:
        return None if self.effect == READ_ONLY else EffectClass(self.effect)


class ToolPolicy(_Rule):
    """How one upstream tool settles: its effect class, scope templates, key and (reversible
    tools only) its compensation."""

    key: str | None = None
    compensate: CompensationPolicy | None = None

    @field_validator("effect")
    @classmethod
    def _known_effect(cls, value: str) -> str:
        if value not in EFFECTS:
            raise ValueError(_not_allowed(value, EFFECTS))
        return value


class DefaultPolicy(_Rule):
    """How an upstream tool the policy does not name settles. Irreversible by default: an
    unknown tool's call leaves only at commit."""

    effect: str = EffectClass.IRREVERSIBLE.value

    @field_validator("effect")
    @classmethod
    def _known_effect(cls, value: str) -> str:
        allowed = tuple(e for e in EFFECTS if e != EffectClass.REVERSIBLE.value)
        if value == EffectClass.REVERSIBLE.value:
            raise ValueError(
                "reversible needs a compensation per tool, so it cannot be a default; allowed: "
                + ", ".join(allowed)
            )
        if value not in allowed:
            raise ValueError(_not_allowed(value, allowed))
        return value

    @property
    def key(self) -> None:
        return None

    @property
    def compensate(self) -> None:
        return None


class ProxyPolicy(_Strict):
    """A whole policy file: transaction boundary, time-out, what happens at its end, and a
    rule per upstream tool (with a default for the tools it does not name)."""

    boundary: Literal["explicit", "session"] = "explicit"
    timeout_s: float | None = Field(default=300.0, gt=0)
    on_timeout: Literal["abort", "commit"] = "abort"
    on_session_end: Literal["abort", "commit"] = "abort"
    default: DefaultPolicy = Field(default_factory=DefaultPolicy)
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)


def _suggest(value: object, choices: Sequence[str]) -> str:
    near = difflib.get_close_matches(str(value), list(choices), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _not_allowed(value: object, allowed: Sequence[str]) -> str:
    return f"{value!r} is not allowed{_suggest(value, allowed)}; allowed: {', '.join(allowed)}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The policy model that holds the keys at `loc` (for 'allowed here' in messages)."""
    if loc == ():
        return ProxyPolicy
    if loc == ("default",):
        return DefaultPolicy
    if len(loc) == 2 and loc[0] == "tools":
        return ToolPolicy
    if len(loc) == 3 and loc[0] == "tools" and loc[2] == "compensate":
        return CompensationPolicy
    return None


def _describe(error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    where = ".".join(str(p) for p in loc) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = list(model.model_fields) if model is not None else []
        return (
            f"{where}: unknown key{_suggest(loc[-1], allowed)}; allowed here: {', '.join(allowed)}"
        )
    if kind == "missing":
        return f"{where}: missing (required)"
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return f"{where}: {message}"
    return f"{where}: {message} (got {error.get('input')!r})"


def _check(policy: ProxyPolicy) -> list[str]:
    """What pydantic cannot say about one key alone: rules that tie keys together."""
    problems: list[str] = []
    if policy.boundary == "session" and "commit" not in (policy.on_session_end, policy.on_timeout):
        problems.append(
            "boundary: 'session' offers no commit tool, and on_session_end and on_timeout are "
            "both 'abort', so nothing could ever commit; set on_session_end: commit (or use "
            "boundary: explicit)"
        )
    for name, rule in policy.tools.items():
        where = f"tools.{name}"
        effect = rule.effect
        if effect == EffectClass.REVERSIBLE.value and rule.compensate is None:
            problems.append(
                f"{where}.compensate: missing: a reversible tool needs its compensating "
                "upstream tool ({tool: NAME, args: {PARAM: '{template}'}}); or make it "
                "bufferable or irreversible"
            )
        if effect != EffectClass.REVERSIBLE.value and rule.compensate is not None:
            problems.append(
                f"{where}.compensate: only a reversible tool is compensated (this one is {effect})"
            )
        if effect == READ_ONLY:
            if rule.writes:
                problems.append(f"{where}.writes: a read-only tool writes nothing; remove it")
            if rule.key is not None:
                problems.append(f"{where}.key: a read-only tool has no effect to key; remove it")
        if rule.compensate is not None:
            for param, value in rule.compensate.args.items():
                problems += [
                    f"{where}.compensate.args.{param}: {why}" for why in _template_problems(value)
                ]
    return problems


def _template_problems(value: Any) -> list[str]:
    """A compensation argument's template problems (names are checked against the tool later)."""
    if not isinstance(value, str):
        return []
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as exc:
        return [f"template {value!r} is malformed: {exc}"]
    return [
        f"template {value!r}: field {{{f}}} must name an argument or result[.FIELD...]"
        for f in fields
        if not (f.isidentifier() or _RESULT_FIELD.fullmatch(f))
    ]


def load_policy(path: str | os.PathLike[str]) -> ProxyPolicy:
    """Read and validate a policy file; any problem raises PolicyError naming file and key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(path, [f"cannot read the policy: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(path, [f"not valid YAML: {exc}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(
            path, [f"(top level): must be a mapping of keys, not {type(data).__name__}"]
        )
    try:
        policy = ProxyPolicy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(path, [_describe(e) for e in exc.errors()]) from None
    problems = _check(policy)
    if problems:
        raise PolicyError(path, problems)
    return policy


# --------------------------------------------------------------------------- upstream tools


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
                f"{_suggest(name, by_name)}; it has: {', '.join(sorted(by_name))}"
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
        problems += _definition_problems(entry)
        out[tool.name] = entry
    if problems:
        raise PolicyError(path, problems)
    return out


def _nullable(schema: Mapping[str, Any], names: Mapping[str, str]) -> frozenset[str]:
    """The template names of the arguments whose schema accepts null (checked against the
    whole input schema, so that a `$ref` resolves)."""
    validator = _schema_validator(schema)
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
            f"{_suggest(comp.tool, by_name)}; it has: {', '.join(sorted(by_name))}"
        ]
    problems = []
    schema = target.input_schema or {}
    properties = schema.get("properties")
    for param, value in comp.args.items():
        if properties is not None and param not in properties:
            problems.append(
                f"{where}.args.{param}: {comp.tool!r} has no argument {param!r}"
                f"{_suggest(param, properties)}; it has: {', '.join(sorted(properties))}"
            )
        if isinstance(value, str):
            for _, name, _, _ in string.Formatter().parse(value):
                if name and name.isidentifier() and name != "result" and name not in entry.params:
                    problems.append(
                        f"{where}.args.{param}: template {value!r} names {{{name}}}, which is "
                        f"not an argument of {entry.name!r} (it has: "
                        f"{', '.join(sorted(entry.params)) or 'none'}; or use {{result.FIELD}})"
                    )
    missing = [a for a in schema.get("required") or [] if a not in comp.args]
    if missing:
        problems.append(f"{where}.args: {comp.tool!r} requires {', '.join(map(repr, missing))}")
    return problems


def _tool_metadata(
    entry: ProxiedTool, forward: Callable[..., Any], compensate: Callable[[Call], Any]
) -> dict[str, Any]:
    """What `rt.tool` (or `define_tool`) needs for one upstream tool. `forward` gets the
    signature of the tool's arguments (keyword-only, by template name; an optional one
    defaults to its schema default, else None), plus `idempotency_key` for an effect."""
    params = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=(
                inspect.Parameter.empty
                if name in entry.required
                else entry.defaults.get(name)
            ),
        )
        for name in entry.params
    ]
    if entry.effect is not None:  # the runtime hands each effect its key through it
        params.append(inspect.Parameter(KEY_PARAM, inspect.Parameter.KEYWORD_ONLY, default=None))
    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    writes: list[str] = list(entry.rule.writes)
    if entry.effect is not None and not writes:
        writes = [_tool_scope(entry.name)]
    return {
        "effect": entry.effect,
        "reads": list(entry.rule.reads) or None,
        "writes": writes or None,
        "key": entry.rule.key,
        "compensate": compensate if entry.rule.compensate is not None else None,
        "name": entry.name,
    }


def _definition_problems(entry: ProxiedTool) -> list[str]:
    """The runtime's own checks of the tool's scope and key templates, as policy problems."""

    async def forward(**kwargs: Any) -> None:
        return None

    async def compensate(call: Call) -> None:
        return None

    try:
        define_tool(forward, **_tool_metadata(entry, forward, compensate))
    except ToolDefinitionError as exc:
        why = str(exc).removeprefix(f"tool {exc.tool!r}: field {exc.field!r}: ")
        where = f"{entry.rule_key}.{exc.field}"
        if entry.rule_key == "default":
            where += f" (for upstream tool {entry.name!r})"
        return [f"{where}: {why}"]
    return []


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


def _lookup(name: str, args: Mapping[str, Any], result: Any) -> Any:
    if name == "result" or name.startswith("result."):
        value = _result_data(result)
        for part in name.split(".")[1:]:
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise LookupError(f"{{{name}}}: the original call's result has no {part!r}")
        return value
    return args[name]


def render(template: Any, args: Mapping[str, Any], result: Any) -> Any:
    """One compensation argument: a non-string as it is; a template that is exactly one
    field gives that value with its own type; otherwise the fields' text is substituted."""
    if not isinstance(template, str):
        return template
    parsed = list(string.Formatter().parse(template))
    if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1] and not parsed[0][2]:
        return _lookup(parsed[0][1], args, result)
    out = []
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is not None:
            value = _lookup(name, args, result)
            out.append(format(repr(value) if conversion == "r" else value, spec or ""))
    return "".join(out)


# --------------------------------------------------------------------------- results


def _wire(result: types.CallToolResult) -> dict[str, Any]:
    """A result as the wire's JSON: what a tool function returns, so that a durable log
    records it exactly (a compensation after a crash reads it from there)."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _wire_text(result: Mapping[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result.get("content") or [] if c.get("type") == "text")


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _reply(text: str, *, error: bool = False, data: Any = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=data, is_error=error
    )


class UpstreamToolError(RuntimeError):
    """The upstream server answered a call with an error result."""

    def __init__(self, tool: str, result: types.CallToolResult) -> None:
        self.result = result
        super().__init__(f"{tool}: {_text(result) or 'error result'}")


@dataclass(slots=True)
class SettledEffect:
    """What became of one effect when its transaction settled."""

    tool: str
    effect: str
    key: str
    status: str  # applied | released | kept | compensated | dropped | residue | failed
    detail: str = ""


@dataclass(slots=True)
class SettleReport:
    """How one transaction settled, for the client and the log."""

    txid: int
    outcome: str  # committed | aborted
    why: str
    effects: list[SettledEffect] = field(default_factory=list)
    abort_source: str | None = None
    detail: str = ""

    @property
    def clean(self) -> bool:
        return not any(e.status in ("residue", "failed") for e in self.effects)

    def lines(self) -> list[str]:
        head = f"transaction {self.txid} {self.outcome} ({self.why})"
        if self.outcome == "aborted" and self.abort_source:
            head += f": {self.abort_source}" + (f", {self.detail}" if self.detail else "")
        if not self.effects:
            return [head + "; it had no effects"]
        out = [head + ":"]
        for e in self.effects:
            more = f": {e.detail}" if e.detail else ""
            out.append(f"  {e.tool} ({e.effect}) {e.status} [key {e.key}]{more}")
        if not self.clean:
            out.append("  NOT CLEAN: see the residue/failed lines above")
        return out

    def data(self) -> dict[str, Any]:
        return {
            "transaction": self.txid,
            "outcome": self.outcome,
            "why": self.why,
            "abort_source": self.abort_source,
            "clean": self.clean,
            "effects": [
                {"tool": e.tool, "effect": e.effect, "key": e.key, "status": e.status, "detail": e.detail}
                for e in self.effects
            ],
        }


_DONE = {"commit": "committed", "abort": "aborted"}
_STATUS_OF = (
    ("applied", "applied"),
    ("released", "released"),
    ("accepted", "kept"),
    ("compensated", "compensated"),
    ("dropped", "dropped"),
    ("residue", "residue"),
    ("failed_applies", "failed"),
)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _say(message: str) -> None:
    # stderr: the client keeps the server's stderr as its log; stdout is the protocol.
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("".join(f"atomix mcp-proxy: {line}\n" for line in message.splitlines()))
        sys.stderr.flush()


# --------------------------------------------------------------------------- the proxy


class TransactionalProxy:
    """The MCP server side of the proxy, over one upstream session and one Runtime.

    Guarantees: an irreversible or bufferable call reaches the upstream server only when its
    transaction commits, and then once (apply attempts are 1: an upstream tool does not
    honour idempotency keys, so a retry could deliver twice; a failed delivery is reported
    as `failed`); a reversible call that ran is compensated if its transaction aborts (a
    compensation that fails is reported as residue); at most one transaction is open, and
    no call runs while it settles.
    """

    def __init__(
        self,
        policy: ProxyPolicy,
        policy_path: str | os.PathLike[str],
        upstream: ClientSession,
        tools: dict[str, ProxiedTool],
        *,
        runtime: Runtime | None = None,
        upstream_name: str = "upstream",
        upstream_instructions: str | None = None,
    ) -> None:
        self.policy = policy
        self.upstream = upstream
        self.tools = tools
        self.rt = runtime or Runtime(apply_attempts=1, strict=True)
        self.upstream_name = upstream_name
        self._upstream_instructions = upstream_instructions
        self._shims: dict[str, Any] = {}
        self._validators = {n: _schema_validator(t.offered.input_schema) for n, t in tools.items()}
        self._tasks: set[asyncio.Future[Any]] = set()
        problems = [p for entry in tools.values() for p in _definition_problems(entry)]
        if problems:
            raise PolicyError(policy_path, problems)
        for entry in tools.values():
            self._shims[entry.name] = self._define(entry)
        self._tx: ATx | None = None
        self._opened_at = 0.0
        self._last_activity = 0.0
        self._last: SettleReport | None = None
        self._delivered: dict[str, types.CallToolResult] = {}
        self._cond = asyncio.Condition()
        self._inflight = 0
        self._settling = False
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._stopping = False

    # -- runtime tools ----------------------------------------------------------------------
    def _define(self, entry: ProxiedTool) -> Any:
        async def forward(**kwargs: Any) -> dict[str, Any]:
            return await self._main_loop(self._forward(entry, kwargs))

        async def compensate(call: Call) -> None:
            await self._main_loop(self._compensate(entry, call))

        return self.rt.tool(forward, **_tool_metadata(entry, forward, compensate))

    async def _main_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the proxy's event loop, which owns the upstream session. Recovery
        runs a tool in a worker thread under a loop of its own (see `recover`)."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _forward(self, entry: ProxiedTool, kwargs: dict[str, Any]) -> dict[str, Any]:
        key = kwargs.pop(KEY_PARAM, None)
        arguments = {
            entry.params[n]: v for n, v in kwargs.items() if v is not None or n in entry.nullable
        }
        result = await self.upstream.call_tool(
            entry.name, arguments, meta={META_KEY: key} if key else None
        )
        if entry.deferred:
            self._delivered[key] = result
            if result.is_error:  # a delivery the server refused did not land: a failed apply
                raise UpstreamToolError(entry.name, result)
        return _wire(result)

    async def _compensate(self, entry: ProxiedTool, call: Call) -> None:
        if call.error is None and isinstance(call.result, Mapping) and call.result.get("isError"):
            return  # the server said the call failed: nothing to undo
        comp = entry.rule.compensate
        assert comp is not None
        args = {p: render(v, call.args, call.result) for p, v in comp.args.items()}
        result = await self.upstream.call_tool(comp.tool, args)
        if result.is_error:
            raise UpstreamToolError(comp.tool, result)

    async def recover(self) -> RecoveryReport:
        """Finish the committed transactions a dead proxy left in the durable log (each
        undelivered effect delivered once, by key) and abort the rest (compensating their
        reversible calls), through this upstream session. The runtime's recovery is
        synchronous and drives async tools with a loop of its own, so it runs in a worker
        thread and each upstream call is handed back to this loop."""
        report = await asyncio.to_thread(self.rt.recover)
        if report.finished or report.aborted or not report.clean:
            _say("\n".join(report.lines()))
        return report

    # -- the gate between calls and settlement ------------------------------------------------
    @contextlib.asynccontextmanager
    async def _call_slot(self) -> AsyncIterator[ATx]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._settling)
            self._inflight += 1
            if self._tx is None:
                self._tx = self.rt.atransaction(trace="mcp")
                self._opened_at = asyncio.get_running_loop().time()
            tx = self._tx
        self._touch()
        try:
            yield tx
        finally:
            async with self._cond:
                self._touch()  # before a waiting settlement can look at it
                self._inflight -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def _settle_slot(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._settling)
            self._settling = True
            await self._cond.wait_for(lambda: self._inflight == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._settling = False
                self._cond.notify_all()
            self._touch()

    def _touch(self) -> None:
        self._last_activity = asyncio.get_running_loop().time()
        self._changed.set()

    # -- settlement -------------------------------------------------------------------------
    async def settle(
        self,
        how: Literal["commit", "abort"],
        why: str,
        *,
        only_if: Callable[[], bool] | None = None,
        **abort: Any,
    ) -> SettleReport | None:
        """Commit or abort the open transaction (None if there is none, or if `only_if`,
        asked once no call is in flight, says no); `abort` takes the runtime's `source` and
        `detail`."""
        async with self._settle_slot():
            tx = self._tx
            if tx is None or (only_if is not None and not only_if()):
                return None
            self._tx = None
            effects = list(tx.staged.values())
            settlement: Settlement | None
            try:
                if how == "commit":
                    settlement = await tx.commit()
                else:
                    settlement = await tx.abort(
                        abort.get("source", AbortSource.PRE_COMMIT_VETO), abort.get("detail", "")
                    )
            except CommitIncomplete as exc:
                settlement = exc.settlement  # type: ignore[assignment]
            except TransactionAborted as exc:
                settlement = exc.settlement  # type: ignore[assignment]
            report = self._report(tx, effects, settlement, why)
            self._last = report
            _say("\n".join(report.lines()))
            return report

    def _report(
        self, tx: ATx, effects: list[Effect], settlement: Settlement | None, why: str
    ) -> SettleReport:
        s = settlement if settlement is not None else tx.settlement
        outcome = s.outcome if s is not None else "aborted"
        report = SettleReport(
            tx.txid, outcome, why, abort_source=s.abort_source if s else None, detail=s.detail if s else ""
        )
        status: dict[str, str] = {}
        if s is not None:
            for attr, label in _STATUS_OF:
                for key in getattr(s, attr):
                    status[key] = label
        for effect in effects:
            label = status.get(effect.key, "unknown")
            detail = ""
            delivered = self._delivered.pop(effect.key, None)
            if s is not None and effect.key in s.errors:
                error = s.errors[effect.key]
                detail = _one_line(f"{type(error).__name__}: {error}")
            elif delivered is not None:
                detail = _one_line(_text(delivered))
            report.effects.append(
                SettledEffect(effect.tool, effect.effect_class.value, effect.key, label, detail)
            )
        return report

    async def end_session(self, why: str = "session end") -> SettleReport | None:
        """Settle what the session left open, as the policy's on_session_end says."""
        return await self.settle(
            self.policy.on_session_end, why, source=AbortSource.CANCELLED, detail="the session ended"
        )

    async def watch_idle(self) -> None:
        """Settle the open transaction (on_timeout) after timeout_s seconds without a call."""
        timeout = self.policy.timeout_s
        if timeout is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            if self._tx is None or self._inflight or self._settling:
                await self._changed.wait()
                continue
            remaining = self._last_activity + timeout - loop.time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
                continue
            # A call may arrive while the settlement waits for the gate: then it is not idle.
            await self.settle(
                self.policy.on_timeout,
                f"idle for {timeout:g} s",
                only_if=lambda: loop.time() - self._last_activity >= timeout,
                source=AbortSource.TIMEOUT,
                detail=f"no call for {timeout:g} s",
            )

    # -- the MCP server ----------------------------------------------------------------------
    def control_tools(self) -> list[types.Tool]:
        empty: dict[str, Any] = {"type": "object", "properties": {}}
        status = types.Tool(
            name=STATUS,
            description=(
                "Say what the current Atomix transaction holds: the calls queued at the gate or "
                "staged until commit, the reversible calls that would be undone at abort, and "
                "how the last transaction settled."
            ),
            input_schema=empty,
        )
        if self.policy.boundary == "session":
            return [status]
        commit = types.Tool(
            name=COMMIT,
            description=(
                "Commit the current transaction: every call queued until commit (irreversible) "
                "or staged (bufferable) is delivered to the server now, exactly once, and the "
                "reversible calls are kept. The next call starts a new transaction."
            ),
            input_schema=empty,
        )
        abort = types.Tool(
            name=ABORT,
            description=(
                "Abort the current transaction: queued and staged calls are dropped (they never "
                "reach the server) and reversible calls are undone by their compensating tools. "
                "The next call starts a new transaction."
            ),
            input_schema={
                "type": "object",
                "properties": {"reason": {"type": "string", "description": "Why (for the log)."}},
            },
        )
        return [commit, abort, status]

    def instructions(self) -> str:
        gated = sorted(n for n, t in self.tools.items() if t.effect is EffectClass.IRREVERSIBLE)
        staged = sorted(n for n, t in self.tools.items() if t.effect is EffectClass.BUFFERABLE)
        undone = sorted(n for n, t in self.tools.items() if t.effect is EffectClass.REVERSIBLE)
        parts = [
            "Tool calls through this server are transactional (Atomix).",
            f"Queued until commit, never executed if the transaction aborts: {', '.join(gated) or 'none'}.",
            f"Staged until commit: {', '.join(staged) or 'none'}.",
            f"Executed now and undone if the transaction aborts: {', '.join(undone) or 'none'}.",
            "A read does not see writes that are still queued or staged.",
        ]
        if self.policy.boundary == "explicit":
            parts.append(
                f"Call {COMMIT} to make the work final or {ABORT} to discard it; if the session "
                f"ends first, it is {_DONE[self.policy.on_session_end]}."
            )
        else:
            parts.append(
                "The session is the transaction: it is "
                f"{_DONE[self.policy.on_session_end]} when the session ends."
            )
        if self.policy.timeout_s is not None:
            parts.append(
                f"After {self.policy.timeout_s:g} s without a call it is "
                f"{_DONE[self.policy.on_timeout]}."
            )
        if self._upstream_instructions:
            parts.append(f"\n{self.upstream_name}: {self._upstream_instructions}")
        return " ".join(parts)

    def server(self) -> Server[Any]:
        listing = [t.offered for t in self.tools.values()] + self.control_tools()

        async def list_tools(
            ctx: Any, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=listing)

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.call(params.name, params.arguments or {})

        return Server(
            f"atomix-proxy:{self.upstream_name}",
            instructions=self.instructions(),
            on_list_tools=list_tools,
            on_call_tool=call_tool,
        )

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One client call: a control tool, or an upstream tool through the transaction."""
        if name == STATUS:
            return self.status()
        if name in (COMMIT, ABORT) and self.policy.boundary == "explicit":
            return await self._control(name, arguments)
        entry = self.tools.get(name)
        if entry is None:
            return _reply(f"unknown tool {name!r}", error=True)
        problem = _argument_problem(entry, arguments, self._validators[name])
        if problem is not None:
            return _reply(f"{name}: rejected, nothing ran: {problem}", error=True)
        kwargs = {template_name(a): v for a, v in arguments.items()}
        shim = self._shims[name]
        try:
            shim.spec.bind((), kwargs)
        except TypeError as exc:
            return _reply(f"{name}: rejected, nothing ran: {exc}", error=True)
        async with self._call_slot() as tx:
            before = set(tx.staged)
            try:
                out = await tx.call(shim, **kwargs)
            except TransactionAborted as exc:
                # The runtime settled it (its effects are dropped or compensated): say how,
                # and let the next call begin a new one.
                if self._tx is tx:
                    self._tx = None
                    self._last = self._report(tx, [], exc.settlement, f"{name} failed")  # type: ignore[arg-type]
                return _reply(f"{name}: the transaction aborted: {exc}", error=True)
            except ScopeError as exc:
                return _reply(f"{name}: rejected, nothing ran: {exc}", error=True)
            except Exception as exc:  # noqa: BLE001 - reported to the client, as a tool error
                more = ""
                if entry.effect is EffectClass.REVERSIBLE:
                    more = " It may have acted upstream; it is compensated if this transaction aborts."
                return _reply(f"{name}: the upstream call failed: {exc}.{more}", error=True)
        if isinstance(out, Ack):
            return self._ack(entry, out, duplicate=out.key in before)
        return types.CallToolResult.model_validate(out)

    def _ack(self, entry: ProxiedTool, ack: Ack, *, duplicate: bool) -> types.CallToolResult:
        when = (
            f"when the transaction commits ({COMMIT})"
            if self.policy.boundary == "explicit"
            else "when the transaction commits (at the end of this session)"
        )
        if ack.status == "queued":
            text = (
                f"{entry.name}: queued until commit, NOT executed yet. It is delivered once "
                f"{when}, and never if the transaction aborts. key: {ack.key}"
            )
        else:
            text = (
                f"{entry.name}: staged, NOT applied yet. It is applied {when}, and dropped if "
                f"the transaction aborts. key: {ack.key}"
            )
        if duplicate:
            text += " (the same key as an earlier call in this transaction: delivered once)"
        return _reply(text, data={"atomix": {"status": ack.status, "key": ack.key, "tool": ack.tool}})

    async def _control(self, name: str, arguments: Mapping[str, Any]) -> types.CallToolResult:
        if name == COMMIT:
            report = await self.settle("commit", COMMIT)
        else:
            reason = str(arguments.get("reason") or "")
            report = await self.settle(
                "abort", ABORT, source=AbortSource.PRE_COMMIT_VETO, detail=reason or ABORT
            )
        if report is None:
            return _reply("no open transaction: nothing to settle", data={"transaction": None})
        failed = (name == COMMIT and report.outcome != "committed") or not report.clean
        return _reply("\n".join(report.lines()), error=failed, data=report.data())

    def status(self) -> types.CallToolResult:
        loop = asyncio.get_running_loop()
        lines: list[str] = []
        data: dict[str, Any] = {"open": None, "last": self._last.data() if self._last else None}
        tx = self._tx
        if tx is None:
            lines.append("no open transaction (the next call starts one)")
        else:
            age = loop.time() - self._opened_at
            pending = []
            for e in tx.staged.values():
                what = {
                    EffectClass.IRREVERSIBLE: "queued until commit",
                    EffectClass.BUFFERABLE: "staged until commit",
                    EffectClass.REVERSIBLE: "done; undone at abort",
                }[e.effect_class]
                args = e.payload.args if isinstance(e.payload, Call) else e.payload
                shown = dict(args or {})
                pending.append({"tool": e.tool, "effect": e.effect_class.value, "state": what, "key": e.key, "args": shown})
            head = f"transaction {tx.txid} open for {age:.1f} s with {len(pending)} effect(s)"
            if self.policy.timeout_s is not None:
                idle = self.policy.timeout_s - (loop.time() - self._last_activity)
                head += f"; {self.policy.on_timeout} after {max(idle, 0):.1f} s more without a call"
            lines.append(head + (":" if pending else ""))
            lines += [
                f"  {p['tool']} ({p['effect']}) {p['state']} [key {p['key']}] args {json.dumps(p['args'], default=str)}"
                for p in pending
            ]
            data["open"] = {"transaction": tx.txid, "age_s": round(age, 3), "effects": pending}
        lines.append(
            "last settled: " + ("none yet" if self._last is None else "\n".join(self._last.lines()))
        )
        return _reply("\n".join(lines), data=data)

    # -- stopping ------------------------------------------------------------------------------
    def on_signal(self, signum: int) -> None:
        """The event loop's signal handler: stop in a task (see stop_on_signal)."""
        task = asyncio.ensure_future(self.stop_on_signal(signum))
        self._tasks.add(task)  # a task nobody references may be collected before it runs

    async def stop_on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT: settle as at session end, then leave at once (the transport's
        stdin reader cannot be cancelled, so waiting for it could wait forever)."""
        if self._stopping:
            return
        self._stopping = True
        name = signal.Signals(signum).name
        try:
            await self.end_session(f"session end by {name}")
        finally:
            self.rt.close()
            _say(f"stopped by {name}")
            os._exit(128 + signum)


def _tool_scope(tool: str) -> str:
    """The scope of an effect tool whose rule names none: one per tool."""
    text = "mcp:tool:" + re.sub(r"[^A-Za-z0-9_.-]", "_", tool)
    parse_scope(text)
    return text


def _schema_validator(schema: Mapping[str, Any]) -> Any:
    """A JSON-schema validator of a tool's input, or None if the server's schema is itself
    invalid (then the server alone judges its arguments)."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema)


def _argument_problem(
    entry: ProxiedTool, arguments: Mapping[str, Any], validator: Any
) -> str | None:
    """Why the arguments do not fit the tool's input schema (so a gated call that could
    never be delivered is refused now, not at commit), or None."""
    from jsonschema.exceptions import best_match

    unknown = [a for a in arguments if a not in entry.params.values()]
    if unknown:
        return f"unknown argument(s) {unknown}; {entry.name!r} takes {sorted(entry.params.values())}"
    if validator is None:
        return None
    error = best_match(validator.iter_errors(dict(arguments)))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"


async def _list_upstream(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def _find(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `kinds` in `exc` (task groups wrap them in groups)."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kinds)
            if found is not None:
                return found
    return None


async def serve(
    policy: ProxyPolicy,
    policy_path: str | os.PathLike[str],
    command: Sequence[str],
    *,
    log_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Start the upstream server, check the policy against its tools, then serve the client
    on this process's stdin/stdout until it disconnects, and settle what is left."""
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(os.environ))
    started = False
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as upstream:
            try:
                init = await upstream.initialize()
                listed = await _list_upstream(upstream)
            except Exception as exc:  # noqa: BLE001 - any failure here means it did not start
                raise ProxyStartError(
                    f"upstream server {' '.join(command)!r} did not start as an MCP server: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            started = True
            tools = build_tools(policy, policy_path, listed)
            try:
                # Recovery waits until the tools exist: what a dead proxy left is finished or
                # compensated through the upstream server (see TransactionalProxy.recover).
                runtime = Runtime(apply_attempts=1, strict=True, log=log_dir, recover=False)
            except LogError as exc:
                raise ProxyStartError(f"--log {log_dir}: {exc}") from exc
            proxy = TransactionalProxy(
                policy,
                policy_path,
                upstream,
                tools,
                runtime=runtime,
                upstream_name=init.server_info.name,
                upstream_instructions=init.instructions,
            )
            if runtime.log is not None:
                await proxy.recover()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, proxy.on_signal, signum)
            watcher = asyncio.ensure_future(proxy.watch_idle())
            server = proxy.server()
            try:
                async with stdio_server() as (client_read, client_write):
                    await server.run(client_read, client_write, server.create_initialization_options())
                await proxy.end_session()
            finally:
                watcher.cancel()
                runtime.close()
    except OSError as exc:
        if started:
            raise
        raise ProxyStartError(f"cannot start upstream server {command[0]!r}: {exc}") from exc
    except BaseExceptionGroup as group:
        found = _find(group, (PolicyError, ProxyStartError))
        if found is not None:
            raise found from None
        raise


def run_proxy(
    policy: ProxyPolicy,
    policy_path: str | os.PathLike[str],
    command: Sequence[str],
    *,
    log_dir: str | os.PathLike[str] | None = None,
) -> int:
    """Run the proxy until the client disconnects; 0 on a clean end. PolicyError (the policy
    does not fit the upstream tools) and ProxyStartError propagate."""
    if not command:
        raise ProxyStartError("no upstream server command (put it after `--`)")
    asyncio.run(serve(policy, policy_path, command, log_dir=log_dir))
    return 0

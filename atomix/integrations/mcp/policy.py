"""The proxy's policy file: its model, loading and validation.

A policy gives the transaction boundary, the idle time-out, what happens when either ends a
transaction, and a rule per upstream tool (effect class, scope templates, key, and the
compensation of a reversible tool, with the upstream call that reads its before-image). `load_policy` reads and validates the file on its own;
whether it fits the upstream server's tools is checked later, by `tools.build_tools`.
docs/mcp-proxy.md documents the file's keys.
"""

from __future__ import annotations

import difflib
import os
import re
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from atomix.effects import EffectClass

__all__ = [
    "EFFECTS",
    "READ_ONLY",
    "BeforePolicy",
    "CompensationPolicy",
    "DefaultPolicy",
    "PolicyError",
    "ProxyPolicy",
    "ToolPolicy",
    "did_you_mean",
    "load_policy",
]

READ_ONLY = "read-only"
#: The effect classes a policy may name: read-only (no effect) and atomix.EffectClass's.
EFFECTS: tuple[str, ...] = (READ_ONLY, *(c.value for c in EffectClass))
_RESULT_FIELD = re.compile(r"(result|before)(\.[A-Za-z0-9_-]+)*")


class PolicyError(ValueError):
    """A policy is wrong: each problem names the file, the key and what is allowed."""

    def __init__(self, path: str | os.PathLike[str], problems: Sequence[str]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        super().__init__("\n".join(f"{self.path}: {p}" for p in self.problems))


def did_you_mean(value: object, choices: Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the closest of `choices` to a mistyped `value`, else ""."""
    near = difflib.get_close_matches(str(value), list(choices), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _not_allowed(value: object, allowed: Sequence[str]) -> str:
    return f"{value!r} is not allowed{did_you_mean(value, allowed)}; allowed: {', '.join(allowed)}"


class _Strict(BaseModel):
    # An unknown key is an error (a typo must not silently fall back to a default).
    model_config = ConfigDict(extra="forbid", frozen=True)


class CompensationPolicy(_Strict):
    """The upstream call that undoes a reversible one: `tool` with `args`, each a value or a
    template over the original call's arguments (`{name}`) or its result (`{result.id}`)."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class BeforePolicy(_Strict):
    """The upstream call that reads a reversible call's before-image, just before the call
    runs: `tool` with `args`, each a value or a template over the call's arguments. Its
    result is what compensation templates read as `{before}` / `{before.FIELD}`."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class _Rule(_Strict):
    effect: str
    reads: list[str] = Field(default_factory=list)
    writes: list[str] = Field(default_factory=list)

    @field_validator("reads", "writes", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @property
    def effect_class(self) -> EffectClass | None:
        return None if self.effect == READ_ONLY else EffectClass(self.effect)


class ToolPolicy(_Rule):
    """How one upstream tool settles: its effect class (one of EFFECTS), scope templates,
    key and (reversible tools only) its compensation."""

    key: str | None = None
    compensate: CompensationPolicy | None = None
    before: BeforePolicy | None = None

    @field_validator("effect")
    @classmethod
    def _known_effect(cls, value: str) -> str:
        if value not in EFFECTS:
            raise ValueError(_not_allowed(value, EFFECTS))
        return value


class DefaultPolicy(_Rule):
    """How an upstream tool the policy does not name settles. Never reversible (that needs a
    compensation per tool), and irreversible by default: an unknown tool's call leaves only
    at commit."""

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

    # The same reading interface as ToolPolicy, so a tool's rule is used alike either way.
    @property
    def key(self) -> None:
        return None

    @property
    def compensate(self) -> None:
        return None

    @property
    def before(self) -> None:
        return None


class ProxyPolicy(_Strict):
    """A whole, validated policy file: transaction boundary, time-out, what happens at its
    end, and a rule per upstream tool (with a default for the tools it does not name).
    One that `load_policy` returns also passed the checks that tie keys together."""

    boundary: Literal["explicit", "session"] = "explicit"
    timeout_s: float | None = Field(default=300.0, gt=0)
    on_timeout: Literal["abort", "commit"] = "abort"
    on_session_end: Literal["abort", "commit"] = "abort"
    default: DefaultPolicy = Field(default_factory=DefaultPolicy)
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The policy model that holds the keys at `loc` (for 'allowed here' in messages)."""
    if loc == ():
        return ProxyPolicy
    if loc == ("default",):
        return DefaultPolicy
    if len(loc) == 2 and loc[0] == "tools":
        return ToolPolicy
    if len(loc) == 3 and loc[0] == "tools" and loc[2] == "compensate":
        return CompensationPolicy
    if len(loc) == 3 and loc[0] == "tools" and loc[2] == "before":
        return BeforePolicy
    return None


def _describe(error: ErrorDetails) -> str:
    """One pydantic error as a policy problem: the dotted key, then what is wrong there."""
    loc = tuple(error["loc"])
    where = ".".join(str(p) for p in loc) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = list(model.model_fields) if model is not None else []
        return (
            f"{where}: unknown key{did_you_mean(loc[-1], allowed)}; "
            f"allowed here: {', '.join(allowed)}"
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
        if rule.before is not None and effect != EffectClass.REVERSIBLE.value:
            problems.append(
                f"{where}.before: only a reversible tool has a before-image (this one is {effect})"
            )
        if rule.compensate is not None:
            for param, value in rule.compensate.args.items():
                problems += [
                    f"{where}.compensate.args.{param}: {why}" for why in _template_problems(value)
                ]
                if rule.before is None and _names_before(value):
                    problems.append(
                        f"{where}.compensate.args.{param}: {value!r} reads {{before}}, but the "
                        "rule has no `before:` (the upstream call that reads the before-image)"
                    )
        if rule.before is not None:
            for param, value in rule.before.args.items():
                problems += [f"{where}.before.args.{param}: {why}" for why in _template_problems(value)]
                if _names_before(value) or _names_result(value):
                    problems.append(
                        f"{where}.before.args.{param}: {value!r}: a before-image is read before "
                        "the call runs, from its arguments only"
                    )
    return problems


def _fields(value: object) -> list[str]:
    if not isinstance(value, str):
        return []
    try:
        return [f for _, f, _, _ in string.Formatter().parse(value) if f]
    except ValueError:
        return []


def _names_before(value: object) -> bool:
    return any(f == "before" or f.startswith("before.") for f in _fields(value))


def _names_result(value: object) -> bool:
    return any(f == "result" or f.startswith("result.") for f in _fields(value))


def _template_problems(value: object) -> list[str]:
    """A compensation argument's template problems (names are checked against the tool later)."""
    if not isinstance(value, str):
        return []
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as exc:
        return [f"template {value!r} is malformed: {exc}"]
    return [
        f"template {value!r}: field {{{f}}} must name an argument or result[.FIELD...] "
        "(or before[.FIELD...], with `before:`)"
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

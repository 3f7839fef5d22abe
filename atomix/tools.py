"""Tool metadata and shims: how a plain function becomes a transactional tool.

Metadata is checked when the tool is defined, never at its first call: a wrong effect class,
a scope template that cannot be canonicalised, a reversible tool without a compensation or
an irreversible one with one raise ToolDefinitionError naming the tool and the field.

A tool function with a parameter named `idempotency_key` receives its effect's key from the
shim (when it is applied, released or, for a reversible tool, executed); callers never pass it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from atomix.effects import EffectClass
from atomix.errors import ScopeError, ToolDefinitionError
from atomix.scopes import Scope, ScopePolicy

ScopeSpec = str | Scope | Callable[..., Any]

#: The parameter through which a tool function receives its effect's idempotency key.
KEY_PARAM = "idempotency_key"
_MISSING: Any = object()
_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _key_encoder() -> Callable[[dict[str, Any]], str]:
    """`json.dumps(args, sort_keys=True, default=repr)`, without rebuilding an encoder per call.

    Without circular-reference markers the C encoder is stateless, so one instance serves every
    call (a circular argument then fails with RecursionError instead of ValueError).
    """
    fallback = json.JSONEncoder(sort_keys=True, default=repr, check_circular=False).encode
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:
        return fallback
    try:  # the arguments JSONEncoder.iterencode passes it
        encode = c_make_encoder(
            None, repr, json.encoder.encode_basestring_ascii, None, ": ", ", ", True, False, True
        )
    except TypeError:
        return fallback
    return lambda args: "".join(encode(args, 0))


_encode_args = _key_encoder()
_SCALARS = frozenset({str, int, float, bool, type(None)})


_SHORT = 48


def _digest(args: dict[str, Any]) -> str:
    """A stable text for a call's arguments, bound in signature order so that the same call
    always gives the same text. When all are scalars, their repr (stable across processes):
    kept as it is when short (it starts with "(", so it never looks like a hash), hashed
    when long. Anything else: a hash of the canonical JSON (keys sorted, so dicts built in
    any order agree)."""
    values = tuple(args.values())
    for value in values:
        if value.__class__ not in _SCALARS:
            blob = _encode_args(args).encode()
            break
    else:
        text = repr(values)
        if len(text) <= _SHORT:
            return text
        blob = text.encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


@dataclass(slots=True)
class Ack:
    """What a deferred call returns at once: `staged` (bufferable) or `queued` (gated)."""

    status: str
    key: str
    tool: str


@dataclass(slots=True)
class Call:
    """One call of a tool, as a compensation sees it."""

    tool: str
    args: dict[str, Any]
    result: Any = None
    before: Any = None


def _template_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


@dataclass(frozen=True, slots=True)
class _ScopeFn:
    spec: ScopeSpec

    def __call__(self, args: dict[str, Any]) -> list[str | Scope]:
        spec = self.spec
        if spec.__class__ is str:  # the common case first: a template
            return [spec.format_map(args)]  # type: ignore[union-attr]
        if isinstance(spec, Scope):
            return [spec]
        if isinstance(spec, str):
            return [spec.format_map(args)]
        out = spec(**args)
        if out is None:
            return []
        if isinstance(out, str | Scope):
            return [out]
        return list(out)


def _as_list(value: ScopeSpec | Iterable[ScopeSpec] | None) -> list[ScopeSpec]:
    if value is None:
        return []
    if isinstance(value, str | Scope) or callable(value):
        return [value]
    return list(value)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool's validated metadata: which scopes it reads and writes, how it settles."""

    name: str
    fn: Callable[..., Any]
    effect: EffectClass | None
    reads: tuple[_ScopeFn, ...]
    writes: tuple[_ScopeFn, ...]
    key: str | Callable[..., Any] | None
    compensate: Callable[[Call], Any] | None
    before: Callable[..., Any] | None
    signature: inspect.Signature
    is_async: bool
    wants_key: bool = False  # the function takes `idempotency_key` (not part of `signature`)
    # Parameter names and defaults when every parameter is positional-or-keyword: `bind` then
    # needs no `inspect` machinery (it falls back to it for anything irregular, and errors).
    names: tuple[str, ...] | None = None
    defaults: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Precomputed for the per-call path: whether a call never waits (staged or gated,
        # with no reads), and the one scope template most tools write through.
        deferred = not self.reads and (
            self.effect is EffectClass.BUFFERABLE or self.effect is EffectClass.IRREVERSIBLE
        )
        object.__setattr__(self, "deferred_only", deferred)
        only = self.writes[0].spec if len(self.writes) == 1 else None
        object.__setattr__(self, "write_template", only if only.__class__ is str else None)

    deferred_only: bool = field(init=False, repr=False, compare=False)
    write_template: str | None = field(init=False, repr=False, compare=False)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, defaults applied, in signature order."""
        names, defaults = self.names, self.defaults
        if names is None or defaults is None or len(args) > len(names):
            return self._slow_bind(args, kwargs)
        if not kwargs and len(args) == len(names):
            return dict(zip(names, args))  # noqa: B905 - equal lengths; strict= costs a slow call
        out = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name in out or name not in defaults:
                return self._slow_bind(args, kwargs)  # raises the right TypeError
            out[name] = value
        if len(out) < len(names):
            for name in names[len(args) :]:
                if name not in out:
                    value = defaults[name]
                    if value is _MISSING:
                        return self._slow_bind(args, kwargs)
                    out[name] = value
        if kwargs:
            out = {name: out[name] for name in names}
        return out

    def _slow_bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def read_scopes(self, args: dict[str, Any]) -> list[str | Scope]:
        return [s for fn in self.reads for s in fn(args)]

    def write_scopes(self, args: dict[str, Any]) -> list[str | Scope]:
        return [s for fn in self.writes for s in fn(args)]

    def key_part(self, args: dict[str, Any]) -> str:
        if isinstance(self.key, str):
            return self.key.format_map(args)
        if self.key is not None:
            return str(self.key(**args))
        return _digest(args)


def define_tool(
    fn: Callable[..., Any],
    *,
    effect: EffectClass | str | None = None,
    reads: ScopeSpec | Iterable[ScopeSpec] | None = None,
    writes: ScopeSpec | Iterable[ScopeSpec] | None = None,
    key: str | Callable[..., Any] | None = None,
    compensate: Callable[[Call], Any] | None = None,
    before: Callable[..., Any] | None = None,
    name: str | None = None,
    policy: ScopePolicy | None = None,
) -> ToolSpec:
    """Validate a tool's metadata and return its spec (see the module docstring)."""
    tool = name or getattr(fn, "__name__", None) or repr(fn)
    signature = inspect.signature(fn)
    if effect is not None and not isinstance(effect, EffectClass):
        try:
            effect = EffectClass(effect)
        except ValueError:
            allowed = ", ".join(c.value for c in EffectClass)
            raise ToolDefinitionError(
                tool, "effect", f"unknown effect class {effect!r}; allowed: {allowed}"
            ) from None
    # The shim calls fn(**arguments): a *args, **kwargs or positional-only parameter would
    # receive the wrong value (or fail at every call).
    odd = [p.name for p in signature.parameters.values() if p.kind not in _BY_KEYWORD]
    if odd:
        raise ToolDefinitionError(
            tool, "signature", f"parameters {odd} cannot be passed by keyword; name each one"
        )
    signature, wants_key = _split_key_param(tool, signature, effect)
    params = set(signature.parameters)
    read_specs, write_specs = _as_list(reads), _as_list(writes)
    if effect is not None and not write_specs:
        raise ToolDefinitionError(tool, "writes", "an effect-bearing tool must name its scopes")
    if effect is None and write_specs:
        raise ToolDefinitionError(tool, "effect", "a tool that writes scopes needs an effect class")
    if effect is EffectClass.REVERSIBLE and compensate is None:
        raise ToolDefinitionError(tool, "compensate", "a reversible effect needs a compensation")
    if effect is not EffectClass.REVERSIBLE and compensate is not None:
        raise ToolDefinitionError(
            tool, "compensate", f"a {effect or 'read-only'} tool cannot be compensated"
        )
    if before is not None and effect is not EffectClass.REVERSIBLE:
        raise ToolDefinitionError(tool, "before", "before-images are for reversible tools")
    for field_name, specs in (("reads", read_specs), ("writes", write_specs)):
        for spec in specs:
            _check_scope_spec(tool, field_name, spec, params, policy or ScopePolicy())
    if isinstance(key, str):
        missing = [f for f in _template_fields(key) if f not in params]
        if missing:
            raise ToolDefinitionError(tool, "key", f"template names unknown argument(s) {missing}")
    elif key is not None and not callable(key):
        raise ToolDefinitionError(tool, "key", "must be a template string or a callable")
    return ToolSpec(
        name=tool,
        fn=fn,
        effect=effect,
        reads=tuple(_ScopeFn(s) for s in read_specs),
        writes=tuple(_ScopeFn(s) for s in write_specs),
        key=key,
        compensate=compensate,
        before=before,
        signature=signature,
        is_async=inspect.iscoroutinefunction(fn),
        wants_key=wants_key,
        **_fast_binding(signature),
    )


def _split_key_param(
    tool: str, signature: inspect.Signature, effect: EffectClass | None
) -> tuple[inspect.Signature, bool]:
    """The signature callers see (without `idempotency_key`), and whether the tool takes it."""
    param = signature.parameters.get(KEY_PARAM)
    if param is None:
        return signature, False
    if effect is None:
        raise ToolDefinitionError(tool, KEY_PARAM, "a read-only tool has no idempotency key")
    rest = [p for p in signature.parameters.values() if p.name != KEY_PARAM]
    return signature.replace(parameters=rest), True


def _fast_binding(signature: inspect.Signature) -> dict[str, Any]:
    params = list(signature.parameters.values())
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
        return {}
    defaults = {p.name: _MISSING if p.default is p.empty else p.default for p in params}
    return {"names": tuple(defaults), "defaults": defaults}


def _check_scope_spec(
    tool: str, field_name: str, spec: ScopeSpec, params: set[str], policy: ScopePolicy
) -> None:
    if isinstance(spec, Scope) or callable(spec):
        return
    if not isinstance(spec, str):
        raise ToolDefinitionError(tool, field_name, f"scope spec must be str, Scope or callable: {spec!r}")
    fields = _template_fields(spec)
    missing = [f for f in fields if f not in params]
    if missing:
        raise ToolDefinitionError(
            tool, field_name, f"scope template {spec!r} names unknown argument(s) {missing}"
        )
    # A template is checked with placeholder values: if no plausible argument could make it
    # a valid scope, it is wrong now, not at the first call.
    errors = []
    for dummy in ("/x", "x", "1"):
        try:
            policy.resolve(spec.format_map(dict.fromkeys(fields, dummy)))
            return
        except ScopeError as exc:
            errors.append(str(exc))
    raise ToolDefinitionError(tool, field_name, f"scope {spec!r} cannot be canonicalised: {errors[0]}")

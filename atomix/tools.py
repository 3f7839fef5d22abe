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


# repr() of a tuple of n scalars, as a %-format: the same text without the tuple repr's
# recursion guard, which costs more than formatting the two or three values of a usual call.
_TUPLE_TEXT = ["()", "(%r,)", *("(" + ", ".join(["%r"] * n) + ")" for n in range(2, 9))]


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
        text = _TUPLE_TEXT[len(values)] % values if len(values) < 9 else repr(values)
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

    def __post_init__(self) -> None:
        # Precomputed for the per-call path: whether a call never waits (staged or gated,
        # with no reads), the one scope template most tools write through, how the key's
        # tool-specific part is made, and what a deferred call's Ack says.
        deferred = not self.reads and (
            self.effect is EffectClass.BUFFERABLE or self.effect is EffectClass.IRREVERSIBLE
        )
        object.__setattr__(self, "deferred_only", deferred)
        only = self.writes[0].spec if len(self.writes) == 1 else None
        object.__setattr__(self, "write_template", only if only.__class__ is str else None)
        key = self.key
        if isinstance(key, str):
            key_of: Callable[[dict[str, Any]], str] = key.format_map
        elif key is not None:
            key_of = lambda args: str(key(**args))  # noqa: E731
        else:
            key_of = _digest
        object.__setattr__(self, "key_of", key_of)
        object.__setattr__(self, "key_head", self.name + ":")
        status = "staged" if self.effect is EffectClass.BUFFERABLE else "queued"
        object.__setattr__(self, "ack_status", status)
        object.__setattr__(self, "binder", with_signature(self.name, self.signature, None))

    deferred_only: bool = field(init=False, repr=False, compare=False)
    write_template: str | None = field(init=False, repr=False, compare=False)
    key_of: Callable[[dict[str, Any]], str] = field(init=False, repr=False, compare=False)
    key_head: str = field(init=False, repr=False, compare=False)  # "name:", before the part
    ack_status: str = field(init=False, repr=False, compare=False)
    # A function of the tool's own signature returning its arguments by name: Python binds.
    binder: Callable[..., dict[str, Any]] = field(init=False, repr=False, compare=False)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, defaults applied, in signature order; a call that
        does not fit the signature raises TypeError, as calling the function would."""
        return self.binder(*args, **kwargs)

    def read_scopes(self, args: dict[str, Any]) -> list[str | Scope]:
        return [s for fn in self.reads for s in fn(args)]

    def write_scopes(self, args: dict[str, Any]) -> list[str | Scope]:
        return [s for fn in self.writes for s in fn(args)]

    def key_part(self, args: dict[str, Any]) -> str:
        """The tool-specific part of a call's idempotency key: the key template or function
        applied to the arguments, or else a digest of them."""
        return self.key_of(args)


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
    reserved = [p for p in signature.parameters if p.startswith("_atomix_")]
    if reserved:
        raise ToolDefinitionError(
            tool, "signature", f"parameters {reserved}: names starting with '_atomix_' are reserved"
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


def with_signature(
    name: str,
    signature: inspect.Signature,
    target: Callable[[dict[str, Any]], Any] | None,
    *,
    is_async: bool = False,
) -> Callable[..., Any]:
    """A function of exactly `signature` that calls `target` with its arguments by name, in
    signature order, defaults applied (or, with no target, returns them).

    Python binds each call itself, in C: a shim needs no binding of its own per call, and a
    call that does not fit raises the TypeError the tool function would. Only parameters
    that can be passed by keyword are allowed (define_tool checks this). The source is made
    from the parameter names alone, which are identifiers; defaults are bound by reference.
    """
    params = list(signature.parameters.values())
    namespace: dict[str, Any] = {"_atomix_target": target}
    rendered: list[str] = []
    for i, param in enumerate(params):
        if param.kind not in _BY_KEYWORD or not param.name.isidentifier():
            raise ValueError(f"{name}: parameter {param.name!r} cannot be passed by keyword")
        if param.kind is param.KEYWORD_ONLY and "*" not in rendered:
            rendered.append("*")
        if param.default is param.empty:
            rendered.append(param.name)
        else:
            namespace[f"_atomix_default_{i}"] = param.default
            rendered.append(f"{param.name}=_atomix_default_{i}")
    if any(p.name.startswith("_atomix_") for p in params):
        raise ValueError(f"{name}: parameter names starting with '_atomix_' are reserved")
    arguments = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in params) + "}"
    if target is None:
        body = arguments
    else:
        body = f"{'await ' if is_async else ''}_atomix_target({arguments})"
    source = f"{'async def' if is_async else 'def'} _shim({', '.join(rendered)}):\n    return {body}\n"
    exec(compile(source, f"<atomix tool {name}>", "exec"), namespace)  # noqa: S102
    made = namespace["_shim"]
    made.__code__ = made.__code__.replace(co_name=name, co_qualname=name)
    made.__name__ = made.__qualname__ = name
    return made


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

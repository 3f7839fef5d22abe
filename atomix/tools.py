"""Tool metadata and shims: how a plain function becomes a transactional tool.

Metadata is checked when the tool is defined, never at its first call: a wrong effect class,
a scope template that is malformed or cannot be canonicalised, a reversible tool without a
compensation or an irreversible one with one raise ToolDefinitionError naming the tool and
the field. What can only be checked per call is a template's root (see ScopeTemplate): a
value that would make the scope escape it raises ScopeError before anything runs or is staged.

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
from types import FunctionType
from typing import Any

from atomix.effects import EffectClass, compensation_key
from atomix.errors import ScopeError, ToolDefinitionError
from atomix.scope_parsing import (
    ScopePolicy,
    parse_scope,
    root_is_checked,
    scope_within,
    template_root,
)
from atomix.scopes import Scope


@dataclass(frozen=True, slots=True)
class ScopeTemplate:
    """A scope template with an explicit root that no argument value can escape.

    `ScopeTemplate("fs:/data/{user}/{file}", root="fs:/data/{user}")` renders like the plain
    template; a call whose scope (canonical: `..` applied, symlinks resolved) lies outside the
    rendered root, or whose rendered root lies outside the root's own literal prefix
    (`fs:/data`), raises ScopeError before the tool runs or anything is staged. A root that
    does not cover the template is a ToolDefinitionError when the tool is defined.

    A plain template string is rooted too, by default at its literal prefix cut back to the
    last complete component: `fs:/tmp/demo/{name}` at `fs:/tmp/demo`, `https://h/v1/{id}` at
    `https://h/v1`; `fs:{path}` and `kv:{p}` have no root. Only kinds whose values can climb
    (fs, url, sqlite files) are checked at call time; a name such as `kv:t:{p}` cannot escape.
    """

    template: str
    root: str | None = None


ScopeSpec = str | Scope | ScopeTemplate | Callable[..., Any]

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
    # The exception the tool raised, if it raised: it may still have acted, and is compensated.
    error: BaseException | None = None
    # The effect's idempotency key (the runtime sets it before the call runs): a compensation
    # may deduplicate on it, so that one run twice (recovery after a crash) undoes once.
    key: str | None = None

    @property
    def compensation_key(self) -> str | None:
        """The idempotency key for this call's compensation (`atomix.effects.compensation_key`
        of `key`): the same in the live abort and in recovery, and distinct from the call's own
        key, so a store that recorded the call's key does not drop the compensation as a
        duplicate of the call."""
        return None if self.key is None else compensation_key(self.key)


class UnrecordedCall(Call):
    """A reversible call whose result a durable log could not describe (its repr raised):
    the log holds a stand-in naming the failure, and the runtime compensates it in-process
    with the real result, as it would any call."""

    __slots__ = ()


def _template_fields(tool: str, field_name: str, template: str, *, scope: bool) -> list[str]:
    """The argument names a template uses, in order; a template `str.format_map` cannot fill
    from the arguments by name (or, for a scope, fills with anything but the value's own
    text) is a ToolDefinitionError."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:  # unbalanced braces
        raise ToolDefinitionError(
            tool, field_name, f"template {template!r} is malformed: {exc}"
        ) from None
    names: list[str] = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        what = (
            "{"
            + name
            + ("!" + conversion if conversion else "")
            + (":" + spec if spec else "")
            + "}"
        )
        if not name or name.isdigit():
            why = "positional fields are not supported: name an argument"
        elif not name.isidentifier():
            why = "attribute and index lookups are not supported: name an argument"
        elif scope and (spec or conversion):
            # A scope is canonicalised from the value's own text; formatting is a callable's job.
            why = "format specs and conversions are not supported in a scope template"
        elif (spec is not None and "{" in spec) or conversion not in (None, "r", "s", "a"):
            why = "nested fields and unknown conversions are not supported"
        else:
            names.append(name)
            continue
        raise ToolDefinitionError(tool, field_name, f"template {template!r}: field {what}: {why}")
    return names


def _literal_prefix(template: str) -> str:
    """The text a template renders before its first field ('{{' is '{')."""
    out = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            break
    return "".join(out)


@dataclass(frozen=True, slots=True)
class _Rooted:
    """A scope template checked against its root at every call (see ScopeTemplate)."""

    tool: str
    template: str
    root: str  # a template of the root
    outer: str | None  # the root's own default root, when the root has fields
    casefold: bool
    canonical: bool  # the runtime's policy canonicalises: hand over the Scope, parsed once

    def __call__(self, args: dict[str, Any]) -> str | Scope:
        text = self.template.format_map(args)
        scope = parse_scope(text, casefold=self.casefold)
        root = parse_scope(self.root.format_map(args), casefold=self.casefold)
        outer = None if self.outer is None else parse_scope(self.outer, casefold=self.casefold)
        if not scope_within(root, scope) or (outer is not None and not scope_within(outer, root)):
            used = ", ".join(
                f"{k}={v!r}" for k, v in args.items() if "{" + k + "}" in self.template + self.root
            )
            where = root if outer is None or scope_within(outer, root) else outer
            raise ScopeError(
                f"tool {self.tool!r}: scope template {self.template!r} with {used} gives "
                f"{scope}, outside its root {where}"
            )
        return scope if self.canonical else text


@dataclass(frozen=True, slots=True)
class _ScopeFn:
    spec: str | Scope | _Rooted | Callable[..., Any]  # a str is a template with nothing to check

    def __call__(self, args: dict[str, Any]) -> list[str | Scope]:
        spec = self.spec
        if spec.__class__ is str:  # the common case first: a template
            return [spec.format_map(args)]
        if spec.__class__ is _Rooted:
            return [spec(args)]
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
    if isinstance(value, str | Scope | ScopeTemplate) or callable(value):
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
    policy = policy or ScopePolicy()
    read_fns = tuple(_ScopeFn(_scope_spec(tool, "reads", s, params, policy)) for s in read_specs)
    write_fns = tuple(_ScopeFn(_scope_spec(tool, "writes", s, params, policy)) for s in write_specs)
    if isinstance(key, str):
        missing = [f for f in _template_fields(tool, "key", key, scope=False) if f not in params]
        if missing:
            raise ToolDefinitionError(tool, "key", f"template names unknown argument(s) {missing}")
    elif key is not None and not callable(key):
        raise ToolDefinitionError(tool, "key", "must be a template string or a callable")
    return ToolSpec(
        name=tool,
        fn=fn,
        effect=effect,
        reads=read_fns,
        writes=write_fns,
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
) -> FunctionType:
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
    source = (
        f"{'async def' if is_async else 'def'} _shim({', '.join(rendered)}):\n    return {body}\n"
    )
    exec(compile(source, f"<atomix tool {name}>", "exec"), namespace)  # noqa: S102
    made: FunctionType = namespace["_shim"]
    made.__code__ = made.__code__.replace(co_name=name, co_qualname=name)
    made.__name__ = made.__qualname__ = name
    return made


def _scope_spec(
    tool: str, field_name: str, spec: ScopeSpec, params: set[str], policy: ScopePolicy
) -> str | Scope | _Rooted | Callable[..., Any]:
    """Check one reads/writes spec and return what `_ScopeFn` evaluates per call: a plain
    template string when there is no root to check (the per-call fast path), else `_Rooted`."""
    if isinstance(spec, Scope) or callable(spec):
        return spec
    root: str | None = None
    if isinstance(spec, ScopeTemplate):
        root = spec.root
        spec = spec.template
        if not isinstance(root, str | None):
            raise ToolDefinitionError(tool, field_name, f"root must be a template string: {root!r}")
    if not isinstance(spec, str):
        raise ToolDefinitionError(
            tool, field_name, f"scope spec must be str, Scope, ScopeTemplate or callable: {spec!r}"
        )
    fields = _template_fields(tool, field_name, spec, scope=True)
    root_fields = [] if root is None else _template_fields(tool, field_name, root, scope=True)
    missing = [f for f in dict.fromkeys(fields + root_fields) if f not in params]
    if missing:
        raise ToolDefinitionError(
            tool, field_name, f"scope template {spec!r} names unknown argument(s) {missing}"
        )
    # A template is checked with placeholder values (a distinct one per field, so that a root
    # naming the wrong field shows): if no plausible argument could make it a valid scope, it
    # is wrong now, not at the first call.
    errors = []
    for dummy in ("/x", "x", "1"):
        values = {f: f"{dummy}{i}" for i, f in enumerate(dict.fromkeys(fields + root_fields))}
        try:
            policy.resolve(spec.format_map(values))
            break
        except ScopeError as exc:
            errors.append(str(exc))
    else:
        raise ToolDefinitionError(
            tool, field_name, f"scope {spec!r} cannot be canonicalised: {errors[0]}"
        )
    try:
        scope = parse_scope(spec.format_map(values), casefold=policy.casefold)
    except ScopeError:
        return spec  # only under the naive policy: no canonical scope, so nothing to root
    outer = None
    if root is None:
        root = template_root(_literal_prefix(spec)) if fields else None
    else:
        try:
            covered = scope_within(
                parse_scope(root.format_map(values), casefold=policy.casefold), scope
            )
        except ScopeError as exc:
            raise ToolDefinitionError(
                tool, field_name, f"root {root!r} cannot be canonicalised: {exc}"
            ) from None
        if not covered:
            raise ToolDefinitionError(
                tool, field_name, f"root {root!r} does not cover scope template {spec!r}"
            )
        if root_fields:
            outer = template_root(_literal_prefix(root))
    if root is None or not root_is_checked(scope.kind):
        return spec
    return _Rooted(tool, spec, root, outer, policy.casefold, policy.canonical)

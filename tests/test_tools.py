"""Tool metadata: checked when a tool is defined, and the shim's argument and key handling."""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atomix import Ack, Call, Runtime, Scope, ToolDefinitionError
from atomix.tools import define_tool


def _never_called(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a tool with bad metadata must fail at definition, not at a call")


def _f_p(p: str) -> None:
    _never_called(p)


def _f_to(to: str, idempotency_key: str) -> None:
    _never_called(to, idempotency_key)


def _f_read_key(p: str, idempotency_key: str) -> None:
    _never_called(p, idempotency_key)


def _f_varargs(*paths: str) -> None:
    _never_called(*paths)


def _f_varkw(**fields: Any) -> None:
    _never_called(**fields)


def _f_posonly(p: str, /) -> None:
    _never_called(p)


def _undo(call: Call) -> None:
    _never_called(call)


BAD: list[tuple[str, Callable[..., Any], dict[str, Any], str]] = [
    ("relative fs scope", _f_p, {"effect": "bufferable", "writes": "fs:relative/{p}"}, "writes"),
    ("relative fs read scope", _f_p, {"reads": "fs:relative/{p}"}, "reads"),
    ("unknown effect class", _f_p, {"effect": "eventual", "writes": "mem:{p}"}, "effect"),
    (
        "reversible, no compensation",
        _f_p,
        {"effect": "reversible", "writes": "mem:{p}"},
        "compensate",
    ),
    (
        "irreversible with compensation",
        _f_to,
        {"effect": "irreversible", "writes": "mail:{to}", "compensate": _undo},
        "compensate",
    ),
    ("read-only with compensation", _f_p, {"reads": "mem:{p}", "compensate": _undo}, "compensate"),
    ("writes template, unknown arg", _f_p, {"effect": "bufferable", "writes": "mem:{q}"}, "writes"),
    ("reads template, unknown arg", _f_p, {"reads": "mem:{path}"}, "reads"),
    (
        "key template, unknown arg",
        _f_p,
        {"effect": "bufferable", "writes": "mem:{p}", "key": "{q}"},
        "key",
    ),
    (
        "key neither str nor callable",
        _f_p,
        {"effect": "bufferable", "writes": "mem:{p}", "key": 3},
        "key",
    ),
    ("effect without scopes", _f_p, {"effect": "bufferable"}, "writes"),
    ("scopes without effect", _f_p, {"writes": "mem:{p}"}, "effect"),
    (
        "before-image, not reversible",
        _f_p,
        {"effect": "bufferable", "writes": "mem:{p}", "before": _f_p},
        "before",
    ),
    ("scope spec of a wrong type", _f_p, {"effect": "bufferable", "writes": [42]}, "writes"),
    ("read-only tool asking for a key", _f_read_key, {"reads": "mem:{p}"}, "idempotency_key"),
    ("*args", _f_varargs, {"effect": "bufferable", "writes": "mem:x"}, "signature"),
    ("**kwargs", _f_varkw, {"effect": "bufferable", "writes": "mem:x"}, "signature"),
    ("positional-only", _f_posonly, {"effect": "bufferable", "writes": "mem:{p}"}, "signature"),
]


@pytest.mark.parametrize(("fn", "meta", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_metadata_raises_at_definition_naming_tool_and_field(
    fn: Callable[..., Any], meta: dict[str, Any], field: str
) -> None:
    rt = Runtime()
    with pytest.raises(ToolDefinitionError) as info:
        rt.tool(fn, name="the_tool", **meta)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.tool, err.field) == ("the_tool", field)
    assert "'the_tool'" in str(err) and f"'{field}'" in str(err)
    # The same check without a runtime, and the tool's own name when none is given.
    with pytest.raises(ToolDefinitionError) as again:
        define_tool(fn, **meta)
    assert (again.value.tool, again.value.field) == (fn.__name__, field)


def test_uncanonicalisable_scope_message_says_why() -> None:
    with pytest.raises(ToolDefinitionError, match="cannot be canonicalised"):
        define_tool(_f_p, effect="bufferable", writes="fs:relative/{p}")


def test_good_metadata_with_templates_and_callables() -> None:
    rt = Runtime()
    store: dict[str, Any] = {}

    @rt.tool(effect="bufferable", writes="kv:{table}:{k}", reads="kv:{table}", key="{table}-{k}")
    def put(table: str, k: int, value: str) -> None:
        store[f"{table}/{k}"] = value

    @rt.tool(
        effect="irreversible",
        writes=lambda to, cc=(): [f"mail:{to}", *(f"mail:{c}" for c in cc)],
        key=lambda to, cc=(): "+".join([to, *cc]),
    )
    def notify(to: str, cc: tuple[str, ...] = ()) -> None:
        store[f"sent/{to}"] = "yes"

    @rt.tool(reads=lambda k: Scope("kv", ("t", str(k))))
    def get(k: int) -> str | None:
        return store.get(f"t/{k}")

    with rt.transaction() as tx:
        ack = put("t", 7, "seven")
        assert isinstance(ack, Ack) and ack.status == "staged" and ack.tool == "put"
        assert ack.key == f"{tx.session.key_prefix}put:t-7"  # an explicit key: no ordinal
        queued = notify("Ann@x.org", cc=("bob@x.org",))
        assert queued.status == "queued" and queued.key.endswith(":notify:Ann@x.org+bob@x.org")
        assert get(7) is None  # bufferable: not applied before commit
    s = tx.settlement
    assert s is not None and s.committed
    assert s.applied == (ack.key,) and s.released == (queued.key,)
    assert s.writes == ("kv:t:7", "mail:ann@x.org", "mail:bob@x.org")  # addresses are folded
    assert s.reads == ("kv:t", "kv:t:7")
    assert store == {"t/7": "seven", "sent/Ann@x.org": "yes"}
    assert get(7) == "seven"  # outside a transaction: runs in its own


def test_scope_aliases_are_canonicalised_by_the_shim() -> None:
    rt = Runtime()
    seen: list[int] = []
    put = rt.tool(lambda k: seen.append(k), effect="bufferable", writes="Kv: t : {k}", name="put")
    with rt.transaction() as tx:
        put(" 42")
    assert tx.settlement is not None and tx.settlement.writes == ("kv:t:42",)


# ------------------------------------------------------------------------------ binding
def _shape(a: int, b: int = 2, c: str = "c") -> None:
    return None


_SPEC = define_tool(_shape, reads="mem:{a}")
_SIG = inspect.signature(_shape)


@given(
    args=st.lists(st.integers(), max_size=4),
    kwargs=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(), max_size=3),
)
def test_fast_bind_matches_inspect_bind(args: list[int], kwargs: dict[str, int]) -> None:
    try:
        bound = _SIG.bind(*args, **kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            _SPEC.bind(tuple(args), kwargs)
        return
    bound.apply_defaults()
    got = _SPEC.bind(tuple(args), kwargs)
    assert got == dict(bound.arguments)
    assert list(got) == list(bound.arguments)  # signature order, as before


def test_keyword_only_parameters_bind_through_inspect() -> None:
    def kw(a: int, *, b: int = 5) -> int:
        return a + b

    spec = define_tool(kw, reads="mem:{a}")
    assert spec.bind((1,), {}) == {"a": 1, "b": 5}
    assert spec.bind((), {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(TypeError):
        spec.bind((1, 2), {})


def test_default_key_is_a_digest_of_the_arguments() -> None:
    """Scalars: their repr in signature order (stable across processes); anything else: the
    canonical JSON, so equal dicts built in another order give the same key."""
    spec = define_tool(_shape, effect="bufferable", writes="mem:{a}")

    class Odd:
        def __repr__(self) -> str:
            return "Odd()"

    def digest(blob: bytes) -> str:
        return hashlib.blake2b(blob, digest_size=8).hexdigest()

    scalars = {"a": 1, "b": 2, "c": "é"}
    assert spec.key_part(scalars) == "(1, 2, 'é')"  # short: readable as it is
    long = {"a": 1, "b": 2, "c": "é" * 60}
    assert spec.key_part(long) == digest(repr((1, 2, "é" * 60)).encode())
    assert spec.key_part({"a": 1, "b": 2, "c": "e"}) != spec.key_part(scalars)
    assert spec.key_part({"a": 1, "b": "2", "c": "é"}) != spec.key_part(scalars)  # types count
    mixed = {"a": 1.5, "b": Odd(), "c": [1, {"z": None, "y": 2}]}
    blob = json.dumps(mixed, sort_keys=True, default=repr).encode()
    assert spec.key_part(mixed) == digest(blob)
    reordered = {"a": 1.5, "b": Odd(), "c": [1, {"y": 2, "z": None}]}
    assert spec.key_part(reordered) == spec.key_part(mixed)


# ---------------------------------------------------------------------- idempotency key
def test_idempotency_key_parameter_is_hidden_from_callers_and_filled_at_apply() -> None:
    rt = Runtime()
    applied: list[tuple[str, str]] = []

    @rt.tool(effect="bufferable", writes="mem:{k}")
    def put(k: str, idempotency_key: str) -> None:
        applied.append((k, idempotency_key))

    assert list(inspect.signature(put).parameters) == ["k"]
    assert list(put.spec.signature.parameters) == ["k"] and put.spec.wants_key
    with rt.transaction():
        ack = put("x")
        with pytest.raises(TypeError):
            put("y", idempotency_key="forged")
        assert applied == []
    assert applied == [("x", ack.key)]


def test_idempotency_key_reaches_irreversible_and_reversible_tools() -> None:
    rt = Runtime()
    seen: dict[str, str] = {}

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def send(to: str, *, idempotency_key: str) -> None:
        seen["send"] = idempotency_key

    @rt.tool(effect="reversible", writes="seat:{n}", compensate=lambda call: None)
    def book(n: int, idempotency_key: str = "") -> str:
        seen["book"] = idempotency_key
        return f"booked {n}"

    with rt.transaction() as tx:
        queued = send("a@x.org")
        assert "send" not in seen  # gated: not before commit
        assert book(3) == "booked 3"
        assert seen["book"].startswith(f"{tx.session.key_prefix}book:#2:")  # 2nd call
    assert seen["send"] == queued.key
    assert tx.settlement is not None and tx.settlement.accepted == (seen["book"],)


def test_key_encoder_without_the_c_accelerator_gives_the_same_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import atomix.tools as tools_module

    args = {"b": [1, 2.5, None], "a": "é", "c": {"z": True}}
    fast = tools_module._key_encoder()(args)
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert tools_module._key_encoder()(args) == fast == json.dumps(args, sort_keys=True)

"""One canonical spelling per resource, through the public API.

A user's scope template and an adapter's scope for one resource must be one scope, so that
their transactions are ordered; a template's values must not escape its root; a malformed
template is a ToolDefinitionError naming the tool and the field.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import HANG_S, wait_until

from atomix import AtomixError, Runtime, ScopeError, ToolDefinitionError
from atomix.adapters import MailboxSink, SQLiteStore
from atomix.adapters.tools import mail_tools, sqlite_tools

# ScopeTemplate is imported inside the tests that use it: the others must fail on their own
# merits on code that predates it, not at import.


def _second_waits_for_first(
    first: Callable[[], Any], second: Callable[[], Any], rt: Runtime
) -> None:
    """Run `first` in a transaction and, while it is open, `second` in a later one on another
    thread: the later one must wait for the earlier one's commit (one resource, epoch order)."""
    order: list[str] = []
    go = threading.Event()

    def later() -> None:
        go.wait(HANG_S)
        with rt.transaction():
            second()
        order.append("second")

    # Started before the first transaction, so it does not inherit (or join) it.
    worker = threading.Thread(target=later, daemon=True)
    worker.start()
    with rt.transaction():
        first()
        go.set()
        # It parks until this one commits (had it not waited, it would have finished).
        wait_until(
            lambda: rt.coordinator._wakers or not worker.is_alive(),
            "the later transaction waits or ends",
        )
        assert worker.is_alive(), "the later transaction did not wait for the earlier one"
        order.append("first")
    worker.join(HANG_S)
    assert not worker.is_alive() and order == ["first", "second"]


# --------------------------------------------------------------------------- SQLite


def _user_order_tool(rt: Runtime) -> Any:
    """A README-style tool that writes a row of the adapter's table with plain sqlite3,
    spelling the table as the user thinks of it: `Orders`."""

    @rt.tool(effect="bufferable", writes="sqlite:{db}:Orders:{k}")
    def set_order(db: str, k: int, value: str) -> None:
        with sqlite3.connect(db, timeout=30) as conn:
            conn.execute(
                "INSERT INTO Orders (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                (str(k), json.dumps(value)),
            )

    return set_order


def test_sqlite_table_spellings_are_one_scope(tmp_path: Path) -> None:
    rt = Runtime()
    store = SQLiteStore(tmp_path / "d.db")
    set_order = _user_order_tool(rt)
    db = str(tmp_path / "d.db")
    user = rt.core.scope(set_order.spec.write_scopes({"db": db, "k": 42, "value": "x"})[0])
    adapter = rt.core.scope(store.scope("orders", 42))
    assert user.overlaps(adapter) and user == adapter
    assert rt.core.scope(f"sqlite:{db}:Orders:42") == rt.core.scope(f"sqlite:{db}:orders:42")
    assert rt.core.scope(f"sqlite:{db}:ORDERS").covers(adapter)
    assert store.scope("Orders", 42) == store.scope("orders", 42)  # the adapter agrees
    store.close()


def test_user_tool_and_adapter_put_on_one_row_are_ordered(tmp_path: Path) -> None:
    rt = Runtime()
    store = SQLiteStore(tmp_path / "d.db")
    store.ensure_table("orders")
    rows = sqlite_tools(rt, store)
    set_order = _user_order_tool(rt)
    _second_waits_for_first(
        lambda: set_order(str(tmp_path / "d.db"), 42, "by the user tool"),
        lambda: rows.put("orders", 42, "by the adapter"),
        rt,
    )
    assert store.get("orders", 42) == "by the adapter"  # applied in epoch order
    store.close()


# --------------------------------------------------------------------------- mail


def test_mail_address_spellings_are_one_scope(tmp_path: Path) -> None:
    rt = Runtime()
    assert rt.core.scope("mail:CFO@Example.com") == rt.core.scope(
        MailboxSink.scope("cfo@example.com")
    )
    assert rt.core.scope("mail: CFO@Example.com ") == rt.core.scope("mail:cfo@example.com")

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def notify(to: str) -> None: ...

    user = rt.core.scope(notify.spec.write_scopes({"to": "CFO@Example.com"})[0])
    assert user == rt.core.scope(MailboxSink.scope("cfo@EXAMPLE.com"))


def test_user_send_and_adapter_send_to_one_mailbox_are_ordered(tmp_path: Path) -> None:
    rt = Runtime()
    sink = MailboxSink(tmp_path / "outbox.jsonl")
    mail = mail_tools(rt, sink)

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def page(to: str, text: str) -> None:
        sink.send(to, "page", text)

    _second_waits_for_first(
        lambda: page("CFO@Example.com", "first"),
        lambda: mail.send("cfo@example.com", "mail", "second"),
        rt,
    )
    assert [m["body"] for m in sink.messages()] == ["first", "second"]
    assert {m["to"] for m in sink.messages()} == {"cfo@example.com"}


# --------------------------------------------------------------------------- template roots


def _writer(rt: Runtime, template: Any, written: list[str]) -> Any:
    @rt.tool(effect="bufferable", writes=template, name="save")
    def save(name: str) -> None:
        written.append(name)

    return save


def test_a_value_that_climbs_out_of_the_template_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    root.mkdir()
    rt = Runtime()
    written: list[str] = []
    save = _writer(rt, f"fs:{root}/{{name}}", written)
    with rt.transaction() as tx:
        with pytest.raises(ScopeError) as info:
            save("../../etc/passwd")
        assert rt.core.get(tx.txid).effects == []  # nothing staged
    err = info.value
    assert isinstance(err, AtomixError)
    text = str(err)
    assert "'save'" in text and f"fs:{root}/{{name}}" in text and "../../etc/passwd" in text
    assert str(rt.core.scope(f"fs:{root}")) in text  # the root
    assert tx.settlement is not None and tx.settlement.writes == ()
    with pytest.raises(ScopeError):
        save("../demo2/x")  # outside a transaction too; a sibling sharing a prefix is outside
    assert written == []
    # Values that stay inside are fine, '/' and '..' included.
    with rt.transaction():
        save("a.txt")
        save("sub/dir/b.txt")
        save("sub/../c.txt")
    assert written == ["a.txt", "sub/dir/b.txt", "sub/../c.txt"]


def test_a_symlink_under_the_root_that_points_outside_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "inner").symlink_to(root / "a", target_is_directory=True)
    rt = Runtime()
    written: list[str] = []
    save = _writer(rt, f"fs:{root}/{{name}}", written)
    with pytest.raises(ScopeError, match="outside its root"):
        save("link/secret.txt")
    save("inner/ok.txt")  # a symlink that stays under the root is fine
    assert written == ["inner/ok.txt"]


def test_url_template_root(tmp_path: Path) -> None:
    rt = Runtime()
    sent: list[str] = []

    @rt.tool(effect="irreversible", writes="https://api.example.com/v1/users/{uid}")
    def call_api(uid: str) -> None:
        sent.append(uid)

    for bad in ("../../admin", "%2e%2e/%2E%2E/admin"):
        with pytest.raises(ScopeError, match="outside its root"):
            call_api(bad)
    call_api("42")
    assert sent == ["42"]


def test_explicit_root_with_fields(tmp_path: Path) -> None:
    from atomix import ScopeTemplate

    rt = Runtime()
    done: list[tuple[str, str]] = []
    template = ScopeTemplate(f"fs:{tmp_path}/{{user}}/{{file}}", root=f"fs:{tmp_path}/{{user}}")

    @rt.tool(effect="bufferable", writes=template)
    def store(user: str, file: str) -> None:
        done.append((user, file))

    store("alice", "notes/a.txt")
    for user, file in [("alice", "../bob/x"), ("..", "x"), ("../elsewhere", "x")]:
        with pytest.raises(ScopeError):
            store(user, file)
    assert done == [("alice", "notes/a.txt")]


@pytest.mark.parametrize(
    "root", ["fs:/elsewhere", "fs:{tmp}/{{file}}", "kv:{{user}}", "fs:{tmp}/{{user}}/x/y/z"]
)
def test_an_explicit_root_that_does_not_cover_the_template_is_a_definition_error(
    tmp_path: Path, root: str
) -> None:
    from atomix import ScopeTemplate

    rt = Runtime()
    template = ScopeTemplate(f"fs:{tmp_path}/{{user}}/{{file}}", root=root.format(tmp=tmp_path))
    with pytest.raises(ToolDefinitionError) as info:
        rt.tool(lambda user, file: None, effect="bufferable", writes=template, name="store")
    assert (info.value.tool, info.value.field) == ("store", "writes")


def test_named_templates_keep_the_fast_path_and_rooted_ones_leave_it(tmp_path: Path) -> None:
    rt = Runtime()
    named = rt.tool(lambda p: None, effect="bufferable", writes="kv:{p}", name="named")
    table = rt.tool(lambda p: None, effect="bufferable", writes="kv:t:{p}", name="table")
    rooted = rt.tool(lambda p: None, effect="bufferable", writes=f"fs:{tmp_path}/{{p}}", name="f")
    assert named.spec.write_template == "kv:{p}"
    assert table.spec.write_template == "kv:t:{p}"
    assert rooted.spec.write_template is None


_STEPS = st.sampled_from(["..", ".", "a", "b", "link", "up", ""])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.lists(_STEPS, min_size=1, max_size=6).map("/".join))
def test_rooted_fs_template_accepts_exactly_the_values_that_stay_inside(
    tmp_path_factory: pytest.TempPathFactory, value: str
) -> None:
    base = tmp_path_factory.mktemp("prop")
    root = base / "root"
    (root / "a").mkdir(parents=True)
    (root / "link").symlink_to(base, target_is_directory=True)  # points outside
    (root / "a" / "up").symlink_to(root, target_is_directory=True)  # stays inside
    rt = Runtime()
    written: list[str] = []
    save = _writer(rt, f"fs:{root}/{{name}}", written)
    real, top = os.path.realpath(f"{root}/{value}"), os.path.realpath(root)
    inside = real == top or real.startswith(top + os.sep)
    if inside:
        save(value)
        assert written == [value]
    else:
        with pytest.raises(ScopeError):
            save(value)
        assert written == []


# --------------------------------------------------------------------------- malformed templates


def _f(p: str) -> None: ...


@pytest.mark.parametrize(
    ("field", "template"),
    [
        ("writes", "kv:{p"),
        ("writes", "kv:p}"),
        ("writes", "kv:{}"),
        ("writes", "kv:{0}"),
        ("writes", "kv:{p!r}"),
        ("writes", "kv:{p:>8}"),
        ("writes", "kv:{p.real}"),
        ("reads", "kv:{p"),
        ("reads", "kv:{p!s}"),
        ("key", "{p"),
        ("key", "}{p}"),
        ("key", "{}"),
        ("key", "{p!x}"),
        ("key", "{p:{p}}"),
    ],
)
def test_malformed_templates_raise_tool_definition_error(field: str, template: str) -> None:
    rt = Runtime()
    meta: dict[str, Any] = {"reads": "kv:{p}"} if field == "reads" else {}
    meta.update(effect="bufferable", writes="kv:{p}")
    meta[field] = template
    if field == "reads":
        meta["effect"] = "bufferable"
    with pytest.raises(ToolDefinitionError) as info:
        rt.tool(_f, name="the_tool", **meta)
    assert (info.value.tool, info.value.field) == ("the_tool", field)
    assert repr(template) in str(info.value)

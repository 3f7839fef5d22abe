"""More spellings of one resource, through the public API: SQLite table names quoted
(`"Orders"`, `[orders]`, `` `orders` ``) or schema-qualified (`main.orders`), and mail
addresses in NFC and NFD, with an internationalised domain or its punycode form. Each must be
the adapter's scope, so a user tool declared with it is ordered against the adapter's
transaction on the same row or mailbox."""

from __future__ import annotations

import json
import sqlite3
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from test_scope_spelling import _second_waits_for_first

from atomix import Runtime, ScopeError
from atomix.adapters import MailboxSink, SQLiteStore
from atomix.adapters.tools import mail_tools, sqlite_tools

SPELLINGS = ['"Orders"', "[orders]", "`ORDERS`", "main.orders", '"main"."Orders"', "MAIN.[Orders]"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_quoted_and_qualified_table_names_are_the_adapters_scope(tmp_path: Path, spelling: str) -> None:
    rt = Runtime()
    store = SQLiteStore(tmp_path / "d.db")
    db = str(tmp_path / "d.db")
    assert rt.core.scope(f"sqlite:{db}:{spelling}:42") == rt.core.scope(store.scope("orders", 42))
    assert rt.core.scope(f"sqlite:{db}:{spelling}").covers(rt.core.scope(store.scope("orders", 7)))
    store.close()


def test_another_schema_or_a_malformed_name_is_not_main(tmp_path: Path) -> None:
    rt = Runtime()
    db = str(tmp_path / "d.db")
    assert rt.core.scope(f"sqlite:{db}:temp.orders:1") != rt.core.scope(f"sqlite:{db}:orders:1")
    for bad in ['"orders', "a.b.c", '"a"x', ".orders"]:
        with pytest.raises(ScopeError, match="sqlite table name"):
            rt.core.scope(f"sqlite:{db}:{bad}:1")


@pytest.mark.parametrize("spelling", ['"Orders"', "main.orders", "[orders]"])
def test_a_tool_on_a_quoted_table_is_ordered_with_the_adapters_row(tmp_path: Path, spelling: str) -> None:
    rt = Runtime()
    store = SQLiteStore(tmp_path / "d.db")
    store.ensure_table("orders")
    rows = sqlite_tools(rt, store)

    @rt.tool(effect="bufferable", writes="sqlite:{db}:" + spelling + ":{k}")
    def set_order(db: str, k: int, value: str) -> None:
        with sqlite3.connect(db, timeout=30) as conn:
            conn.execute(
                f"INSERT INTO {spelling} (k, v) VALUES (?, ?) "
                "ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                (str(k), json.dumps(value)),
            )

    # Before: the tool's scope was another resource, so it committed while the adapter's
    # transaction on that row was open, and the later transaction did not wait.
    _second_waits_for_first(
        lambda: rows.put("orders", 42, "by the adapter"),
        lambda: set_order(str(tmp_path / "d.db"), 42, "by the user tool"),
        rt,
    )
    assert store.get("orders", 42) == "by the user tool"  # applied in epoch order
    store.close()


NFD = unicodedata.normalize("NFD", "josé@bücher.de")
SAME_MAILBOX = [NFD, "José@Bücher.de", "jos\u00e9@xn--bcher-kva.de", "JOS\u00c9@XN--BCHER-KVA.DE"]


def test_mail_spellings_in_nfc_nfd_idn_and_punycode_are_one_scope() -> None:
    rt = Runtime()
    scopes = {rt.core.scope(MailboxSink.scope(a)) for a in SAME_MAILBOX}
    scopes |= {rt.core.scope(f"mail:{a}") for a in SAME_MAILBOX}
    assert len(scopes) == 1, scopes
    assert rt.core.scope("mail:jose@bücher.de") not in scopes  # e and é stay two mailboxes


def test_a_user_send_in_nfd_is_ordered_with_the_adapters_send(tmp_path: Path) -> None:
    rt = Runtime()
    sink = MailboxSink(tmp_path / "outbox.jsonl")
    mail = mail_tools(rt, sink)
    sent: list[Any] = []

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def page(to: str, text: str) -> None:
        sent.append(text)
        sink.send(to, "page", text)

    _second_waits_for_first(
        lambda: mail.send("josé@xn--bcher-kva.de", "mail", "first"),
        lambda: page(NFD.upper(), "second"),
        rt,
    )
    assert [m["body"] for m in sink.messages()] == ["first", "second"]

"""Compensations carry a key, and the adapters' stores deduplicate on it: a process killed
between a compensation and its log mark is recovered without compensating twice.

The compensation here is not idempotent on purpose: it sends a cancellation mail and inserts
a refund row under a fresh name each time it runs, so only the key can make a second run a
no-op. The child kills itself (os._exit) inside the compensation, right after both effects
are durable and before the runtime could write the compensation's mark.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from pathlib import Path
from typing import Any

from atomix import Runtime
from atomix.adapters import MailboxSink, SQLiteStore
from atomix.effects import compensation_key

_FORK = multiprocessing.get_context("fork")
DIE = "die-in-compensation"


def _tools(rt: Runtime, base: Path) -> Any:
    store = SQLiteStore(base / "shop.sqlite")
    sink = MailboxSink(base / "outbox.jsonl")

    def cancel(call: Any) -> None:
        key = getattr(call, "compensation_key", None)
        sink.send(f"{call.args['who']}@example.org", "cancelled", call.args["ident"], key=key)
        store.put("refunds", f"{call.args['ident']}-{uuid.uuid4().hex}", {"ok": True}, key=key)
        if (base / DIE).exists():
            (base / DIE).unlink()
            os._exit(0)  # killed after the compensation acted, before its mark

    @rt.tool(effect="reversible", writes="shop:booking:{ident}", compensate=cancel)
    def book(ident: str, who: str, idempotency_key: str) -> str:
        store.put("bookings", ident, {"who": who}, key=idempotency_key)
        return ident

    return book


def _child(base_text: str) -> None:
    base = Path(base_text)
    try:
        rt = Runtime(log=base / "log", recover=False)
        book = _tools(rt, base)
        (base / DIE).write_text("1")
        with rt.transaction():
            book("b1", "ann")
            book("b2", "bob")
            raise RuntimeError("the program changes its mind: abort")
    except BaseException as exc:  # noqa: BLE001 - the parent reads it
        (base / "child-error").write_text(repr(exc))
        os._exit(3)


def test_a_compensation_killed_before_its_mark_is_not_run_twice(tmp_path: Path) -> None:
    proc = _FORK.Process(target=_child, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0, (tmp_path / "child-error").read_text()
    outbox = MailboxSink(tmp_path / "outbox.jsonl")
    assert [m["body"] for m in outbox.messages()] == ["b2"]  # b2 compensated first (reverse order)

    rt = Runtime(log=tmp_path / "log", recover=False)
    _tools(rt, tmp_path)
    report = rt.recover()
    assert report.clean and report.compensated == 2, str(report)
    rt.close()
    # Exactly one compensation per booking, judged from the stores themselves.
    bodies = [m["body"] for m in MailboxSink(tmp_path / "outbox.jsonl").messages()]
    assert sorted(bodies) == ["b1", "b2"], bodies  # before the fix: b2 twice
    refunds = SQLiteStore(tmp_path / "shop.sqlite").snapshot()["refunds"]
    assert sorted(k.split("-")[0] for k in refunds) == ["b1", "b2"], refunds
    # The key the stores recorded is derived from the booking's own key, not equal to it.
    keys = MailboxSink(tmp_path / "outbox.jsonl").applied_keys()
    booked = SQLiteStore(tmp_path / "shop.sqlite").applied_keys()
    assert {compensation_key(k) for k in booked if not k.endswith(":compensate")} == keys


def test_a_live_abort_hands_the_compensation_its_key(tmp_path: Path) -> None:
    seen: list[tuple[str | None, str | None]] = []

    rt = Runtime()

    @rt.tool(
        effect="reversible",
        writes="shop:booking:{ident}",
        compensate=lambda call: seen.append((call.key, call.compensation_key)),
    )
    def book(ident: str, idempotency_key: str) -> str:
        seen.append((idempotency_key, None))
        return ident

    try:
        with rt.transaction():
            book("b1")
            raise RuntimeError("abort")
    except RuntimeError:
        pass
    (run_key, _), (call_key, comp_key) = seen
    assert call_key == run_key and comp_key == compensation_key(run_key) != run_key

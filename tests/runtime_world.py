"""The worlds of the public-runtime tests (test_runtime_*.py): a Runtime with one tool of each
effect class over in-memory state (World, the `w` fixture of conftest.py), its asyncio
counterpart (AsyncWorld), and the key a booking had in a settled transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from atomix import Call, Runtime
from atomix.handles import Tx

JOIN = 10.0  # seconds: generous, only a hung test ever waits this long


class World:
    """A runtime with one tool of each class over in-memory state, and a log of what ran."""

    def __init__(self, rt: Runtime | None = None) -> None:
        self.rt = rt or Runtime(timeout=JOIN)
        self.store: dict[str, Any] = {}
        self.outbox: list[tuple[str, str]] = []
        self.seats: set[int] = set()
        self.log: list[str] = []
        self.fail_cancel: set[int] = set()
        self.cancel_hooks: list[Callable[[], None]] = []
        rt = self.rt

        @rt.tool(effect="bufferable", writes="mem:{k}")
        def put(k: str, v: Any) -> None:
            self.log.append(f"put {k}={v}")
            self.store[k] = v

        @rt.tool(reads="mem:{k}")
        def get(k: str) -> Any:
            return self.store.get(k)

        @rt.tool(effect="irreversible", writes="mail:{to}")
        def send(to: str, text: str) -> None:
            self.log.append(f"send {to}")
            self.outbox.append((to, text))

        def cancel(call: Call) -> None:
            for hook in self.cancel_hooks:
                hook()
            seat = call.args["seat"]
            if seat in self.fail_cancel:
                raise RuntimeError(f"cannot cancel seat {seat}")
            self.log.append(f"cancel {seat}")
            self.seats.discard(seat)

        @rt.tool(effect="reversible", writes="seat:{seat}", compensate=cancel)
        def book(seat: int) -> str:
            self.log.append(f"book {seat}")
            self.seats.add(seat)
            return f"seat {seat}"

        self.put, self.get, self.send, self.book = put, get, send, book


class AsyncWorld:
    def __init__(self) -> None:
        self.rt = Runtime(timeout=JOIN)
        self.store: dict[str, Any] = {}
        self.log: list[str] = []
        rt = self.rt

        @rt.tool(effect="bufferable", writes="mem:{k}")
        async def aput(k: str, v: Any) -> None:
            await asyncio.sleep(0)
            self.log.append(f"put {k}={v}")
            self.store[k] = v

        @rt.tool(reads="mem:{k}")
        async def aget(k: str) -> Any:
            await asyncio.sleep(0)
            return self.store.get(k)

        async def unbook(call: Call) -> None:
            await asyncio.sleep(0)
            self.log.append(f"cancel {call.args['seat']}")

        @rt.tool(effect="reversible", writes="seat:{seat}", compensate=unbook)
        async def abook(seat: int) -> int:
            self.log.append(f"book {seat}")
            return seat

        self.aput, self.aget, self.abook = aput, aget, abook


def _book_key(w: World, tx: Tx, seat: int) -> str:
    """The idempotency key `w.book(seat)` had in `tx`, from its settlement (the core forgets
    finished ones): the run's prefix, the tool, the call's ordinal, then the arguments."""
    s = tx.settlement
    assert s is not None
    part = w.book.spec.key_part({"seat": seat})
    found = [
        k
        for k in s.accepted + s.compensated + s.residue
        if k.startswith(f"{tx.session.key_prefix}book:#") and k.endswith(f":{part}")
    ]
    assert len(found) == 1, found
    return found[0]

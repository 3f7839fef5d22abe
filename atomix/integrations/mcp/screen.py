"""The proxy's client transport: MCP's stdio server, with every incoming line screened first.

The SDK's stdio transport hands a line it cannot parse to the server as an exception, which
the server logs and drops: the client then waits for an answer that never comes. Here each
line is checked before it reaches the SDK, and one that is not a JSON-RPC 2.0 message is
answered at once with the JSON-RPC error it deserves, and serving goes on:

- not JSON: -32700 (parse error), id null;
- a batch (a JSON array): MCP sends no batches, so it is rejected: each request in it gets a
  -32600 (invalid request) with its own id, so no caller waits; an empty batch, or one of
  notifications only, gets one -32600 with id null;
- not an object, or an object that is no request, notification, response or error: -32600,
  with the request's id when it has a usable one (else null);
- a request whose `params` is not an object (MCP's params are always named): -32602
  (invalid params), with its id.

A broken notification (no id) gets no answer, as JSON-RPC says of notifications: it is noted
on stderr instead. Blank lines are skipped.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from io import TextIOWrapper
from typing import Any

import anyio
import mcp.types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from .report import say

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

Reply = dict[str, Any]


def _error(ident: Any, code: int, message: str) -> Reply:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def _usable_id(message: dict[str, Any]) -> Any:
    ident = message.get("id")
    return ident if isinstance(ident, str) or (isinstance(ident, int) and not isinstance(ident, bool)) else None


def screen(line: str) -> tuple[bool, list[Reply]]:
    """Whether `line` goes on to the MCP server, and the error replies to send instead."""
    text = line.strip()
    if not text:
        return False, []
    try:
        message = json.loads(text)
    except ValueError as exc:
        return False, [_error(None, PARSE_ERROR, f"Parse error: not JSON ({exc})")]
    if isinstance(message, list):
        why = (
            "Invalid Request: JSON-RPC batches are not supported (MCP sends none); "
            "send each request as its own message"
        )
        replies = [
            _error(_usable_id(m), INVALID_REQUEST, why)
            for m in message
            if isinstance(m, dict) and _usable_id(m) is not None and "method" in m
        ]
        if not replies:
            empty = "Invalid Request: an empty batch" if not message else why
            replies = [_error(None, INVALID_REQUEST, empty)]
        return False, replies
    if not isinstance(message, dict):
        return False, [_error(None, INVALID_REQUEST, f"Invalid Request: a {type(message).__name__}, not an object")]
    try:
        types.jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValueError:
        pass
    else:
        return True, []
    ident = _usable_id(message)
    if "method" in message and "id" not in message:
        say(f"dropped a malformed notification: {text[:200]}")
        return False, []
    params = message.get("params")
    if "method" in message and params is not None and not isinstance(params, dict):
        return False, [
            _error(ident, INVALID_PARAMS, f"Invalid params: params must be an object, not a {type(params).__name__}")
        ]
    return False, [
        _error(ident, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, notification or response")
    ]


class _ScreenedLines:
    """The lines of `source` that pass `screen`; for the others, `reject` sends the replies."""

    def __init__(self, source: Any, reject: Callable[[list[Reply]], Awaitable[None]]) -> None:
        self._source = source
        self._reject = reject

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._source:
            ok, replies = screen(line)
            if replies:
                await self._reject(replies)
            if ok:
                yield line


class _UnownedText(TextIOWrapper):
    """Text over stdin's buffer that never closes the buffer (it is not this object's)."""

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.detach()


@contextlib.asynccontextmanager
async def screened_stdio_server() -> AsyncIterator[tuple[Any, Any]]:
    """`mcp.server.stdio.stdio_server()` whose stdin lines are screened (module docstring)."""
    ready = anyio.Event()
    writer: list[Any] = []

    async def reject(replies: list[Reply]) -> None:
        await ready.wait()
        for reply in replies:
            message = types.jsonrpc_message_adapter.validate_python(reply, by_name=False)
            await writer[0].send(SessionMessage(message))

    stdin = anyio.wrap_file(_UnownedText(sys.stdin.buffer, encoding="utf-8", errors="replace"))
    async with stdio_server(stdin=_ScreenedLines(stdin, reject)) as (read, write):  # type: ignore[arg-type]
        writer.append(write)
        ready.set()
        yield read, write

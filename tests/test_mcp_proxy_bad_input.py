"""`atomix mcp-proxy` answers every line a client sends, broken ones included, and keeps
serving: a line that is not JSON, a batch, a request whose params is not an object. Driven
through a real proxy process over raw stdio (no client library to tidy the input up)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

from test_mcp_proxy import NOTES_POLICY, _atomix, _policy, _upstream

PATIENCE_S = 60.0  # how long to wait for an answer before calling it a hang


class RawClient:
    """The proxy as a subprocess, spoken to line by line."""

    def __init__(self, tmp_path: Path) -> None:
        policy = _policy(tmp_path, NOTES_POLICY)
        self.errlog = open(tmp_path / "proxy.err", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [*_atomix(), "mcp-proxy", "--policy", str(policy), "--", *_upstream(tmp_path / "up")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errlog,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            self.lines.put(line)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def answer(self) -> Any:
        try:
            return json.loads(self.lines.get(timeout=PATIENCE_S))
        except queue.Empty:
            raise AssertionError(f"no answer within {PATIENCE_S} s: the proxy hangs its client") from None

    def request(self, ident: int, method: str, params: Any = None) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message))
        return self.answer()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(PATIENCE_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.errlog.close()


def test_broken_lines_are_answered_and_the_proxy_keeps_serving(tmp_path: Path) -> None:
    client = RawClient(tmp_path)
    try:
        init = client.request(
            1,
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {},
             "clientInfo": {"name": "raw", "version": "0"}},
        )
        assert init["id"] == 1 and "result" in init, init
        client.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

        client.send("this is not JSON {")  # before: no answer ever
        parse = client.answer()
        assert parse["id"] is None and parse["error"]["code"] == -32700, parse

        bad_params = client.request(2, "tools/call", [1, 2])  # params not an object
        assert bad_params["id"] == 2 and bad_params["error"]["code"] == -32602, bad_params

        client.send(json.dumps([
            {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 4, "method": "ping"},
        ]))
        batch = [client.answer(), client.answer()]
        assert sorted(a["id"] for a in batch) == [3, 4], batch
        assert all(a["error"]["code"] == -32600 and "batch" in a["error"]["message"] for a in batch)

        client.send("[]")
        empty = client.answer()
        assert empty["id"] is None and empty["error"]["code"] == -32600, empty

        client.send(json.dumps({"jsonrpc": "2.0", "id": 5}))  # neither request nor response
        invalid = client.answer()
        assert invalid["id"] == 5 and invalid["error"]["code"] == -32600, invalid

        client.send("42")
        scalar = client.answer()
        assert scalar["id"] is None and scalar["error"]["code"] == -32600, scalar

        # Still serving: a well-formed request gets its answer.
        listed = client.request(6, "tools/list", {})
        assert listed["id"] == 6 and "write_note" in {t["name"] for t in listed["result"]["tools"]}
    finally:
        client.close()
    assert client.proc.returncode == 0, (tmp_path / "proxy.err").read_text()

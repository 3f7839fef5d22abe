"""A small real MCP server (stdio, the `mcp` SDK's MCPServer) for the proxy's tests.

`python tests/mcp_upstream_server.py --dir DIR` keeps notes as files in DIR/notes, sends mail
by appending a JSON line to DIR/outbox.jsonl, and appends every call it receives to
DIR/calls.jsonl, so a test can see exactly what reached the server. At start it writes its
parent's process id (the proxy's) to DIR/proxy.pid.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def build(root: Path) -> MCPServer:
    notes = root / "notes"
    notes.mkdir(parents=True, exist_ok=True)
    outbox = root / "outbox.jsonl"
    calls = root / "calls.jsonl"
    server = MCPServer("notes-and-mail", instructions="Notes in a directory; mail to an outbox.")

    def record(tool: str, **args: Any) -> None:
        with calls.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "args": args}) + "\n")

    def note(name: str) -> Path:
        if not _NAME.fullmatch(name) or name.startswith("."):
            raise ToolError(f"bad note name {name!r}")
        return notes / name

    @server.tool()
    def write_note(name: str, text: str) -> dict[str, Any]:
        """Write a note (creating or replacing it)."""
        record("write_note", name=name, text=text)
        note(name).write_text(text, encoding="utf-8")
        return {"name": name, "bytes": len(text.encode())}

    @server.tool()
    def delete_note(name: str) -> str:
        """Delete a note."""
        record("delete_note", name=name)
        path = note(name)
        if not path.exists():
            raise ToolError(f"no note {name!r}")
        path.unlink()
        return f"deleted {name}"

    @server.tool()
    def read_note(name: str) -> str:
        """Read a note."""
        record("read_note", name=name)
        path = note(name)
        if not path.exists():
            raise ToolError(f"no note {name!r}")
        return path.read_text(encoding="utf-8")

    @server.tool()
    def send_mail(to: str, body: str, subject: str = "") -> dict[str, Any]:
        """Send an e-mail (it cannot be unsent)."""
        record("send_mail", to=to, body=body, subject=subject)
        with outbox.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"to": to, "subject": subject, "body": body}) + "\n")
        return {"sent": True, "to": to}

    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "proxy.pid").write_text(str(os.getppid()))
    build(args.dir).run("stdio")


if __name__ == "__main__":
    main()

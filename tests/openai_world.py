"""Shared by the atomix.integrations.openai tests: real openai SDK objects (built offline with
model_validate), and a runtime whose real rt.tool tools write files under a temporary
directory, with an append-only outbox file that a gated send appends to only when it is
released."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from atomix import Call, Runtime

openai_types = pytest.importorskip("openai.types.chat")
ChatCompletion = openai_types.ChatCompletion


def completion(*calls: tuple[str, str]) -> Any:
    """A ChatCompletion whose message asks for `calls` (name, arguments JSON), ids call_0..."""
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "test-model",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{i}",
                                "type": "function",
                                "function": {"name": name, "arguments": arguments},
                            }
                            for i, (name, arguments) in enumerate(calls)
                        ],
                    },
                }
            ],
        }
    )


def args(**kwargs: Any) -> str:
    return json.dumps(kwargs)


@dataclass
class World:
    """A runtime with tools over real files: notes (staged), an outbox (gated sends),
    reservations (reversible), a reader and a tool that fails."""

    root: Path
    rt: Runtime = field(default_factory=Runtime)
    ran: list[str] = field(default_factory=list)  # tool functions in the order they ran
    tools: dict[str, Any] = field(default_factory=dict)

    @property
    def outbox(self) -> list[dict[str, str]]:
        path = self.root / "outbox.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def notes(self) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted((self.root / "notes").iterdir())}

    def reservations(self) -> list[str]:
        return sorted(p.name for p in (self.root / "reservations").iterdir())


def make_world(tmp_path: Path) -> World:
    """A World over `tmp_path` with its tools defined (the `world` fixture of each file)."""
    w = World(tmp_path)
    notes, held = tmp_path / "notes", tmp_path / "reservations"
    notes.mkdir()
    held.mkdir()
    rt = w.rt

    @rt.tool(effect="bufferable", writes=f"fs:{notes}/{{name}}")
    def write_note(name: str, text: str) -> None:
        """Write a note.

        Args:
            name: The note's file name.
            text: Its text.
        """
        w.ran.append("write_note")
        (notes / name).write_text(text)

    @rt.tool(reads=f"fs:{notes}/{{name}}")
    def read_note(name: str) -> str:
        """Read a note."""
        w.ran.append("read_note")
        return (notes / name).read_text()

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def send_mail(to: str, body: str) -> None:
        """Send an e-mail."""
        w.ran.append("send_mail")
        with (tmp_path / "outbox.jsonl").open("a") as out:
            out.write(json.dumps({"to": to, "body": body}) + "\n")

    def cancel(call: Call) -> None:
        (held / call.args["item"]).unlink()

    @rt.tool(effect="reversible", writes=f"fs:{held}/{{item}}", compensate=cancel)
    def reserve(item: str, count: int = 1) -> dict[str, Any]:
        """Reserve an item now (cancelled if the transaction aborts)."""
        w.ran.append("reserve")
        (held / item).write_text(str(count))
        return {"reserved": item, "count": count}

    @rt.tool
    def explode(reason: str) -> None:
        """Always fails."""
        w.ran.append("explode")
        raise RuntimeError(f"exploded: {reason}")

    w.tools = {
        "write_note": write_note,
        "read_note": read_note,
        "send_mail": send_mail,
        "reserve": reserve,
        "explode": explode,
    }
    return w


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]

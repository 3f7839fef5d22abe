"""Shared by the AtomixToolNode tests: real LangGraph graphs, driven by langchain-core's
scripted fake chat model.

The model is not under test: it replays AIMessages with tool calls. The tools act on real
things under tmp_path: files (bufferable), a booking in a SQLite database with a compensation
(reversible; triggers keep an audit of every insert and delete), and mail appended to an
outbox file (irreversible, gated). The runtime is strict, so a call that ran outside every
transaction would raise OutsideTransaction instead of quietly committing on its own.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from atomix import Call, Runtime
from atomix.integrations.langgraph import AtomixToolNode


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel has no bind_tools. This one binds tools as a real chat model does
    (their OpenAI form, through convert_to_openai_tool, passed on with every call) and keeps
    what it bound, so a test can check what the model was offered."""

    bound: list[dict[str, Any]] = []

    def bind_tools(self, tools: Iterable[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        self.bound = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=self.bound, **kwargs)


def calls(*specs: tuple[str, str, dict[str, Any]]) -> AIMessage:
    """An AIMessage asking for the given (id, tool, args) calls, all at once."""
    return AIMessage(
        content="",
        tool_calls=[{"id": i, "name": n, "args": a, "type": "tool_call"} for i, n, a in specs],
    )


def script(*turns: AIMessage | str) -> ScriptedChatModel:
    return ScriptedChatModel(messages=iter(turns))


@dataclass
class World:
    rt: Runtime
    files: Path
    db: Path
    outbox: Path
    tools: list[Any]
    free_barrier: threading.Barrier
    threads: dict[str, str]

    def bookings(self) -> dict[str, str]:
        with sqlite3.connect(self.db) as con:
            return dict(con.execute("SELECT room, guest FROM bookings"))

    def audit(self) -> list[tuple[str, str]]:
        with sqlite3.connect(self.db) as con:
            return list(con.execute("SELECT op, room FROM audit ORDER BY n"))

    def mail(self) -> list[dict[str, Any]]:
        if not self.outbox.exists():
            return []
        return [json.loads(line) for line in self.outbox.read_text().splitlines()]



def make_world(tmp_path: Path) -> World:
    """A World over `tmp_path` with its tools defined (the `world` fixture of each file)."""
    rt = Runtime(strict=True, timeout=20.0)
    files = tmp_path / "files"
    files.mkdir()
    db = tmp_path / "hotel.db"
    outbox = tmp_path / "outbox.jsonl"
    with sqlite3.connect(db) as con:
        con.executescript(
            """
            CREATE TABLE bookings (room TEXT PRIMARY KEY, guest TEXT NOT NULL);
            CREATE TABLE audit (n INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT, room TEXT);
            CREATE TRIGGER booked AFTER INSERT ON bookings
                BEGIN INSERT INTO audit (op, room) VALUES ('insert', NEW.room); END;
            CREATE TRIGGER cancelled AFTER DELETE ON bookings
                BEGIN INSERT INTO audit (op, room) VALUES ('delete', OLD.room); END;
            INSERT INTO bookings VALUES ('101', 'zoe');
            """
        )
    # Two room_free calls of one turn must both be running to pass: proof that a turn's
    # calls run concurrently (the timeout only keeps a broken test from hanging).
    barrier = threading.Barrier(2, timeout=30)
    threads: dict[str, str] = {}

    def write_file(name: str, text: str) -> None:
        """Write a text file in the workspace.

        Args:
            name: The file's name, relative to the workspace.
            text: The file's new content.
        """
        (files / name).write_text(text)

    def book_room(room: str, guest: str) -> dict[str, str]:
        """Book a hotel room for a guest."""
        with sqlite3.connect(db) as con:
            con.execute("INSERT INTO bookings VALUES (?, ?)", (room, guest))
        return {"room": room, "guest": guest}

    def cancel_booking(call: Call) -> None:
        if call.error is None:  # a failed INSERT left no row
            with sqlite3.connect(db) as con:
                con.execute("DELETE FROM bookings WHERE room = ?", (call.args["room"],))

    def send_mail(to: str, subject: str, body: str, idempotency_key: str) -> None:
        """Send an e-mail."""
        with outbox.open("a") as out:
            out.write(json.dumps({"to": to, "subject": subject, "key": idempotency_key}) + "\n")

    def room_free(room: str) -> bool:
        """Whether a room is free."""
        threads[room] = threading.current_thread().name
        barrier.wait()
        with sqlite3.connect(db) as con:
            return con.execute("SELECT 1 FROM bookings WHERE room = ?", (room,)).fetchone() is None

    async def room_rate(room: str) -> int:
        """The nightly rate of a room, in euros."""
        await asyncio.sleep(0)
        return 80 + int(room) % 7

    tools = [
        rt.tool(write_file, effect="bufferable", writes=f"fs:{files}/{{name}}"),
        rt.tool(
            book_room,
            effect="reversible",
            writes="sqlite:bookings:{room}",
            compensate=cancel_booking,
        ),
        rt.tool(send_mail, effect="irreversible", writes="mail:{to}"),
        rt.tool(room_free, reads="sqlite:bookings:{room}"),
        rt.tool(room_rate, reads="sqlite:bookings:{room}"),
    ]
    return World(rt, files, db, outbox, tools, barrier, threads)


def agent_graph(model: ScriptedChatModel, node: AtomixToolNode, checkpointer: Any = None) -> Any:
    """The usual tool-calling loop: agent -> tools -> agent, until no tool call is left."""
    bound = model.bind_tools(node.tools)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def atomix_meta(msg: ToolMessage) -> dict[str, Any]:
    return msg.response_metadata["atomix"]


HELLO = {"to": "ann@example.com", "subject": "Your booking", "body": "Room 102 is yours."}
PARALLEL_TURN = calls(
    ("c1", "room_free", {"room": "103"}),
    ("c2", "write_file", {"name": "a.txt", "text": "alpha"}),
    ("c3", "book_room", {"room": "102", "guest": "ann"}),
    ("c4", "send_mail", HELLO),
    ("c5", "room_free", {"room": "104"}),
)
FAILING_TURN = calls(
    ("f1", "write_file", {"name": "c.txt", "text": "gamma"}),
    ("f2", "book_room", {"room": "102", "guest": "ann"}),
    ("f3", "send_mail", HELLO),
    ("f4", "book_room", {"room": "101", "guest": "bob"}),  # 101 is zoe's: UNIQUE fails
)


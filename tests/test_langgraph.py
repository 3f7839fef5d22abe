"""AtomixToolNode on real LangGraph graphs, driven by langchain-core's scripted fake chat model.

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
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import tool as langchain_tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph, add_messages
from langgraph.prebuilt import create_react_agent, tools_condition
from langgraph.types import Command, Send, interrupt

from atomix import AtomixError, Call, Runtime, TransactionAborted
from atomix.integrations.langgraph import AtomixToolNode, Boundary, ToolNode
from atomix.schemas import tool_schema


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


@pytest.fixture
def world(tmp_path: Path) -> World:
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


# ------------------------------------------------------------------------ the tool schemas
def test_the_model_is_offered_each_tool_with_its_atomix_schema(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt)
    model = script("nothing to do")
    agent_graph(model, node)
    offered = {t["function"]["name"]: t["function"] for t in model.bound}
    assert set(offered) == {"write_file", "book_room", "send_mail", "room_free", "room_rate"}
    for shim in world.tools:
        schema = tool_schema(shim).openai()["function"]
        assert offered[schema["name"]]["parameters"] == schema["parameters"]
    assert offered["send_mail"]["description"] == "Send an e-mail."
    # the shim fills the key; the model never sees it
    assert "idempotency_key" not in offered["send_mail"]["parameters"]["properties"]
    assert offered["write_file"]["parameters"]["properties"]["name"]["description"] == (
        "The file's name, relative to the workspace."
    )


def test_a_langchain_tool_or_plain_function_is_refused_with_the_way_out(world: World) -> None:
    @langchain_tool
    def delete_everything(path: str) -> str:
        """Delete a directory."""
        return path

    with pytest.raises(TypeError, match=r"'delete_everything' is a LangChain tool.*rt\.tool"):
        AtomixToolNode([*world.tools, delete_everything], world.rt)

    def plain(x: int) -> int:
        return x

    with pytest.raises(TypeError, match=r"'plain' is function, not an rt.tool shim"):
        AtomixToolNode([plain], world.rt)
    with pytest.raises(ValueError, match="made by another Runtime"):
        AtomixToolNode(world.tools, Runtime())
    with pytest.raises(ValueError, match="boundary 'step'; allowed: 'turn', 'graph'"):
        AtomixToolNode(world.tools, world.rt, boundary="step")  # type: ignore[arg-type]
    assert ToolNode is AtomixToolNode


# ------------------------------------------------------------------------ boundary "turn"
def test_parallel_calls_of_one_turn_commit_together_and_each_effect_lands_once(
    world: World,
) -> None:
    node = AtomixToolNode(world.tools, world.rt)
    graph = agent_graph(model=script(PARALLEL_TURN, "All done."), node=node)

    result = graph.invoke({"messages": [HumanMessage("book 102 for ann")]})

    msgs = tool_messages(result)
    assert [m.tool_call_id for m in msgs] == ["c1", "c2", "c3", "c4", "c5"]
    assert [m.name for m in msgs] == ["room_free", "write_file", "book_room", "send_mail", "room_free"]
    assert all(m.status == "success" for m in msgs), [m.content for m in msgs]
    # the two room_free calls met at the barrier, each in its own worker thread
    assert world.threads["103"] != world.threads["104"]
    assert json.loads(msgs[0].content) is True
    assert json.loads(msgs[2].content) == {"room": "102", "guest": "ann"}
    assert msgs[1].content == "done: write_file applied when transaction 1 committed"
    assert msgs[3].content == "done: send_mail released when transaction 1 committed"
    assert msgs[3].artifact["status"] == "queued"
    # one transaction for the whole turn, committed
    assert {(atomix_meta(m)["txid"], atomix_meta(m)["outcome"]) for m in msgs} == {(1, "committed")}
    (settled,) = world.rt.settlements
    assert settled.committed and len(settled.applied) == 1 and len(settled.released) == 1
    assert len(settled.accepted) == 1
    # every effect landed, once
    assert (world.files / "a.txt").read_text() == "alpha"
    assert world.bookings() == {"101": "zoe", "102": "ann"}
    assert world.audit() == [("insert", "101"), ("insert", "102")]
    assert [(m["to"], m["subject"]) for m in world.mail()] == [(HELLO["to"], HELLO["subject"])]
    assert result["messages"][-1].content == "All done."


def test_one_failed_call_aborts_the_whole_turn_and_the_send_never_leaves(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt)
    graph = agent_graph(script(FAILING_TURN, "Sorry, 101 is taken."), node)

    result = graph.invoke({"messages": [HumanMessage("book 101 and 102")]})

    msgs = tool_messages(result)
    assert [m.tool_call_id for m in msgs] == ["f1", "f2", "f3", "f4"]
    assert all(m.status == "error" for m in msgs)
    failed = msgs[3]
    assert "IntegrityError" in failed.content and "UNIQUE" in failed.content
    assert "the transaction of this turn (1) aborted" in failed.content
    for msg in msgs[:3]:
        assert msg.content.startswith("rolled back: the transaction of this turn (1) aborted")
        assert "'f4' (book_room) failed" in msg.content
    assert "its write was dropped" in msgs[0].content
    assert "its effect was compensated" in msgs[1].content
    assert "it never left the gate" in msgs[2].content
    assert {atomix_meta(m)["outcome"] for m in msgs} == {"aborted"}
    (settled,) = world.rt.settlements
    assert settled.outcome == "aborted" and settled.abort_source == "tool_failure"
    assert len(settled.dropped) == 2  # the file write and the mail
    assert not settled.residue
    # the booking of 102 was made, then compensated; zoe keeps 101
    assert world.audit() == [("insert", "101"), ("insert", "102"), ("delete", "102")]
    assert world.bookings() == {"101": "zoe"}
    # the staged write never touched the disk and the gated mail never left
    assert not (world.files / "c.txt").exists()
    assert world.mail() == [] and not world.outbox.exists()
    assert result["messages"][-1].content == "Sorry, 101 is taken."


def test_on_error_commit_keeps_the_calls_that_succeeded(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt, on_error="commit")
    result = agent_graph(script(FAILING_TURN, "ok"), node).invoke({"messages": []})

    msgs = tool_messages(result)
    assert [m.status for m in msgs] == ["success", "success", "success", "error"]
    assert "UNIQUE" in msgs[3].content
    assert world.bookings() == {"101": "zoe", "102": "ann"}
    assert (world.files / "c.txt").read_text() == "gamma"
    assert [m["to"] for m in world.mail()] == [HELLO["to"]]


def test_without_handle_tool_errors_the_error_propagates_and_the_turn_is_undone(
    world: World,
) -> None:
    node = AtomixToolNode(world.tools, world.rt, handle_tool_errors=False)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        agent_graph(script(FAILING_TURN, "x"), node).invoke({"messages": []})
    (settled,) = world.rt.settlements
    assert settled.outcome == "aborted" and "IntegrityError" in settled.detail
    assert world.bookings() == {"101": "zoe"} and world.mail() == []
    assert not (world.files / "c.txt").exists()


def test_a_tool_that_calls_other_shims_from_its_worker_thread_joins_the_turn(
    world: World,
) -> None:
    """A composite tool's own shim calls run in ToolNode's worker thread: they find the
    turn's transaction in the context that thread was given (strict runtime: never outside)."""
    book, mail = world.tools[1], world.tools[2]

    def reserve(room: str, guest: str, email: str) -> str:
        """Book a room and mail the guest."""
        book(room=room, guest=guest)
        mail(to=email, subject="Booked", body=f"Room {room}")
        return "reserved"

    node = AtomixToolNode([*world.tools, world.rt.tool(reserve)], world.rt)
    both = calls(
        ("r1", "reserve", {"room": "106", "guest": "di", "email": "di@example.com"}),
        ("r2", "reserve", {"room": "107", "guest": "ed", "email": "ed@example.com"}),
    )
    failing = calls(
        ("r3", "reserve", {"room": "108", "guest": "fa", "email": "fa@example.com"}),
        ("r4", "book_room", {"room": "101", "guest": "bob"}),
    )
    result = agent_graph(script(both, failing, "done"), node).invoke({"messages": []})
    msgs = tool_messages(result)
    assert [(m.tool_call_id, m.status) for m in msgs] == [
        ("r1", "success"), ("r2", "success"), ("r3", "error"), ("r4", "error")
    ]
    assert world.bookings() == {"101": "zoe", "106": "di", "107": "ed"}
    assert sorted(m["to"] for m in world.mail()) == ["di@example.com", "ed@example.com"]
    first, second = world.rt.settlements
    assert first.committed and len(first.accepted) == 2 and len(first.released) == 2
    assert second.outcome == "aborted" and len(second.dropped) == 1  # fa's mail


def test_a_turn_inside_an_open_transaction_is_a_savepoint_of_it(world: World) -> None:
    """Two turns in one caller's transaction: the failed turn is rolled back alone."""
    node = AtomixToolNode(world.tools, world.rt)
    first = calls(("k1", "write_file", {"name": "kept.txt", "text": "kept"}))
    graph = agent_graph(script(first, FAILING_TURN, "done"), node)
    with world.rt.transaction() as tx:
        result = graph.invoke({"messages": []})
        assert world.bookings() == {"101": "zoe"}  # 102 compensated already, at the rollback
    msgs = tool_messages(result)
    assert {atomix_meta(m)["txid"] for m in msgs} == {tx.txid}
    assert atomix_meta(msgs[0])["outcome"] == "open"
    assert {atomix_meta(m)["outcome"] for m in msgs[1:]} == {"rolled_back"}
    assert msgs[1].content.startswith(f"rolled back: this turn was rolled back inside transaction {tx.txid}")
    assert tx.settlement is not None and tx.settlement.committed
    assert (world.files / "kept.txt").read_text() == "kept"
    assert not (world.files / "c.txt").exists() and world.mail() == []


# ------------------------------------------------------------------------ boundary "graph"
TWO_TURNS = (
    calls(
        ("g1", "write_file", {"name": "plan.txt", "text": "trip"}),
        ("g2", "book_room", {"room": "102", "guest": "ann"}),
    ),
    calls(
        ("g3", "send_mail", HELLO),
        ("g4", "write_file", {"name": "notes.txt", "text": "sent"}),
    ),
    "Booked and mailed.",
)


def test_graph_boundary_spanning_two_turns_aborted_at_the_end_drops_both(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt, boundary="graph")
    graph = agent_graph(script(*TWO_TURNS), node)

    with node.transaction() as run:
        result = graph.invoke({"messages": [HumanMessage("plan a trip")]})
        # in flight: the booking is made, the writes and the mail wait for the commit
        assert world.bookings() == {"101": "zoe", "102": "ann"}
        assert not (world.files / "plan.txt").exists() and world.mail() == []
        run.abort("the user cancelled")

    msgs = tool_messages(result)
    assert [m.tool_call_id for m in msgs] == ["g1", "g2", "g3", "g4"]
    assert all(m.status == "success" for m in msgs)
    assert {(atomix_meta(m)["txid"], atomix_meta(m)["outcome"]) for m in msgs} == {
        (run.txid, "open")
    }
    assert run.settlement is not None and run.settlement.outcome == "aborted"
    assert run.settlement.detail == "the user cancelled"
    assert world.audit() == [("insert", "101"), ("insert", "102"), ("delete", "102")]
    assert world.bookings() == {"101": "zoe"}
    assert not (world.files / "plan.txt").exists() and not (world.files / "notes.txt").exists()
    assert world.mail() == []


def test_graph_boundary_commits_both_turns_when_the_block_ends_cleanly(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt, boundary="graph")
    with node.transaction() as run:
        agent_graph(script(*TWO_TURNS), node).invoke({"messages": []})
    assert run.settlement is not None and run.settlement.committed
    assert (world.files / "plan.txt").read_text() == "trip"
    assert (world.files / "notes.txt").read_text() == "sent"
    assert world.bookings() == {"101": "zoe", "102": "ann"}
    assert len(world.mail()) == 1


def test_graph_boundary_a_failed_call_aborts_the_run_and_the_block_says_so(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt, boundary="graph")
    later = calls(("l1", "write_file", {"name": "later.txt", "text": "x"}))
    graph = agent_graph(script(FAILING_TURN, later, "giving up"), node)
    with pytest.raises(TransactionAborted, match="tool_failure") as raised:
        with node.transaction():
            result = graph.invoke({"messages": []})
    msgs = tool_messages(result)
    assert all(m.status == "error" for m in msgs)
    assert {atomix_meta(m)["outcome"] for m in msgs} == {"aborted"}
    # the call after the abort did not run in some other transaction: it failed, saying why
    assert msgs[-1].tool_call_id == "l1" and "aborted" in msgs[-1].content
    assert raised.value.settlement.abort_source == "tool_failure"
    assert world.bookings() == {"101": "zoe"}
    assert world.mail() == [] and not list(world.files.iterdir())


def test_graph_boundary_without_its_block_is_a_clear_error(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt, boundary="graph")
    graph = agent_graph(script(PARALLEL_TURN, "x"), node)
    with pytest.raises(AtomixError, match=r"boundary='graph': run the graph inside `with node"):
        graph.invoke({"messages": []})
    turn_node = AtomixToolNode(world.tools, world.rt)
    with pytest.raises(AtomixError, match="is for boundary='graph'"):
        with turn_node.transaction():
            pass
    assert world.rt.settlements == [] and world.mail() == []


@pytest.mark.parametrize("boundary", ["turn", "graph"])
def test_an_interrupt_in_a_tool_undoes_its_turn_so_the_resumed_node_books_once(
    world: World, boundary: Boundary
) -> None:
    def confirm(question: str) -> str:
        """Ask the user to confirm."""
        return str(interrupt(question))

    node = AtomixToolNode([*world.tools, world.rt.tool(confirm)], world.rt, boundary=boundary)
    turn = calls(
        ("i1", "book_room", {"room": "102", "guest": "ann"}),
        ("i2", "confirm", {"question": "Book 102?"}),
        ("i3", "send_mail", HELLO),
    )
    graph = agent_graph(script(turn, "Booked."), node, checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    with node.transaction() if boundary == "graph" else nullcontext():
        first = graph.invoke({"messages": []}, config)
        assert [i.value for i in first["__interrupt__"]] == ["Book 102?"]
        # the interrupted turn was undone: its booking compensated, its mail dropped
        assert world.bookings() == {"101": "zoe"} and world.mail() == []
        result = graph.invoke(Command(resume="yes"), config)
    msgs = tool_messages(result)
    assert [(m.tool_call_id, m.status) for m in msgs] == [
        ("i1", "success"), ("i2", "success"), ("i3", "success")
    ]
    assert msgs[1].content == "yes"
    # booked, undone at the interrupt, booked again on resume: one booking, one mail
    assert world.audit() == [("insert", "101"), ("insert", "102"), ("delete", "102"), ("insert", "102")]
    assert world.bookings() == {"101": "zoe", "102": "ann"}
    assert len(world.mail()) == 1


# ------------------------------------------------------------------------------- async
def test_async_graph_runs_parallel_calls_in_one_transaction(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt)
    turn = calls(
        ("a1", "room_rate", {"room": "102"}),
        ("a2", "room_free", {"room": "103"}),
        ("a3", "room_free", {"room": "104"}),
        ("a4", "book_room", {"room": "102", "guest": "ann"}),
        ("a5", "send_mail", HELLO),
    )
    graph = agent_graph(script(turn, FAILING_TURN, "done"), node)

    result = asyncio.run(graph.ainvoke({"messages": []}))

    msgs = tool_messages(result)
    assert [m.tool_call_id for m in msgs] == ["a1", "a2", "a3", "a4", "a5", "f1", "f2", "f3", "f4"]
    first, second = msgs[:5], msgs[5:]
    assert all(m.status == "success" for m in first), [m.content for m in first]
    assert first[0].content == "84"  # 80 + 102 % 7
    assert {(atomix_meta(m)["txid"], atomix_meta(m)["outcome"]) for m in first} == {(1, "committed")}
    assert all(m.status == "error" for m in second)
    assert {(atomix_meta(m)["txid"], atomix_meta(m)["outcome"]) for m in second} == {(2, "aborted")}
    # the first turn's booking and mail landed once; the second turn left nothing
    assert world.bookings() == {"101": "zoe", "102": "ann"}
    assert len(world.mail()) == 1
    assert not (world.files / "c.txt").exists()
    assert [s.outcome for s in world.rt.settlements] == ["committed", "aborted"]


def test_async_graph_boundary_aborted_drops_both_turns(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt, boundary="graph")
    graph = agent_graph(script(*TWO_TURNS), node)

    async def run_and_abort() -> tuple[dict[str, Any], Any]:
        async with node.atransaction() as run:
            result = await graph.ainvoke({"messages": []})
            assert world.bookings() == {"101": "zoe", "102": "ann"}
            await run.aabort()
        return result, run

    result, run = asyncio.run(run_and_abort())
    assert [m.tool_call_id for m in tool_messages(result)] == ["g1", "g2", "g3", "g4"]
    assert run.settlement.outcome == "aborted"
    assert world.bookings() == {"101": "zoe"} and world.mail() == []
    assert not list(world.files.iterdir())


# ------------------------------------------------------------------ the prebuilt agent
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_create_react_agent_v1_takes_the_node_as_its_tool_node(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt)
    model = script(FAILING_TURN, "Sorry.")
    agent = create_react_agent(model, node, version="v1")
    result = agent.invoke({"messages": [HumanMessage("book")]})
    assert {t["function"]["name"] for t in model.bound} >= {"book_room", "send_mail"}
    msgs = tool_messages(result)
    assert [m.tool_call_id for m in msgs] == ["f1", "f2", "f3", "f4"]
    assert all(m.status == "error" for m in msgs)
    assert world.bookings() == {"101": "zoe"} and world.mail() == []


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_create_react_agent_v2_sends_calls_one_by_one_and_a_turn_node_says_so(
    world: World,
) -> None:
    node = AtomixToolNode(world.tools, world.rt)
    agent = create_react_agent(script(FAILING_TURN, "x"), node)  # version "v2", the default
    with pytest.raises(AtomixError, match=r"version='v1'"):
        agent.invoke({"messages": [HumanMessage("book")]})
    assert world.bookings() == {"101": "zoe"} and world.mail() == []


# ------------------------------------------------------------- ToolNode's other inputs
def test_the_node_takes_a_message_list_state_and_bare_tool_calls(world: World) -> None:
    """ToolNode's other input shapes: a graph whose state is the message list itself, and a
    list of bare tool calls sent to the node (one turn: one transaction)."""
    node = AtomixToolNode(world.tools, world.rt)
    as_list = StateGraph(Annotated[list[AnyMessage], add_messages])
    as_list.add_node("tools", node)
    as_list.add_edge(START, "tools")
    ask = calls(("m1", "book_room", {"room": "105", "guest": "cy"}))
    out = as_list.compile().invoke([HumanMessage("hi"), ask])
    assert [(m.tool_call_id, m.status) for m in out if isinstance(m, ToolMessage)] == [
        ("m1", "success")
    ]

    bare = [
        {"id": "t1", "name": "write_file", "args": {"name": "t.txt", "text": "t"}, "type": "tool_call"},
        {"id": "t2", "name": "write_file", "args": {"name": "u.txt"}, "type": "tool_call"},
    ]
    sent = StateGraph(MessagesState)
    sent.add_node("tools", node)
    sent.add_conditional_edges(START, lambda state: [Send("tools", bare)], ["tools"])
    msgs = tool_messages(sent.compile().invoke({"messages": []}))
    assert [m.tool_call_id for m in msgs] == ["t1", "t2"]
    # t2 lacks `text`: the binding fails, so the turn aborts and t1's write is dropped
    assert "missing" in msgs[1].content and "'text'" in msgs[1].content
    assert [m.status for m in msgs] == ["error", "error"]
    assert world.bookings()["105"] == "cy"
    assert not (world.files / "t.txt").exists() and not (world.files / "u.txt").exists()


def test_a_synchronous_graph_transaction_spans_an_async_run_too(world: World) -> None:
    node = AtomixToolNode(world.tools, world.rt, boundary="graph")
    graph = agent_graph(script(*TWO_TURNS), node)
    with node.transaction() as run:
        result = asyncio.run(graph.ainvoke({"messages": []}))
        assert world.bookings() == {"101": "zoe", "102": "ann"}
        run.abort()
    msgs = tool_messages(result)
    assert [(m.tool_call_id, m.status) for m in msgs] == [
        ("g1", "success"), ("g2", "success"), ("g3", "success"), ("g4", "success")
    ]
    assert {atomix_meta(m)["txid"] for m in msgs} == {run.txid}
    assert world.bookings() == {"101": "zoe"} and world.mail() == []
    assert not list(world.files.iterdir())

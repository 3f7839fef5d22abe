"""AtomixToolNode with boundary "turn" (each node run is a transaction of its own), sync and
async, on real LangGraph graphs: the tools it offers, what a turn commits, what a failed call
undoes, and ToolNode's other inputs and prebuilt agents. The world is in langgraph_world.py.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Annotated

import pytest
from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool as langchain_tool
from langgraph.graph import START, MessagesState, StateGraph, add_messages
from langgraph.prebuilt import create_react_agent
from langgraph.types import Send
from langgraph_world import (
    FAILING_TURN,
    HELLO,
    PARALLEL_TURN,
    World,
    agent_graph,
    atomix_meta,
    calls,
    make_world,
    script,
    tool_messages,
)

from atomix import AtomixError, Runtime
from atomix.integrations.langgraph import AtomixToolNode, ToolNode
from atomix.schemas import tool_schema


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


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


"""AtomixToolNode with boundary "graph" (one transaction per graph run, opened and settled by
the caller's block), sync and async, and interrupts undoing a turn under either boundary. The
world is in langgraph_world.py.
"""

from __future__ import annotations

import asyncio
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt
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

from atomix import AtomixError, TransactionAborted
from atomix.integrations.langgraph import AtomixToolNode, Boundary


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


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

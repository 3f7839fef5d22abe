"""atomix.integrations.openai, one turn at a time (boundary "turn", sync and async): what a
turn commits, what a failed or invalid call undoes, and what each tool message tells the
model. The world (real files, real SDK objects) is in openai_world.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from openai_world import World, args, completion, contents, make_world

from atomix import AtomixError, Call, Runtime
from atomix.integrations.openai import OpenAITools


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


# --------------------------------------------------------------------------- turn


def test_a_turn_commits_and_answers_each_call_in_order(world: World) -> None:
    runner = OpenAITools(world.rt)
    messages = runner.run(
        completion(
            ("write_note", args(name="a.txt", text="hello")),
            ("send_mail", args(to="bob@example.com", body="hi")),
            ("reserve", args(item="room-1", count=2)),
        )
    )
    assert [m["tool_call_id"] for m in messages] == ["call_0", "call_1", "call_2"]
    assert all(m["role"] == "tool" for m in messages)
    assert json.loads(messages[0]["content"])["status"] == "committed"
    assert "released" in json.loads(messages[1]["content"])["note"]
    assert json.loads(messages[2]["content"]) == {"reserved": "room-1", "count": 2}
    assert world.notes() == {"a.txt": "hello"}
    assert world.outbox == [{"to": "bob@example.com", "body": "hi"}]
    assert world.reservations() == ["room-1"]
    assert runner.last_settlement is not None and runner.last_settlement.committed
    # A later turn reads what the earlier one committed.
    assert contents(runner.run(completion(("read_note", args(name="a.txt"))))) == ['"hello"']


def test_a_failing_call_aborts_the_whole_turn(world: World) -> None:
    runner = OpenAITools(world.rt)
    messages = runner.run(
        completion(
            ("write_note", args(name="b.txt", text="draft")),
            ("send_mail", args(to="bob@example.com", body="never sent")),
            ("reserve", args(item="room-2")),
            ("explode", args(reason="disk full")),
            ("reserve", args(item="room-3")),
        )
    )
    texts = contents(messages)
    assert all(t.startswith("Error:") for t in texts)
    assert "explode failed: RuntimeError: exploded: disk full" in texts[3]
    assert "undone: reserve ran, but call call_3 (explode) of this turn failed" in texts[2]
    assert texts[4].startswith("Error: not run:")
    assert "No call of this turn took effect" in texts[0]
    # The staged note never landed, the gated send never left, the reservation was
    # compensated, and nothing after the failing call ran.
    assert world.notes() == {}
    assert world.outbox == []
    assert world.reservations() == []
    assert world.ran == ["reserve", "explode"]
    settlement = runner.last_settlement
    assert settlement is not None and not settlement.committed
    assert settlement.abort_source == "tool_failure"
    assert len(settlement.compensated) == 1 and len(settlement.dropped) == 2


def test_invalid_calls_become_messages_and_nothing_runs(world: World) -> None:
    runner = OpenAITools(world.rt)
    messages = runner.run(
        completion(
            ("reserve", args(item="room-4")),
            ("write_note", '{"name": "c.txt", "text": '),
            ("no_such_tool", "{}"),
            ("reserve", args(item="room-5", count="many")),
            ("write_note", args(name="c.txt")),
            ("send_mail", "[1, 2]"),
        )
    )
    texts = contents(messages)
    assert texts[0].startswith("Error: not run: call call_1 (write_note) of this turn failed")
    assert texts[1].startswith("Error: the arguments of write_note are not valid JSON")
    assert texts[2].startswith("Error: there is no tool named 'no_such_tool'; the tools are: ")
    assert "write_note, read_note, send_mail, reserve, explode" in texts[2]
    assert texts[3].startswith("Error: wrong arguments for reserve: argument 'count': ")
    assert "missing required argument(s) 'text'" in texts[4]
    assert "must be a JSON object, not list" in texts[5]
    assert "none of them was run" in texts[1]
    assert world.ran == []
    assert world.reservations() == []


def test_a_scope_the_tool_refuses_is_a_message(world: World) -> None:
    runner = OpenAITools(world.rt)
    (text,) = contents(runner.run(completion(("write_note", args(name="../escape", text="x")))))
    assert text.startswith("Error: write_note refused these arguments: ")
    assert "outside its root" in text
    assert not (world.root / "escape").exists()


def test_on_error_commit_keeps_the_calls_that_succeeded(world: World) -> None:
    runner = OpenAITools(world.rt, on_error="commit")
    messages = runner.run(
        completion(
            ("reserve", args(item="room-6")),
            ("explode", args(reason="once")),
            ("send_mail", args(to="ann@example.com", body="sent")),
            ("no_such_tool", "{}"),
        )
    )
    texts = contents(messages)
    assert json.loads(texts[0]) == {"reserved": "room-6", "count": 1}
    assert texts[1] == "Error: explode failed: RuntimeError: exploded: once"
    assert json.loads(texts[2])["status"] == "committed"
    assert texts[3].startswith("Error: there is no tool named")
    assert world.reservations() == ["room-6"]
    assert world.outbox == [{"to": "ann@example.com", "body": "sent"}]
    assert runner.last_settlement is not None and runner.last_settlement.committed


def test_only_the_offered_tools_are_offered_and_callable(world: World) -> None:
    runner = OpenAITools(world.rt, [world.tools["read_note"], world.tools["write_note"]])
    assert [t["function"]["name"] for t in runner.tools] == ["read_note", "write_note"]
    assert runner.tools[1]["function"]["parameters"]["properties"]["name"] == {
        "type": "string",
        "description": "The note's file name.",
    }
    (text,) = contents(runner.run(completion(("send_mail", args(to="x@y", body="b")))))
    assert text.startswith("Error: there is no tool named 'send_mail'; the tools are: read_note, write_note")
    assert world.outbox == []
    # By default every tool of the runtime is offered.
    assert [t["function"]["name"] for t in OpenAITools(world.rt).tools] == list(world.tools)


def test_tools_of_another_runtime_are_refused(world: World) -> None:
    other = Runtime()
    stranger = other.tool(lambda x: x, name="stranger")
    with pytest.raises(ValueError, match="'stranger' is not a tool of this runtime"):
        OpenAITools(world.rt, [stranger])
    with pytest.raises(ValueError, match="boundary='later'"):
        OpenAITools(world.rt, boundary="later")  # type: ignore[arg-type]


def test_plain_dicts_messages_and_single_calls_are_accepted(world: World) -> None:
    runner = OpenAITools(world.rt)
    call = {"id": "x1", "type": "function", "function": {"name": "reserve", "arguments": args(item="d1")}}
    assert contents(runner.run([call]))[0] == '{"reserved": "d1", "count": 1}'
    raw = completion(("reserve", args(item="d2"))).model_dump()
    assert runner.run(raw)[0]["tool_call_id"] == "call_0"  # a whole ChatCompletion as a dict
    message = completion(("reserve", args(item="d3"))).choices[0].message
    assert runner.run(message)[0]["tool_call_id"] == "call_0"  # the SDK message
    assert runner.run(message.tool_calls[0])[0]["tool_call_id"] == "call_0"  # one SDK call
    no_calls = {"role": "assistant", "content": "done", "tool_calls": None}
    assert runner.run(no_calls) == []
    assert world.reservations() == ["d1", "d2", "d3"]
    with pytest.raises(ValueError, match="tool call #0: it has no id"):
        runner.run([{"type": "function", "function": {"name": "reserve", "arguments": "{}"}}])
    with pytest.raises(TypeError, match="got a string"):
        runner.run("reserve")


def test_custom_tool_calls_are_refused_by_message(world: World) -> None:
    runner = OpenAITools(world.rt, on_error="commit")
    message = {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "x", "input": "y"}}],
    }
    assert contents(runner.run(message)) == [
        "Error: only function tool calls are supported, not type 'custom'"
    ]


def test_turn_refuses_to_run_inside_an_open_transaction(world: World) -> None:
    runner = OpenAITools(world.rt)
    with world.rt.transaction(), pytest.raises(AtomixError, match="boundary='explicit'"):
        runner.run(completion(("reserve", args(item="r"))))
    assert world.reservations() == []


# --------------------------------------------------------------------------- async


@pytest.fixture
def async_world(world: World) -> World:
    held = world.root / "reservations"

    async def cancel(call: Call) -> None:
        (held / call.args["item"]).unlink()

    @world.rt.tool(effect="reversible", writes=f"fs:{held}/{{item}}", compensate=cancel)
    async def areserve(item: str) -> str:
        """Reserve, asynchronously."""
        await asyncio.sleep(0)
        world.ran.append("areserve")
        (held / item).write_text("async")
        return f"reserved {item}"

    world.tools["areserve"] = areserve
    return world


def test_arun_commits_a_turn_with_async_and_sync_tools(async_world: World) -> None:
    runner = OpenAITools(async_world.rt)
    messages = asyncio.run(
        runner.arun(
            completion(
                ("areserve", args(item="a1")),
                ("reserve", args(item="a2")),
                ("send_mail", args(to="e@example.com", body="async")),
            )
        )
    )
    assert contents(messages)[0] == '"reserved a1"'
    assert async_world.reservations() == ["a1", "a2"]
    assert async_world.outbox == [{"to": "e@example.com", "body": "async"}]


def test_arun_aborts_a_failing_turn(async_world: World) -> None:
    runner = OpenAITools(async_world.rt)
    messages = asyncio.run(
        runner.arun(
            completion(
                ("areserve", args(item="a3")),
                ("send_mail", args(to="e@example.com", body="never")),
                ("explode", args(reason="async")),
            )
        )
    )
    assert all(t.startswith("Error:") for t in contents(messages))
    assert async_world.reservations() == [] and async_world.outbox == []
    assert async_world.ran == ["areserve", "explode"]


def test_async_task_and_explicit(async_world: World) -> None:
    rt = async_world.rt

    async def main() -> None:
        task = OpenAITools(rt, boundary="task")
        async with task.atask():
            await task.arun(completion(("areserve", args(item="a4"))))
            await task.arun(completion(("send_mail", args(to="f@example.com", body="t"))))
            assert async_world.outbox == []
        explicit = OpenAITools(rt, boundary="explicit")
        async with rt.atransaction() as tx:
            await explicit.arun(completion(("send_mail", args(to="g@example.com", body="x"))))
            await tx.abort()
        with pytest.raises(AtomixError, match="async with rt.atransaction"):
            await explicit.arun(completion(("areserve", args(item="a5"))))

    asyncio.run(main())
    assert async_world.reservations() == ["a4"]
    assert async_world.outbox == [{"to": "f@example.com", "body": "t"}]


def test_sync_run_refuses_async_tools_before_running_any(async_world: World) -> None:
    runner = OpenAITools(async_world.rt)
    with pytest.raises(AtomixError, match=r"'areserve' is async.*arun"):
        runner.run(completion(("reserve", args(item="s1")), ("areserve", args(item="s2"))))
    assert async_world.ran == []


def test_the_module_imports_without_the_openai_package() -> None:
    blocked = (
        "import sys; sys.modules['openai'] = None\n"
        "from atomix.integrations.openai import OpenAITools\n"
        "from atomix import Runtime\n"
        "rt = Runtime()\n"
        "rt.tool(lambda x: x, name='echo')\n"
        "call = {'id': 'c', 'type': 'function', 'function': {'name': 'echo', 'arguments': '{\"x\": 1}'}}\n"
        "print(OpenAITools(rt).run([call])[0]['content'])\n"
    )
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"

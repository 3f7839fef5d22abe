"""atomix.integrations.openai: real openai SDK objects (built offline with model_validate),
real rt.tool tools writing files under tmp_path, and an append-only outbox file that a gated
send appends to only when it is released."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from atomix import AtomixError, Call, Runtime
from atomix.integrations.openai import OpenAITools

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


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
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
    yield w


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


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


# --------------------------------------------------------------------------- task


def test_a_task_spans_turns_and_commits_at_the_end(world: World) -> None:
    runner = OpenAITools(world.rt, boundary="task")
    with runner.task():
        first = runner.run(completion(("write_note", args(name="t1", text="one"))))
        second = runner.run(
            completion(
                ("reserve", args(item="t-room")),
                ("send_mail", args(to="bob@example.com", body="task done")),
            )
        )
        # Nothing has settled yet: the note is staged, the mail queued.
        assert world.notes() == {} and world.outbox == []
    assert json.loads(first[0]["content"])["status"] == "staged"
    assert json.loads(second[1]["content"])["status"] == "queued"
    assert world.notes() == {"t1": "one"}
    assert world.outbox == [{"to": "bob@example.com", "body": "task done"}]
    assert runner.last_settlement is not None and runner.last_settlement.committed


def test_aborting_a_task_drops_every_turn(world: World) -> None:
    runner = OpenAITools(world.rt, boundary="task")
    runner.run(completion(("write_note", args(name="t2", text="x")), ("reserve", args(item="t-room"))))
    runner.run(completion(("send_mail", args(to="bob@example.com", body="never"))))
    assert world.reservations() == ["t-room"]  # reversible: it ran at once
    settlement = runner.abort()
    assert settlement is not None and settlement.abort_source == "pre_commit_veto"
    assert world.notes() == {} and world.outbox == [] and world.reservations() == []
    assert runner.abort() is None and runner.commit() is None  # nothing open any more
    # The next run begins a new task.
    runner.run(completion(("write_note", args(name="t3", text="y"))))
    runner.commit()
    assert world.notes() == {"t3": "y"}


def test_an_exception_in_a_task_block_aborts_it(world: World) -> None:
    runner = OpenAITools(world.rt, boundary="task")
    with pytest.raises(KeyError), runner.task():
        runner.run(completion(("send_mail", args(to="bob@example.com", body="never"))))
        raise KeyError("the agent crashed")
    assert world.outbox == []
    assert runner.last_settlement is not None and runner.last_settlement.abort_source == "tool_failure"


def test_a_failing_turn_in_a_task_rolls_back_that_turn_only(world: World) -> None:
    runner = OpenAITools(world.rt, boundary="task")
    with runner.task():
        runner.run(completion(("write_note", args(name="keep", text="1"))))
        texts = contents(
            runner.run(
                completion(
                    ("write_note", args(name="drop", text="2")),
                    ("reserve", args(item="task-room")),
                    ("explode", args(reason="turn two")),
                )
            )
        )
        assert world.reservations() == []  # compensated at the rollback, not at the end
    assert texts[0].startswith("Error: undone: write_note ran, but call call_2 (explode)")
    assert "the turn was rolled back, and the transaction's earlier work stands" in texts[1]
    assert world.notes() == {"keep": "1"}


def test_task_settlement_needs_the_task_boundary(world: World) -> None:
    runner = OpenAITools(world.rt)
    with pytest.raises(AtomixError, match="boundary='task'"), runner.task():
        pass
    with pytest.raises(AtomixError, match="settles a task"):
        runner.commit()


# --------------------------------------------------------------------------- explicit


def test_explicit_runs_in_the_callers_transaction(world: World) -> None:
    runner = OpenAITools(world.rt, boundary="explicit")
    with pytest.raises(AtomixError, match=r"none of this runtime is open here.*with rt.transaction"):
        runner.run(completion(("reserve", args(item="e0"))))
    with world.rt.transaction() as tx:
        texts = contents(
            runner.run(
                completion(
                    ("write_note", args(name="e1", text="x")),
                    ("send_mail", args(to="c@example.com", body="explicit")),
                )
            )
        )
        assert json.loads(texts[1]) == {
            "status": "queued",
            "note": "queued: it happens only when the transaction commits, never if it aborts",
        }
        assert world.outbox == []
        # A failing turn is rolled back; the transaction stays open for the caller.
        failed = contents(runner.run(completion(("send_mail", args(to="d@example.com", body="no")), ("explode", args(reason="x")))))
        assert all(t.startswith("Error:") for t in failed)
        assert tx.settlement is None
    assert world.notes() == {"e1": "x"}
    assert world.outbox == [{"to": "c@example.com", "body": "explicit"}]


def test_explicit_abort_by_the_caller_drops_the_send(world: World) -> None:
    runner = OpenAITools(world.rt, boundary="explicit")
    with world.rt.transaction() as tx:
        runner.run(completion(("send_mail", args(to="c@example.com", body="vetoed"))))
        tx.abort()
    assert world.outbox == []


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



def interference(world: World, times: int) -> Any:
    """A tool that, the first `times` times it runs, has another agent commit a new version
    of the note "shared", in its own transaction (a later epoch), before the turn reads it."""
    rt = world.rt
    write_note = world.tools["write_note"]
    left = [times]

    @rt.tool
    def interfere() -> str:
        """Let another agent act."""
        world.ran.append("interfere")
        if left[0] > 0:
            left[0] -= 1

            def other_agent() -> None:
                with rt.transaction():
                    write_note(name="shared", text=f"newer {left[0]}")

            worker = threading.Thread(target=other_agent)
            worker.start()
            worker.join()
        return "ok"

    return interfere


def test_a_turn_that_reads_stale_state_is_retried_whole(world: World) -> None:
    interference(world, times=1)
    runner = OpenAITools(world.rt)
    runner.run(completion(("write_note", args(name="shared", text="old"))))
    world.ran.clear()
    messages = runner.run(completion(("interfere", "{}"), ("read_note", args(name="shared"))))
    # The first attempt came to read the note after a later epoch had committed it: stale
    # (caught as the read registered, before the reader ran), so the whole turn ran again
    # with a fresh epoch and read the newer note.
    assert contents(messages) == ['"ok"', '"newer 0"']
    assert world.ran == ["interfere", "write_note", "interfere", "read_note"]
    assert runner.last_settlement is not None and runner.last_settlement.committed


def test_a_stale_turn_out_of_retries_says_so(world: World) -> None:
    interference(world, times=2)
    runner = OpenAITools(world.rt, retries=1)
    runner.run(completion(("write_note", args(name="shared", text="old"))))
    texts = contents(
        runner.run(
            completion(
                ("reserve", args(item="stale-room")),
                ("interfere", "{}"),
                ("read_note", args(name="shared")),
                ("send_mail", args(to="h@example.com", body="never")),
            )
        )
    )
    assert all(t.startswith("Error:") for t in texts)
    assert "the transaction was aborted: stale_read" in texts[0]
    assert "Read the state again before you retry" in texts[3]
    assert world.reservations() == [] and world.outbox == []
    assert runner.last_settlement is not None and runner.last_settlement.abort_source == "stale_read"


def test_a_compensation_that_fails_is_reported_as_residue(world: World) -> None:
    rt = world.rt

    def cannot_cancel(call: Call) -> None:
        raise ConnectionError("the booking service is down")

    @rt.tool(effect="reversible", writes="booking:{item}", compensate=cannot_cancel)
    def book(item: str) -> str:
        """Book something that cannot always be cancelled."""
        return f"booked {item}"

    runner = OpenAITools(rt)
    texts = contents(runner.run(completion(("book", args(item="b1")), ("explode", args(reason="r")))))
    assert all(t.startswith("Error:") for t in texts)
    settlement = runner.last_settlement
    assert settlement is not None and len(settlement.residue) == 1
    assert "Warning: 1 effect(s) could not be undone and need a human" in texts[0]
    assert settlement.residue[0] in texts[1]


def test_a_commit_whose_effect_does_not_land_says_which(tmp_path: Path) -> None:
    rt = Runtime(apply_attempts=1)

    @rt.tool(effect="bufferable", writes=f"fs:{tmp_path}/{{name}}")
    def write(name: str, text: str) -> None:
        """Write a file (its directory may not exist)."""
        (tmp_path / name).write_text(text)

    runner = OpenAITools(rt)
    texts = contents(
        runner.run(
            completion(
                ("write", args(name="missing-dir/x.txt", text="lost")),
                ("write", args(name="y.txt", text="kept")),
            )
        )
    )
    assert texts[0].startswith("Error: the transaction committed, but this staged effect did not")
    assert "FileNotFoundError" in texts[0]
    assert json.loads(texts[1])["status"] == "committed"
    assert (tmp_path / "y.txt").read_text() == "kept"
    assert runner.last_settlement is not None and len(runner.last_settlement.failed_applies) == 1


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

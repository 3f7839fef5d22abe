"""The LLM agent (harness/agents/llm.py) and its completion cache, against a scripted
OpenAI-compatible server: a real HTTP server on 127.0.0.1 in a thread, answering
/v1/chat/completions with tool calls that replay each task's gold actions. The model is not
what is under test here: the loop is (calls reach the tools through the modes, faults and
errors go back to the model, the budget, the record, the cache)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import harness.workloads
from cli import app
from harness.agents.llm_cache import CompletionCache, request_key
from harness.agents.policies import AgentConfig
from harness.agents.task import AgentPolicy, Task
from harness.errors import ConfigError
from harness.experiment.runner import read_records
from harness.experiment.trial import TrialSpec, run_trial
from harness.registry import Entry
from harness.workloads import WORKLOADS
from harness.workloads.base import Scenario, WorkloadParams
from harness.workloads.retail.data import load_retail
from harness.workloads.retail.substrate import RETAIL_TOOLS
from harness.workloads.retail.tasks import gold_actions
from harness.workloads.retail.workload import _final, _setup, _ticket, _tool_schemas

runner = CliRunner()

Mangle = Callable[[list[dict[str, Any]], list[dict[str, Any]]], list[dict[str, Any]]]


class ScriptedModel:
    """Answers a conversation with the next gold action of the task its ticket names.

    The state is read from the conversation alone (so every mode and every retry of the
    same conversation gets the same answer): each successful tool result moves to the next
    action; a failed one is retried, up to 3 times in a row, then skipped. `mangle` may
    rewrite the tool calls of a turn (bad JSON, unknown tools)."""

    def __init__(self, mangle: Mangle | None = None,
                 actions: dict[str, list[dict[str, Any]]] | None = None) -> None:
        if actions is None:
            data = load_retail(None)
            actions = {_ticket(t): gold_actions(t) for t in data.tasks}
        self.actions = actions
        self.mangle = mangle

    def reply(self, messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        actions = self.actions[messages[1]["content"]]
        index, errors = 0, 0
        for m in messages[2:]:
            if m["role"] == "user":  # agent.tool_result_role: user
                m = {"content": m["content"].split("\n", 1)[1]}
            elif m["role"] != "tool":
                continue
            if m["content"].startswith("Error:"):
                errors += 1
                if errors == 3:
                    index, errors = index + 1, 0
            else:
                index, errors = index + 1, 0
        turn = sum(m["role"] == "assistant" for m in messages)
        if index >= len(actions):
            return "Done: the ticket is resolved.", []
        action = actions[index]
        calls = [{"id": f"call_{turn}", "type": "function",
                  "function": {"name": action["name"], "arguments": json.dumps(action["arguments"])}}]
        if self.mangle is not None:
            calls = self.mangle(messages, calls)
        return None, calls


class ScriptedServer:
    """An OpenAI-compatible HTTP server on a free port of 127.0.0.1, answering from a
    ScriptedModel; it keeps every request it got (body and Authorization header)."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                blob = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                outer.auth.append(self.headers.get("Authorization"))
                content, calls = outer.model.reply(body["messages"])
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                prompt = len(json.dumps(body["messages"])) // 4
                self._send(200, {
                    "id": f"chatcmpl-{len(outer.requests)}", "object": "chat.completion",
                    "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if calls else "stop"}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": 9,
                              "total_tokens": prompt + 9},
                })

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer(ScriptedModel())
    yield srv
    srv.stop()


def config(url: str, cache: Path, *, rate: float = 0.0, modes: list[str] | None = None,
           trials: int = 2, **agent: Any) -> dict[str, Any]:
    return {
        "name": "llm_test",
        "workload": "tau_retail",
        # Tasks 0 and 1 of this sample have writes, and gold actions that all succeed.
        "params": {"split": "test", "sample": 2, "task_seed": 1},
        "seed": 7,
        "trials": trials,
        "modes": modes or ["tx-full", "no-tx"],
        "faults": {"classes": "mixed", "rate": rate},
        "agent": {"kind": "llm", "model": "scripted", "base_url": url, "max_steps": 30,
                  "cache_dir": str(cache), **agent},
        "report": {"tables": [{"name": "clean", "metric": "clean"}]},
    }


def run(tmp_path: Path, data: dict[str, Any], out: str) -> tuple[Any, list[dict[str, Any]]]:
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = runner.invoke(app, ["run", str(path), "--jobs", "1", "--quiet", "--out", str(tmp_path / out)])
    files = sorted((tmp_path / out).glob("*/*/trials.jsonl"))
    return result, read_records(files[0]) if files else []


def conversation(record: dict[str, Any], attempt: int = 0) -> list[dict[str, Any]]:
    return record["agents"][0]["llm"]["conversations"][attempt]


def without_timings(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["key"]: {k: v for k, v in r.items() if k != "timings"} for r in records}


# --------------------------------------------------------------------------- the loop


def test_tool_calls_reach_the_tools_and_the_record_keeps_the_conversation(
    tmp_path: Path, server: ScriptedServer
) -> None:
    result, records = run(tmp_path, config(server.url, tmp_path / "cache"), "out")
    assert result.exit_code == 0, result.output
    assert len(records) == 4
    data = load_retail(None)
    for record in records:
        task = next(t for t in data.tasks if f"task{t['id']}" == record["agents"][0]["task"])
        gold = gold_actions(task)
        agent = record["agents"][0]
        # The gold actions, played by the model through the mode, reached the goal DB.
        assert record["metrics"]["goal"] and record["metrics"]["clean"], record["metrics"]
        assert agent["committed"] and agent["steps"] == len(gold)
        assert [c["name"] for c in agent["llm"]["tool_calls"]] == [a["name"] for a in gold]
        assert all(c["outcome"] == "ok" for c in agent["llm"]["tool_calls"])
        messages = conversation(record)
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert messages[1]["content"] == _ticket(task)
        tool_results = [m for m in messages if m["role"] == "tool"]
        assert len(tool_results) == len(gold) and not any(m["content"].startswith("Error") for m in tool_results)
        assert messages[-1] == {"role": "assistant", "content": "Done: the ticket is resolved."}
        usage = agent["llm"]["usage"]
        assert usage["requests"] == len(gold) + 1 == record["metrics"]["llm_requests"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] == 9 * usage["requests"]
        assert agent["llm"]["stop"] == "answered"
        timing = record["timings"]["llm"][0]
        assert len(timing["requests"]) == usage["requests"]
    # The second mode's conversation is the first's, so the cache answered all of it.
    by_mode = {(r["mode"], r["trial"]): r for r in records}
    for trial in (0, 1):
        assert not any(q["cached"] for q in by_mode[("tx-full", trial)]["timings"]["llm"][0]["requests"])
        assert all(q["cached"] and q["latency_s"] == 0 for q in by_mode[("no-tx", trial)]["timings"]["llm"][0]["requests"])
    assert len(server.requests) == sum(r["agents"][0]["llm"]["usage"]["requests"] for r in records) // 2
    # What the model was offered: every tau2 retail tool, with the schema of atomix.schemas.
    tools = {t["function"]["name"]: t for t in server.requests[0]["tools"]}
    assert len(tools) == 16 and "notify_customer" not in tools
    params = tools["cancel_pending_order"]["function"]["parameters"]
    assert params["required"] == ["order_id", "reason"] and "db" not in params["properties"]
    assert "'#W0000000'" in params["properties"]["order_id"]["description"]
    assert server.requests[0]["temperature"] == 0 and server.requests[0]["tool_choice"] == "auto"
    assert server.auth[0] == "Bearer sk-no-key"


def test_injected_faults_reach_the_model_as_errors(tmp_path: Path, server: ScriptedServer) -> None:
    data = config(server.url, tmp_path / "cache", rate=0.5, modes=["tx-full", "saga", "no-tx"])
    result, records = run(tmp_path, data, "out")
    assert result.exit_code == 0, result.output
    assert sum(r["exercised"]["faults_total"] for r in records) > 0
    failed = [c for r in records for c in r["agents"][0]["llm"]["tool_calls"] if c["outcome"] in ("error", "timeout")]
    assert failed
    errors = [m["content"] for r in records for m in conversation(r) if m["role"] == "tool" and m["content"].startswith("Error:")]
    # As a caller sees them: an error or a time-out of the call, never the fault's class.
    assert any("failed" in e or "timed out" in e for e in errors)
    assert not any(f"F{n}" in e for e in errors for n in range(1, 6))
    # The model saw them: a request after a failed call carries the error as a tool message.
    sent = [m["content"] for q in server.requests for m in q["messages"] if m["role"] == "tool"]
    assert any(s.startswith("Error: call") for s in sent)


def test_bad_json_and_unknown_tools_come_back_as_tool_errors(tmp_path: Path) -> None:
    def mangle(messages: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any(m["role"] == "assistant" for m in messages):
            return calls
        turn = [{"id": "bad", "type": "function", "function": {"name": "get_order_details", "arguments": "{not json"}},
                {"id": "list", "type": "function", "function": {"name": "get_user_details", "arguments": "[1, 2]"}},
                {"id": "unknown", "type": "function", "function": {"name": "drop_database", "arguments": "{}"}}]
        return turn

    srv = ScriptedServer(ScriptedModel(mangle))
    try:
        result, records = run(tmp_path, config(srv.url, tmp_path / "cache", modes=["tx-full"], trials=1), "out")
    finally:
        srv.stop()
    assert result.exit_code == 0, result.output
    agent = records[0]["agents"][0]
    outcomes = [c["outcome"] for c in agent["llm"]["tool_calls"][:3]]
    assert outcomes == ["bad_arguments", "bad_arguments", "unknown_tool"]
    answers = [m["content"] for m in conversation(records[0])[3:6]]
    assert answers[0].startswith("Error: the arguments are not valid JSON")
    assert answers[1] == "Error: the arguments must be a JSON object, got list"
    assert answers[2].startswith("Error: unknown tool 'drop_database'; the tools are: calculate, ")
    # Counted against the budget as tau2 counts steps, and the model saw them next turn.
    assert agent["steps"] == len(agent["llm"]["tool_calls"])
    assert [m["tool_call_id"] for m in srv.requests[1]["messages"][3:6]] == ["bad", "list", "unknown"]
    # The errors were only messages: the task then went on and reached its goal.
    assert records[0]["metrics"]["goal"] and agent["committed"]


def test_an_exhausted_budget_ends_the_task_unfinished(tmp_path: Path, server: ScriptedServer) -> None:
    data = config(server.url, tmp_path / "cache", modes=["tx-full"], trials=1, max_steps=2)
    result, records = run(tmp_path, data, "out")
    assert result.exit_code == 0, result.output
    record = records[0]
    agent = record["agents"][0]
    assert agent["llm"]["stop"] == "out_of_budget" and agent["steps"] == 2
    assert not agent["committed"] and agent["aborts"] == ["tool_failure"]
    assert "step budget of 2 tool calls exhausted" in agent["failure"]
    assert record["metrics"]["budget_exhausted"] == 1 and not record["metrics"]["goal"]
    assert len([m for m in conversation(record) if m["role"] == "tool"]) == 2


def test_a_rerun_with_the_server_stopped_is_answered_by_the_cache(tmp_path: Path) -> None:
    srv = ScriptedServer(ScriptedModel())
    data = config(srv.url, tmp_path / "cache", rate=0.3)
    try:
        first, records = run(tmp_path, data, "first")
    finally:
        srv.stop()
    assert first.exit_code == 0, first.output
    asked = len(srv.requests)
    assert asked > 0
    again, replayed = run(tmp_path, data, "again")
    assert again.exit_code == 0, again.output
    assert len(srv.requests) == asked  # no second call
    assert without_timings(replayed) == without_timings(records)
    for record in replayed:
        assert all(q["cached"] and q["latency_s"] == 0 for t in record["timings"]["llm"] for q in t["requests"])
    # `atomix show` replays a trial the same way, from the cache.
    run_dir = next((tmp_path / "again").glob("*/*"))
    shown = runner.invoke(app, ["show", str(run_dir), "1"])
    assert shown.exit_code == 0, shown.output
    assert "replay: identical to the stored record" in shown.output
    assert "     call find_user_id_by_name_zip(" in shown.output and "stopped: answered" in shown.output


def test_an_unreachable_server_stops_the_run_with_one_clear_line(tmp_path: Path) -> None:
    srv = ScriptedServer(ScriptedModel())
    srv.stop()  # its port is now closed
    result, _ = run(tmp_path, config(srv.url, tmp_path / "cache", trials=1, modes=["no-tx"]), "out")
    assert result.exit_code == 2
    assert f"agent: no completion from {srv.url} (APIConnectionError" in result.output
    assert "Traceback" not in result.output


def test_a_cache_directory_that_cannot_be_written_stops_the_run(tmp_path: Path, server: ScriptedServer) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory", encoding="utf-8")
    result, _ = run(tmp_path, config(server.url, blocked, trials=1, modes=["no-tx"]), "out")
    assert result.exit_code == 2
    assert "agent.cache_dir: " in result.output and "cannot write to the completion cache" in result.output
    assert "Traceback" not in result.output


def test_the_api_key_comes_from_the_named_variable(tmp_path: Path, server: ScriptedServer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATOMIX_TEST_LLM_KEY", "sk-test-123")
    data = config(server.url, tmp_path / "cache", trials=1, modes=["no-tx"], api_key_env="ATOMIX_TEST_LLM_KEY")
    result, _ = run(tmp_path, data, "out")
    assert result.exit_code == 0, result.output
    assert set(server.auth) == {"Bearer sk-test-123"}
    # A variable that is not set: a dummy key (what a local server takes), and a note.
    monkeypatch.delenv("ATOMIX_TEST_LLM_UNSET", raising=False)
    data = config(server.url, tmp_path / "cache2", trials=1, modes=["no-tx"], api_key_env="ATOMIX_TEST_LLM_UNSET")
    result, _ = run(tmp_path, data, "out2")
    assert result.exit_code == 0, result.output
    assert server.auth[-1] == "Bearer sk-no-key"
    assert "agent.api_key_env: $ATOMIX_TEST_LLM_UNSET is not set; sending a dummy key" in result.output


def test_tool_results_may_be_sent_as_user_messages(tmp_path: Path, server: ScriptedServer) -> None:
    data = config(server.url, tmp_path / "cache", modes=["tx-full"], trials=1, tool_result_role="user")
    result, records = run(tmp_path, data, "out")
    assert result.exit_code == 0, result.output
    last = server.requests[-1]["messages"]
    assert not any(m["role"] == "tool" for m in last)
    assert last[3]["role"] == "user" and last[3]["content"].startswith("Result of find_user_id_by_name_zip:\n")
    # The record keeps the conversation in the OpenAI form all the same.
    kept = conversation(records[0])
    assert kept[3]["role"] == "tool" and kept[3]["content"] == last[3]["content"].split("\n", 1)[1]
    assert records[0]["metrics"]["goal"]


# A pending order two agents both change: one of them has read it first.
ORDER = next(o for o, rec in load_retail(None).db["orders"].items() if rec["status"] == "pending")
ADDRESS = {"address1": "1 Main St", "city": "Springfield", "state": "IL", "country": "USA", "zip": "62701"}


class PairWorkload:
    """Two tasks with tickets on one retail order: `slow` reads the order and its user, then
    rewrites the order's address; `fast` rewrites it at once and is done first."""

    name = "llm_pair"
    description = "two LLM agents rewrite one order's address"
    tools = RETAIL_TOOLS

    class Params(WorkloadParams):
        pass

    def scenario(self, rng: Any, trial: int, params: Any) -> Scenario:
        data = load_retail(None)
        return Scenario(
            tasks=[Task("slow", (), ticket="ticket slow"), Task("fast", (), ticket="ticket fast")],
            setup=_setup(data),
            policy=AgentPolicy(max_attempts=3),
            final=_final,
            tool_schemas=_tool_schemas(),
        )


def pair_actions() -> dict[str, list[dict[str, Any]]]:
    user = load_retail(None).db["orders"][ORDER]["user_id"]
    write = {"name": "modify_pending_order_address", "arguments": {"order_id": ORDER, "address2": "", **ADDRESS}}
    slow = [{"name": "get_order_details", "arguments": {"order_id": ORDER}},
            {"name": "get_user_details", "arguments": {"user_id": user}},
            {**write, "arguments": {**write["arguments"], "address2": "slow"}}]
    return {"ticket slow": slow, "ticket fast": [{**write, "arguments": {**write["arguments"], "address2": "fast"}}]}


def test_a_retryable_abort_starts_a_fresh_conversation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness.workloads, "WORKLOADS", WORKLOADS.extended([Entry("llm_pair", f"{__name__}:PairWorkload")]))
    srv = ScriptedServer(ScriptedModel(actions=pair_actions()))
    agent = AgentConfig(kind="llm", model="scripted", base_url=srv.url, max_steps=10, cache_dir=str(tmp_path))
    try:
        record = run_trial(TrialSpec(config="pair", workload="llm_pair", mode="occ", cell_id="all", cell={},
                                     trial=0, seed=1, latency_ms=5.0, jitter_ms=0.0, agent=agent))
    finally:
        srv.stop()
    slow, fast = record["agents"]
    assert fast["committed"] and fast["attempts"] == 1
    # slow read the order before fast changed it: occ refuses its commit as stale (a
    # retryable abort), and the agent starts over with the ticket in a new conversation.
    assert slow["aborts"] == ["stale_read"] and slow["attempts"] == 2 and slow["committed"]
    first, second = slow["llm"]["conversations"]
    assert second[:2] == first[:2] and [m["role"] for m in second[:2]] == ["system", "user"]
    assert [c["attempt"] for c in slow["llm"]["tool_calls"]] == [1, 1, 1, 2, 2, 2]
    assert slow["steps"] == 6  # the restart paid for the calls it repeated
    # The restart's opening request was the first's (the cache answered it); then the order
    # it read had changed, and so had the conversation.
    timings = next(t for t in record["timings"]["llm"] if t["agent"] == "a0")
    assert [q["cached"] for q in timings["requests"]] == [False] * 4 + [True] + [False] * 3
    assert ORDER in second[3]["content"] and '"address2": "fast"' in second[3]["content"]
    assert record["metrics"]["committed"] == 2


# --------------------------------------------------------------------------- the cache


def test_cache_entries_are_whole_and_the_first_one_wins(tmp_path: Path) -> None:
    cache = CompletionCache(tmp_path / "c")
    request = {"base_url": "http://a/v1", "model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert cache.get(request) is None
    first = {"message": {"role": "assistant", "content": "one"}, "usage": {"prompt_tokens": 1}}
    assert cache.put(request, first) == first
    assert cache.put(request, {"message": {"role": "assistant", "content": "two"}, "usage": {}}) == first
    assert cache.get(request) == first
    files = list((tmp_path / "c").rglob("*"))
    assert [p.name for p in files if p.is_file()] == [f"{request_key(request)}.json"]  # no temp files
    # Another endpoint or model is another request.
    assert cache.get({**request, "base_url": "http://b/v1"}) is None
    assert cache.get({**request, "model": "n"}) is None
    # An entry damaged by hand is not used, and the next answer replaces it.
    path = next(p for p in files if p.is_file())
    path.write_text('{"request": ', encoding="utf-8")
    assert cache.get(request) is None
    second = {"message": {"role": "assistant", "content": "two"}, "usage": {}}
    assert cache.put(request, second) == second and cache.get(request) == second


# --------------------------------------------------------------------------- config errors


def refused(tmp_path: Path, data: dict[str, Any], command: str = "validate") -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    args = [command, str(path)] + (["--jobs", "1", "--out", str(tmp_path / "o")] if command == "run" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"base_url": "ftp://127.0.0.1/v1"}, "agent.base_url: must be an http:// or https:// URL"),
        ({"base_url": "127.0.0.1:8080"}, "agent.base_url: must be an http:// or https:// URL"),
        ({"bogus": 1}, "unknown key agent.bogus"),
        ({"api_key_env": "$OPENAI KEY"}, "agent.api_key_env: must name an environment variable"),
        ({"model": None}, "kind llm needs agent.model"),
        ({"max_steps": None}, "kind llm needs agent.max_steps"),
        ({"temperature": 3}, "agent.temperature: Input should be less than or equal to 2"),
        ({"system_prompt": "long"}, "agent.system_prompt: Input should be 'tau2' or 'short'"),
    ],
)
def test_bad_agent_keys_are_refused(tmp_path: Path, agent: dict[str, Any], message: str) -> None:
    data = config("http://127.0.0.1:9/v1", tmp_path / "cache")
    data["agent"].update(agent)
    assert message in refused(tmp_path, data)


def test_kind_llm_on_a_workload_without_tickets_is_refused(tmp_path: Path) -> None:
    data = config("http://127.0.0.1:9/v1", tmp_path / "cache")
    data["workload"], data["params"] = "tau_contention", {"agents": 2}
    output = refused(tmp_path, data, "run")
    assert "agent.kind llm: workload 'tau_contention' gives its tasks no ticket" in output


def test_kind_llm_without_the_openai_package_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.experiment.config import validate_config

    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` now fails as if absent
    with pytest.raises(ConfigError, match=r"needs the openai package, which is not installed: pip install '\.\[llm\]'"):
        validate_config(config("http://127.0.0.1:9/v1", tmp_path / "cache"), "x.yaml")
    # The other agents do not need it.
    gold = config("http://127.0.0.1:9/v1", tmp_path / "cache")
    gold["agent"] = {"kind": "gold"}
    validate_config(gold, "x.yaml")

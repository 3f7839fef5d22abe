"""The LLM agent's connection to its model: one OpenAI-compatible client per endpoint, each
request run in a helper thread that the caller polls (so Ctrl-C is never held by a socket)
and bounded by `agent.request_timeout_s`, answers cached on disk, and a progress event per
request. `harness.agents.llm` drives the conversation with it."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.agents.llm_cache import CompletionCache, default_cache_dir
from harness.agents.policies import AgentConfig
from harness.errors import RunError

__all__ = [
    "DUMMY_API_KEY",
    "ModelClient",
    "ModelError",
    "Reply",
    "RequestEvent",
    "RequestTimedOut",
    "normalise",
    "set_request_progress",
    "wire_messages",
]


DUMMY_API_KEY = "sk-no-key"  # what a local server gets when no key is configured


#: How often the caller wakes while a request runs: the bound on how long a Ctrl-C waits.
POLL_S = 0.1


#: A waiting request is reported this often (progress lines).
WAITING_EVERY_S = 15.0


#: Retries of a request the server could not take (connection refused, HTTP 429/5xx), within
#: the request's time-out; a time-out itself is never retried.
TRANSIENT_RETRIES = 2


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """One report about a request sent to the model server (never about a cached answer).
    `phase`: `start`, `waiting` (every WAITING_EVERY_S), `done` (with token counts) or
    `timeout`. `step` is the tool calls the task has used so far, of `max_steps`."""

    phase: str
    agent: str
    task: str
    request: int
    step: int
    max_steps: int
    elapsed_s: float = 0.0
    timeout_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def line(self) -> str:
        """The event as one plain line."""
        head = f"{self.agent} {self.task}: request {self.request}, step {self.step}/{self.max_steps}"
        if self.phase == "start":
            return f"{head}: asking the model"
        if self.phase == "waiting":
            return f"{head}: waiting {self.elapsed_s:.0f} s (time-out {self.timeout_s:.0f} s)"
        if self.phase == "timeout":
            return f"{head}: no answer in {self.timeout_s:.0f} s, a failed step"
        tokens = self.prompt_tokens + self.completion_tokens
        rate = tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
        out = self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (f"{head}: {self.prompt_tokens} prompt + {self.completion_tokens} completion "
                f"tokens in {self.elapsed_s:.1f} s ({rate:.0f} tok/s, {out:.1f} written/s)")


_PROGRESS: list[Callable[[RequestEvent], None]] = []


def set_request_progress(callback: Callable[[RequestEvent], None] | None) -> None:
    """Send every RequestEvent of this process (and of workers forked after the call) to
    `callback`; None stops it."""
    _PROGRESS.clear()
    if callback is not None:
        _PROGRESS.append(callback)


def _report(event: RequestEvent) -> None:
    for callback in _PROGRESS:
        try:
            callback(event)
        except Exception:  # noqa: BLE001 - progress must never fail a trial
            pass


class ModelError(Exception):
    """The server refused this conversation (HTTP 400/422, e.g. longer than its context):
    the agent cannot go on with it. Cached like an answer, so a rerun refuses alike."""


class RequestTimedOut(Exception):
    """No answer within agent.request_timeout_s. Cached with that time-out: the same
    request under a time-out as short or shorter times out again without asking."""

    def __init__(self, message: str, *, cached: bool = False) -> None:
        super().__init__(message)
        self.cached = cached


#: Set to "1" (by `atomix run --retry-failed`, for its own trials and their worker processes),
#: a cached time-out is asked again instead of replayed; a refusal (ModelError) still is.
ASK_AGAIN_ENV = "ATOMIX_LLM_ASK_AGAIN_TIMEOUTS"


def _timed_out(entry: Mapping[str, Any]) -> bool:
    """A cache entry an answer may replace: a time-out."""
    return "timed_out_after_s" in entry


@dataclass(frozen=True, slots=True)
class Reply:
    """One completion as the agent uses it: the assistant message (OpenAI format), its token
    usage, and whether it came from the cache with what wall-clock latency."""

    message: dict[str, Any]
    usage: dict[str, int]
    cached: bool
    latency_s: float


_CLIENTS: dict[tuple[str, str, float], Any] = {}  # one SDK client per endpoint per process


_WARNED: set[str] = set()


def _api_key(env: str | None) -> str:
    if env is None:
        return DUMMY_API_KEY
    key = os.environ.get(env)
    if key:
        return key
    if env not in _WARNED:
        _WARNED.add(env)
        print(f"note: agent.api_key_env: ${env} is not set; sending a dummy key "
              "(fine for a local server)", file=sys.stderr)
    return DUMMY_API_KEY


class ModelClient:
    """Chat completions for one agent config, through the on-disk cache.

    Guarantees: a request answered before (by any run using the same cache directory) is
    answered from the cache without contacting the server, with the same reply; a new answer
    is stored before it is used. The `openai` SDK is imported only on a cache miss.
    """

    def __init__(self, config: AgentConfig, cache_dir: str | Path | None = None) -> None:
        assert config.kind == "llm" and config.model and config.base_url
        self.config = config
        root = cache_dir or config.cache_dir or default_cache_dir()
        self.cache = CompletionCache(Path(root).expanduser())

    def request(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The canonical request: what is sent, plus the endpoint (part of the cache key)."""
        c = self.config
        request: dict[str, Any] = {
            "base_url": c.base_url,
            "model": c.model,
            "messages": wire_messages(messages, c.tool_result_role),
            "tools": [dict(t) for t in tools],
            "tool_choice": c.tool_choice,
            "temperature": c.temperature,
        }
        if c.seed is not None:
            request["seed"] = c.seed
        if c.max_tokens is not None:
            request["max_tokens"] = c.max_tokens
        return request

    def complete(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
        report: Callable[..., RequestEvent] | None = None,
    ) -> Reply:
        """The answer to the conversation, from the cache or the server. Raises ModelError
        (refused), RequestTimedOut (no answer in time) or RunError (no server). `report(phase,
        **fields)` makes the RequestEvents of a request sent to the server."""
        request = self.request(messages, tools)
        timeout = self.config.request_timeout_s
        stored = self.cache.get(request)
        if stored is not None and _timed_out(stored) and (
            float(stored["timed_out_after_s"]) < timeout or os.environ.get(ASK_AGAIN_ENV) == "1"
        ):
            # It timed out under a shorter time-out, or a retry of errored trials asks again:
            # this time the server may answer.
            stored = None
        cached, latency = stored is not None, 0.0
        if stored is None:
            start = time.perf_counter()
            try:
                fresh = self._ask_in_time(request, report)
            except RequestTimedOut as exc:
                # Stored, so the same request in another mode or a rerun does not wait again
                # on a server that is still busy with it (llama.cpp's server finishes what a
                # client gave up on); a longer agent.request_timeout_s asks again.
                fresh = {"timed_out_after_s": timeout, "error": str(exc)}
            latency = time.perf_counter() - start
            if report is not None and "usage" in fresh:
                _report(report("done", elapsed_s=latency, **fresh["usage"]))
            try:
                stored = self.cache.put(request, fresh, supersedes=_timed_out)
            except OSError as exc:
                raise RunError(f"agent.cache_dir: {exc}") from None
        if "timed_out_after_s" in stored:
            raise RequestTimedOut(str(stored["error"]), cached=cached)
        if "error" in stored:
            raise ModelError(str(stored["error"]))
        return Reply(stored["message"], stored["usage"], cached, latency)

    def _ask_in_time(
        self, request: Mapping[str, Any], report: Callable[..., RequestEvent] | None
    ) -> dict[str, Any]:
        """`_ask` in a daemon thread, waited for in POLL_S slices: a signal handler runs
        between slices (Ctrl-C is not held by a blocking socket), and the wait ends at the
        time-out whatever the HTTP client does. An abandoned request's thread ends with its
        socket's own time-out, or with the process."""
        timeout = self.config.request_timeout_s
        box: dict[str, Any] = {}
        done = threading.Event()

        def ask() -> None:
            try:
                box["answer"] = self._ask(request)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = exc
            finally:
                done.set()

        if report is not None:
            _report(report("start", timeout_s=timeout))
        start = time.monotonic()
        threading.Thread(target=ask, name="atomix-llm-request", daemon=True).start()
        next_note = WAITING_EVERY_S
        while not done.wait(POLL_S):
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                break
            if report is not None and elapsed >= next_note:
                _report(report("waiting", elapsed_s=elapsed, timeout_s=timeout))
                next_note += WAITING_EVERY_S
        if not done.is_set():
            if report is not None:
                _report(report("timeout", elapsed_s=time.monotonic() - start, timeout_s=timeout))
            raise RequestTimedOut(f"no answer from the model within {timeout:g} s "
                                  "(agent.request_timeout_s)")
        if "error" in box:
            raise box["error"]
        return dict(box["answer"])

    def _client(self) -> Any:
        try:
            import openai
        except ImportError:
            raise RunError(
                "agent.kind llm needs the openai package, which is not installed: "
                "pip install '.[llm]'"
            ) from None
        c = self.config
        key = (str(c.base_url), _api_key(c.api_key_env), c.request_timeout_s)
        if key not in _CLIENTS:
            # No retries in the SDK: it would retry a time-out too, past the caller's deadline;
            # _ask retries what is transient itself.
            _CLIENTS[key] = openai.OpenAI(
                base_url=key[0], api_key=key[1], timeout=c.request_timeout_s, max_retries=0
            )
        return _CLIENTS[key]

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """One real call; the reply normalised to what the agent and the cache keep."""
        import openai  # _client() said whether it is there

        client = self._client()
        sent = {k: v for k, v in request.items() if k != "base_url"}
        deadline = time.monotonic() + self.config.request_timeout_s
        try:
            for retry in range(TRANSIENT_RETRIES + 1):
                try:
                    completion = client.chat.completions.create(**sent)
                    break
                except openai.APITimeoutError:
                    raise
                except (openai.APIConnectionError, openai.RateLimitError,
                        openai.InternalServerError):
                    if retry == TRANSIENT_RETRIES or time.monotonic() + 1.0 >= deadline:
                        raise
                    time.sleep(0.5 * 2**retry)
        except openai.APITimeoutError:
            raise RequestTimedOut(
                f"no answer from the model within {self.config.request_timeout_s:g} s "
                "(agent.request_timeout_s)") from None
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            # About this conversation, not the server: the same request is refused again.
            return {"error": f"HTTP {exc.status_code}: {_error_text(exc)}"}
        except openai.APIStatusError as exc:
            raise RunError(
                f"agent: the model server at {request['base_url']} answered HTTP "
                f"{exc.status_code}: {_error_text(exc)} (model {request['model']!r}; check "
                "agent.model, agent.api_key_env and the server)"
            ) from None
        except openai.APIError as exc:  # connection refused, time-out, broken response
            raise RunError(
                f"agent: no completion from {request['base_url']} ({type(exc).__name__}: "
                f"{str(exc).rstrip('.')}); start the server, or point agent.base_url at one"
            ) from None
        return normalise(completion)


def wire_messages(messages: Sequence[Mapping[str, Any]], tool_result_role: str) -> list[dict[str, Any]]:
    """The conversation as sent: an assistant message without text has content "" (not null,
    which llama.cpp's server refuses); with `tool_result_role` "user", each tool message
    becomes a user message that names the call it answers (for templates without a tool role)."""
    names: dict[Any, str] = {}
    out: list[dict[str, Any]] = []
    for m in messages:
        for call in m.get("tool_calls") or ():
            names[call.get("id")] = str((call.get("function") or {}).get("name"))
        if m.get("role") == "tool" and tool_result_role == "user":
            name = names.get(m.get("tool_call_id"), "the tool")
            out.append({"role": "user", "content": f"Result of {name}:\n{m.get('content')}"})
        elif m.get("role") == "assistant" and m.get("content") is None:
            out.append({**m, "content": ""})
        else:
            out.append(dict(m))
    return out


def _error_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, Mapping) else inner
        if message:
            return str(message)[:500]
    return str(getattr(exc, "message", exc))[:500]


def normalise(completion: Any) -> dict[str, Any]:
    """The first choice of a chat completion as plain JSON: the assistant message (content,
    function tool calls), the finish reason and the token usage."""
    if not completion.choices:
        return {"error": "the server returned no choices"}
    choice = completion.choices[0]
    msg = choice.message
    message: dict[str, Any] = {"role": "assistant", "content": msg.content}
    calls = []
    for i, tc in enumerate(msg.tool_calls or []):
        function = getattr(tc, "function", None)
        if function is None:
            continue  # a custom (non-function) tool call: nothing offered it
        calls.append({
            "id": tc.id or f"call_{i}",
            "type": "function",
            "function": {"name": function.name, "arguments": function.arguments or ""},
        })
    if calls:
        message["tool_calls"] = calls
    usage = completion.usage
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    return {
        "message": message,
        "finish_reason": choice.finish_reason,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens},
    }

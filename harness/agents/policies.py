"""Agent policies: how an agent reacts when a tool call fails.

A policy is chosen per config (`agent:` section) and registered here by name; adding one is
a class plus a line in `POLICIES`. The agent loop (`harness.agents.task.run_agent`) asks the policy
what to do after every failed call and never decides by itself. A policy sees what an agent
sees: the error text or the time-out, the step, how often it failed in a row. It never sees
the injected fault's class (only the oracle does; docs/design.md, "What a mode may see").

- `gold` replays the task's gold actions: it retries a failed call up to `step_retries`
  times, then aborts the attempt and starts over (or resumes from the mode's checkpoint).
- `llm-like` is a seeded stochastic model of how LLM agents act after an error, a time-out or
  a refusal: retry the same call, retry with changed arguments, carry on as if it had
  succeeded, re-plan from an earlier step, or give up and answer. It reads the error text as
  a model does (`classify`): a refusal saying the object is no longer in the state the write
  needs ("Non-pending order cannot be modified") makes it read the object back first, and
  carry on if its own write is there. A re-plan does not re-issue writes it saw succeed
  (unless it forgets, `forget_on_replan`), and with `intrinsic_error` it makes one wrong
  action per task at that rate with no fault at all.
- `llm` is no policy of this module: a real model decides every call and every reaction
  (`harness.agents.llm`); `AgentConfig` holds its endpoint and sampling keys.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from atomix.effects import AbortSource

__all__ = [
    "POLICIES",
    "WEIGHT_KEYS",
    "AgentConfig",
    "Decision",
    "ErrorKind",
    "Failure",
    "GoldPolicy",
    "LlmLikePolicy",
    "Mistake",
    "Policy",
    "Reaction",
    "classify",
    "make_policy",
]


class Reaction(StrEnum):
    """What an agent may do after a failed call."""

    RETRY = "retry"  # the same call again
    ALTER = "alter"  # the call again with changed arguments (a plausible wrong action)
    CARRY_ON = "carry_on"  # take it as done and go on to the next step
    REPLAN = "replan"  # go back to an earlier step and re-issue the plan from there
    GIVE_UP = "give_up"  # answer the user: the task ends, the transaction is aborted
    RESTART = "restart"  # abort this attempt and start over (or resume from a checkpoint)
    REREAD = "reread"  # read the object back (a real read call) before deciding


class ErrorKind(StrEnum):
    """What an agent makes of a failed call from what it can see (`classify`)."""

    TRANSPORT = "transport"  # an error or a time-out: the call may or may not have happened
    STATE = "state"  # the tool refused because the object is no longer in the needed state
    REFUSAL = "refusal"  # any other refusal (bad argument, not found, not allowed)


# Refusal texts that say the object's state moved on ("Non-pending order cannot be
# cancelled", "... is no longer pending", "already cancelled"): the write this agent retries
# may be what moved it.
_STATE_TEXT = re.compile(
    r"\bnon-[a-z]+\b.*\bcannot\b|\bno longer\b|\balready\b|\bnot (?:pending|delivered|open|active)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed call as the agent sees it.

    `kind` is "error" or "timeout" for a failed delivery (whatever caused it) and "refused"
    for the tool's own answer that it will not do this (a precondition message). `reread` is
    what reading the object back showed, once the agent did: "landed" (its write is there),
    "not_landed", or "unknown" (the read failed, or the workload offers no way to check).
    """

    step: int
    tool: str
    kind: Literal["error", "timeout", "refused"]
    message: str
    tries: int  # failures of this step in a row, this one included
    read_only: bool
    reread: Literal["landed", "not_landed", "unknown"] | None = None


def classify(failure: Failure) -> ErrorKind:
    """The kind of a failed call as an agent reads it: from the delivery's outcome and the
    error text, never from what caused it (an injected fault's class is not in either)."""
    if failure.kind != "refused":
        return ErrorKind.TRANSPORT
    return ErrorKind.STATE if _STATE_TEXT.search(failure.message) else ErrorKind.REFUSAL


@dataclass(frozen=True, slots=True)
class Mistake:
    """One wrong action an agent makes in a task with no fault at all (`intrinsic_error`):
    at write step `step`, "alter" calls it with a plausible wrong argument (drawn with
    `random.Random(seed)`; a tool with nothing plausible to change makes it a "stop"), and
    "stop" ends the plan before it, answering the user as if the task were done (what it did
    so far is committed, as when a model stops calling tools)."""

    step: int
    kind: Literal["alter", "stop"]
    seed: int


@dataclass(frozen=True, slots=True)
class Decision:
    reaction: Reaction
    to_step: int | None = None  # REPLAN: the step to re-issue from
    source: AbortSource = AbortSource.TOOL_FAILURE  # GIVE_UP / RESTART: why the abort
    permanent: bool = False  # RESTART: trying the plan again cannot help
    forget: bool = False  # REPLAN: re-issue even the writes it saw succeed


class Policy(Protocol):
    """Decides the reaction to a failed call, and any wrong action it makes unprompted;
    deterministic given the rng's state."""

    name: str
    max_steps: int | None
    wrapper_retries: int

    def react(self, failure: Failure, rng: random.Random) -> Decision: ...

    def mistake(self, writes: Sequence[int], rng: random.Random) -> Mistake | None:
        """Asked once per task, before its first call, with the indices of its write steps."""
        ...


_DRAWN = (Reaction.RETRY, Reaction.ALTER, Reaction.CARRY_ON, Reaction.REPLAN, Reaction.GIVE_UP)


def _source(failure: Failure) -> AbortSource:
    return AbortSource.TIMEOUT if failure.kind == "timeout" else AbortSource.TOOL_FAILURE


@dataclass(frozen=True, slots=True)
class GoldPolicy:
    """The scripted replay of gold actions (the harness's original agent).

    Retries a failed delivery up to `step_retries` times, then restarts the attempt. A
    refusal is a result it reads and moves on from, unless `tool_errors_fatal`.
    """

    step_retries: int = 2
    tool_errors_fatal: bool = True
    max_steps: int | None = None
    wrapper_retries: int = 0
    name: str = "gold"

    def react(self, failure: Failure, rng: random.Random) -> Decision:
        if failure.kind == "refused":
            if self.tool_errors_fatal:
                return Decision(Reaction.RESTART, permanent=True)
            return Decision(Reaction.CARRY_ON)
        if failure.tries <= self.step_retries:
            return Decision(Reaction.RETRY)
        return Decision(Reaction.RESTART, source=_source(failure))

    def mistake(self, writes: Sequence[int], rng: random.Random) -> Mistake | None:
        return None  # the gold actions, as written


@dataclass(frozen=True, slots=True)
class LlmLikePolicy:
    """A seeded stochastic stand-in for an LLM agent's reaction to a failed call.

    It reads the error as a model does (`classify`). A refused read is information it reads
    and moves on from (tau2's gold trajectories contain such look-ups on purpose). A write
    refused because the object is no longer in the needed state makes it read the object back
    first (REREAD; the loop makes the read, a real call that counts as a step) and, if its own
    write is there, carry on. Otherwise (a failed delivery, any other refusal, a read-back
    that shows nothing or fails) it draws one reaction with the configured weights. A re-plan
    forgets the writes it saw succeed with probability `forget_on_replan` (else the loop does
    not re-issue them). With `intrinsic_error`, a task holds one wrong action (`Mistake`) at
    that rate. Every draw comes from the trial's own rng, so a trial is reproducible from its
    seed, and every mode meets the same draws for as long as it makes the same calls; a knob
    at 0 draws nothing, so it leaves every other draw where it was.
    """

    retry: float
    alter: float
    carry_on: float
    replan: float
    give_up: float
    replan_depth: int
    max_steps: int | None
    wrapper_retries: int = 0
    forget_on_replan: float = 0.0
    intrinsic_error: float = 0.0
    name: str = "llm-like"

    def react(self, failure: Failure, rng: random.Random) -> Decision:
        if failure.kind == "refused" and failure.read_only:
            return Decision(Reaction.CARRY_ON)
        if failure.reread == "landed":
            return Decision(Reaction.CARRY_ON)  # it saw its own change: the step is done
        if failure.reread is None and classify(failure) is ErrorKind.STATE:
            return Decision(Reaction.REREAD)
        weights = (self.retry, self.alter, self.carry_on, self.replan, self.give_up)
        (chosen,) = rng.choices(_DRAWN, weights)  # one rng.random() per draw
        if chosen is Reaction.REPLAN:
            back = rng.randint(1, max(1, self.replan_depth))
            forget = self.forget_on_replan > 0 and rng.random() < self.forget_on_replan
            return Decision(Reaction.REPLAN, to_step=max(0, failure.step - back), forget=forget)
        if chosen is Reaction.GIVE_UP:
            return Decision(Reaction.GIVE_UP, source=_source(failure))
        return Decision(chosen)

    def mistake(self, writes: Sequence[int], rng: random.Random) -> Mistake | None:
        if self.intrinsic_error <= 0:
            return None
        # One draw per task whatever the outcome, so a larger rate only adds mistaken tasks
        # (those with this draw below it) and leaves the others' draws unchanged.
        slipped = rng.random() < self.intrinsic_error
        if not slipped or not writes:
            return None  # a slip in a task that writes nothing leaves no trace in the state
        step = writes[rng.randrange(len(writes))]
        kind: Literal["alter", "stop"] = "alter" if rng.random() < 0.5 else "stop"
        return Mistake(step, kind, rng.getrandbits(32))


class AgentConfig(BaseModel):
    """The `agent:` section of a config. See configs/README.md for every key.

    Weights of the llm-like reactions are relative (they need not sum to 1). Where a default
    comes from is said next to it; the reaction weights are assumptions, not measurements.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["gold", "llm-like", "llm", "noop"] = "gold"
    # tau2 counts tool calls per task; the paper runs GPT-4.1 with max_steps=30 (Table 6).
    # None: no budget (the gold agent's historical behaviour).
    max_steps: int | None = Field(None, ge=1, le=10_000)
    # Retries of a failed delivery made by the integration's wrapper, below the agent, before
    # the agent sees the failure; they do not count against max_steps (the agent never
    # issued them). 0 in every fair protocol: see configs/tau_retail_paper_protocol.yaml.
    wrapper_retries: int = Field(0, ge=0, le=20)
    # Per-mode wrapper retries, overriding `wrapper_retries` (the paper's public protocol).
    wrapper_retries_by_mode: dict[str, int] = {}
    # llm-like reaction weights. Assumption: an LLM agent most often retries a failed call
    # as it was; a minority carry on, change an argument, go back a few steps or give up.
    retry: float = 0.55
    alter: float = 0.10
    carry_on: float = 0.15
    replan: float = 0.10
    give_up: float = 0.10
    # Assumption: a re-plan goes back at most this many steps (re-reading what it needs).
    replan_depth: int = Field(3, ge=1, le=100)
    # Probability that a re-plan re-issues writes the agent saw succeed. Assumption 0: tau2
    # keeps the whole conversation, every tool call and its result, in the model's context,
    # and a 30-call task fits in it many times over, so the model can see what it already did.
    forget_on_replan: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    # Probability per task of one wrong action with no fault at all (a wrong argument on a
    # write, or stopping before one). 0: the agent performs the plan exactly when nothing
    # fails; configs/tau_retail_calibrated.yaml sets it from a published success rate.
    intrinsic_error: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    # kind llm (harness/agents/llm.py): a model behind an OpenAI-compatible endpoint. These
    # keys stay out of a dump while unused, so configs of the other kinds hash as before.
    model: str | None = Field(None, min_length=1, max_length=256)  # as the server names it
    base_url: str | None = None  # e.g. http://127.0.0.1:8080/v1
    # The environment variable holding the API key; unset (or the variable missing): a
    # dummy key, which local servers accept.
    api_key_env: str | None = None
    temperature: float = Field(0.0, ge=0.0, le=2.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # sent when set
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)  # per completion; None: server's
    tool_choice: Literal["auto", "required", "none"] = "auto"
    system_prompt: Literal["tau2", "short"] = "tau2"
    # How tool results are sent: as `tool` messages (the OpenAI API), or as `user` messages
    # naming the call, for chat templates that drop tool messages (llama.cpp's
    # chatml-function-calling renders no tool role). The record keeps tool messages either way.
    tool_result_role: Literal["tool", "user"] = "tool"
    # Completions cached by request hash; None: $XDG_CACHE_HOME/atomix/llm (~/.cache/...).
    cache_dir: str | None = Field(None, min_length=1, max_length=4096)
    # Seconds one request may take (connecting, the prompt, the answer) before it is a failed
    # step (harness/agents/llm.py says what follows). Not part of the completion cache's key.
    request_timeout_s: float = Field(120.0, gt=0.0, le=86_400.0, allow_inf_nan=False)

    @field_validator("retry", "alter", "carry_on", "replan", "give_up")
    @classmethod
    def _weight(cls, v: float) -> float:
        if not (math.isfinite(v) and v >= 0.0):
            raise ValueError(f"a reaction weight must be a finite number >= 0, got {v!r}")
        return v

    @field_validator("wrapper_retries_by_mode")
    @classmethod
    def _per_mode(cls, v: dict[str, int]) -> dict[str, int]:
        from harness.modes.registry import modes

        known = modes()
        bad = sorted(m for m in v if m not in known)
        if bad:
            raise ValueError(f"unknown mode(s) {bad}; allowed: {', '.join(sorted(known))}")
        for mode, n in v.items():
            if not (isinstance(n, int) and 0 <= n <= 20):
                raise ValueError(f"{mode}: wrapper retries must be an integer in [0, 20], got {n!r}")
        return v

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            parts = urlsplit(v)
        except ValueError as exc:
            raise ValueError(f"not a URL ({exc}); e.g. http://127.0.0.1:8080/v1") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in v):
            raise ValueError(
                f"must be an http:// or https:// URL of an OpenAI-compatible API, got {v!r}; "
                "e.g. http://127.0.0.1:8080/v1"
            )
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", v):
            raise ValueError(
                f"must name an environment variable (letters, digits, _), e.g. OPENAI_API_KEY, got {v!r}"
            )
        return v

    @model_validator(mode="after")
    def _llm_needs(self) -> AgentConfig:
        if self.kind != "llm":
            return self
        missing = [k for k in ("model", "base_url", "max_steps") if getattr(self, k) is None]
        if missing:
            raise ValueError(
                "kind llm needs " + ", ".join(f"agent.{k}" for k in missing)
                + " (the model as the server names it, the server's URL such as "
                "http://127.0.0.1:8080/v1, and a step budget: tau2 and the paper use 30)"
            )
        try:
            import openai  # noqa: F401 - only whether it can be imported
        except ImportError:
            raise ValueError(
                "kind llm needs the openai package, which is not installed: pip install '.[llm]'"
            ) from None
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        # Knobs added after configs were first hashed leave the dump at their defaults, so a
        # config that does not set them hashes as before.
        for key in ("forget_on_replan", "intrinsic_error"):
            if key in data and data[key] == 0.0:
                del data[key]
        if self.kind != "llm":
            # Unused llm keys at their defaults are left out: the dump (and so the config
            # hash and the manifest) of a gold or llm-like config is what it was before.
            fields = type(self).model_fields
            for key in LLM_KEYS:
                if key in data and getattr(self, key) == fields[key].default:
                    del data[key]
        return data

    @model_validator(mode="after")
    def _some_weight(self) -> AgentConfig:
        if self.kind == "llm-like" and self.retry + self.alter + self.carry_on + self.replan + self.give_up <= 0:
            raise ValueError("llm-like: at least one reaction weight must be > 0")
        if self.kind == "llm-like" and self.max_steps is None:
            # Its reactions may loop on a call that always fails; only a budget ends that,
            # as tau2's max_steps does for a real model.
            raise ValueError("llm-like needs agent.max_steps (a step budget; tau2 and the paper use 30)")
        return self

    def wrapper_retries_for(self, mode: str) -> int:
        return self.wrapper_retries_by_mode.get(mode, self.wrapper_retries)


def _gold(config: AgentConfig, mode: str, step_retries: int, tool_errors_fatal: bool) -> Policy:
    return GoldPolicy(step_retries, tool_errors_fatal, config.max_steps, config.wrapper_retries_for(mode))


def _llm_like(config: AgentConfig, mode: str, step_retries: int, tool_errors_fatal: bool) -> Policy:
    return LlmLikePolicy(
        config.retry, config.alter, config.carry_on, config.replan, config.give_up,
        config.replan_depth, config.max_steps, config.wrapper_retries_for(mode),
        config.forget_on_replan, config.intrinsic_error,
    )


POLICIES: dict[str, Any] = {"gold": _gold, "llm-like": _llm_like}

#: The llm-like agent's weights: the relative reaction weights, then the two probabilities.
#: A sensitivity analysis (harness.analysis.sensitivity) varies exactly these.
REACTION_KEYS = ("retry", "alter", "carry_on", "replan", "give_up")
WEIGHT_KEYS = (*REACTION_KEYS, "forget_on_replan", "intrinsic_error")

# Keys only kind llm reads (see AgentConfig._dump).
LLM_KEYS = (
    "model", "base_url", "api_key_env", "temperature", "seed", "max_tokens", "tool_choice",
    "system_prompt", "tool_result_role", "cache_dir", "request_timeout_s",
)


def make_policy(config: AgentConfig, mode: str, *, step_retries: int, tool_errors_fatal: bool) -> Policy:
    """The policy of `config` for one mode; the workload supplies the gold agent's knobs."""
    return POLICIES[config.kind](config, mode, step_retries, tool_errors_fatal)

"""Run an OpenAI chat completion's tool calls through the Atomix runtime.

    tools = OpenAITools(rt, [write_file, send_mail])          # rt.tool shims
    reply = client.chat.completions.create(model=..., messages=messages, tools=tools.tools)
    messages.append(reply.choices[0].message)
    messages += tools.run(reply)                              # one tool message per call

`run` takes a ChatCompletion, its message, a list of tool calls, or plain dicts of the same
shapes; the openai package is not needed. It returns `{"role": "tool", "tool_call_id",
"content"}` messages in the order of the calls. A result is JSON; a staged or queued call
says it takes effect at commit. Whatever goes wrong with one call - arguments that are not
JSON, an unknown tool, arguments that do not fit its signature or types, a scope the tool
refuses, the tool raising, the transaction aborting - comes back as a message whose content
starts with "Error:", for the model to read; `run` itself does not raise for it.

The transaction boundary (`boundary=`):

- "turn" (default): each `run` is one transaction, committed before `run` returns.
- "task": one transaction spans several `run` calls, until `commit()` / `abort()` or the
  end of a `with tools.task():` block (which commits, or aborts on an exception).
- "explicit": the caller opens it: `with rt.transaction(): tools.run(...)`; `run` raises
  AtomixError when none of this runtime is open, and never commits or aborts it.

A turn is the calls of one `run`. The calls of a turn run one after another, in the order
the model gave them, inside its transaction: parallel tool calls are deterministic, and a
later call sees what earlier ones staged. When a call fails, `on_error` decides the turn:

- "abort" (default): the whole turn is undone and the rest of its calls are not run; if a
  call is invalid (bad JSON, unknown tool, wrong arguments) no call of the turn runs at all.
  Under "turn" the transaction aborts: staged writes are dropped, queued sends never leave,
  reversible effects are compensated. Under "task" and "explicit" the turn is rolled back to
  a savepoint and the transaction stays open with the earlier turns' work. Every message of
  the turn then starts with "Error:" and says the turn was undone, so the model retries it
  whole rather than building on a call that no longer exists.
- "commit": only the failing call is undone (each call runs in its own savepoint); the
  others stand and, under "turn", commit.

If the transaction itself aborts (a stale read at commit, a time-out, a seal violation),
every call since it began is gone, and the messages say so; under "turn" a stale read
retries the whole turn with a fresh epoch, up to `retries` times, as `Runtime.run` does.

A runner keeps the state of one conversation (its task transaction): use one per agent and
do not share it between threads.

Modules: `wire` reads the tool calls off a completion and checks them against the tools,
`turn` runs a turn's calls in an open transaction, `messages` says what became of each call,
and `runner` (OpenAITools) decides which transaction a turn runs in and when it settles.
"""

# This package is atomix.integrations.openai; every import in it is absolute, so `openai`
# anywhere below always means the third-party SDK (which none of these modules needs).
from __future__ import annotations

from atomix.integrations.openai.runner import Boundary as Boundary
from atomix.integrations.openai.runner import OnError as OnError
from atomix.integrations.openai.runner import OpenAITools

__all__ = ["OpenAITools"]

"""tau2's reward for a tau_retail trial, from the components it can check without a judge.

tau2 scores a task by the product of the components in the task's `reward_basis`: the final
DB against the gold one (DB), the strings of `communicate_info` found in the agent's
messages (COMMUNICATE: each string, lower-cased, must occur in one assistant message's text
lower-cased with its commas removed), and `nl_assertions`, which an LLM judge checks
(NL_ASSERTION); a conversation that did not end by the agent's own stop scores 0.

Here every component is recorded, and a trial passes when none is False:

- `db`: the final DB hash equals the gold replay's (`_goal_sha`).
- `communicate`: the task's `communicate_info` against the agent's messages to the user,
  by tau2's rule; counted whatever the task's `reward_basis` says (tau2's retail tasks leave
  COMMUNICATE out of it, so an agent that reaches the DB without telling the user what it
  was asked would pass there). None when the task has nothing to communicate, or the agent
  is a policy agent (gold, llm-like), which models tool calls only and has no messages.
- `transfer`: when the gold actions hand the user to a human (`transfer_to_human_agents`,
  which changes no DB), the agent called it with success. Not a tau2 reward component (it is
  what tau2's action check would find for that one call); None when the gold has none or the
  agent is a policy agent (it performs the gold plan).
- `stopped`: the agent ended the conversation itself (not out of its step budget, not
  refused by the model server), as tau2 requires; None for policy agents.
- `nl_assertions`: never counted: the string "not judged: needs an LLM judge" when the task
  has some, None when it has none.

An agent kind has messages when its outcome has `messages_to_user()` (and
`tools_called()`): the real model's (harness.agents.llm) and the do-nothing control's
(harness.agents.noop), which says nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.agents.task import AgentOutcome

__all__ = ["NOT_JUDGED", "communicated", "reward"]

NOT_JUDGED = "not judged: needs an LLM judge"
TRANSFER = "transfer_to_human_agents"


def communicated(info: str, messages: Sequence[str]) -> bool:
    """tau2's COMMUNICATE check of one required string against the agent's messages."""
    return any(info.lower() in m.lower().replace(",", "") for m in messages)


def reward(task: Mapping[str, Any], db_matches: bool, outcomes: Sequence[AgentOutcome]) -> dict[str, Any]:
    """The reward record (harness.experiment.record.RewardRecord) of one tau_retail trial."""
    criteria = task.get("evaluation_criteria") or {}
    info = [str(s) for s in criteria.get("communicate_info") or []]
    gold_transfer = any(a.get("name") == TRANSFER for a in criteria.get("actions") or [])
    talkers = [o for o in outcomes if callable(getattr(o, "messages_to_user", None))]
    components: dict[str, bool | str | None] = {"db": db_matches}
    if talkers:
        said = [m for o in talkers for m in o.messages_to_user()]  # type: ignore[attr-defined]
        called = {n for o in talkers for n in o.tools_called()}  # type: ignore[attr-defined]
        components["communicate"] = all(communicated(s, said) for s in info) if info else None
        components["transfer"] = (TRANSFER in called) if gold_transfer else None
        components["stopped"] = not any(
            o.out_of_budget or getattr(o, "stop", "") == "model_error" for o in talkers)
    else:
        components.update(communicate=None, transfer=None, stopped=None)
    components["nl_assertions"] = NOT_JUDGED if criteria.get("nl_assertions") else None
    failed = [name for name, value in components.items() if value is False]
    return {"passed": not failed, "components": components, "failed": failed}

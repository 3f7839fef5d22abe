"""A trial's retry budget, as its record stores it and as captions say it.

The mode's part is what the mode declares (`harness.modes.base.RetryBudget`, through the
registry), the agent's is its config and the workload's agent knobs
(`harness.agents.budget.AgentBudget`), and `retries` is what the config's `retries:` section
set for every mode. The texts here are the one spelling of a budget in table captions and in
the reproduction's budget section.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from harness.agents.budget import agent_budget, compact_agent
from harness.agents.policies import AgentConfig
from harness.agents.task import AgentPolicy
from harness.experiment.record import BudgetRecord
from harness.modes.base import DELIVERY_KINDS, ModeSettings, RetryBudget
from harness.modes.registry import get_mode

__all__ = ["agent_text", "limits_text", "mode_text", "modes_text", "trial_budget"]


def trial_budget(
    mode: str, settings: ModeSettings, agent: AgentConfig, policy: AgentPolicy
) -> BudgetRecord:
    """The budget of one trial of `mode` (JSON-ready; a function of the config alone)."""
    return cast(BudgetRecord, {
        "mode": get_mode(mode).budget(settings).as_dict(),
        "agent": agent_budget(
            agent, mode, step_retries=policy.step_retries, max_attempts=policy.max_attempts
        ).as_dict(),
        "retries": settings.retries.given(),
    })


def mode_text(budget: Mapping[str, Any]) -> str:
    """`apply×8`, `confirm×8`, `call×3`, `call×1`; `, wrapper×4` when the integration's
    wrapper re-issues a failed call below the agent for this mode."""
    text = RetryBudget(**{k: int(budget["mode"][k]) for k in DELIVERY_KINDS}).compact()
    wrapper = int((budget.get("agent") or {}).get("wrapper_retries") or 0)
    return f"{text}, wrapper×{1 + wrapper}" if wrapper else text


def agent_text(budget: Mapping[str, Any]) -> str:
    """`llm-like (retries drawn; max_steps 30, 4 attempts)`, `gold (retries a failed call 2×;
    4 attempts)`."""
    return compact_agent(dict(budget.get("agent") or {}))


def limits_text(retries: Mapping[str, int]) -> str:
    """What a `retries:` section set: `deliveries=1` when it bounds every kind alike, else the
    kinds it bounds (`apply=1, confirm=2`); "" when it set nothing."""
    if not retries:
        return ""
    values = set(retries.values())
    if set(retries) == set(DELIVERY_KINDS) and len(values) == 1:
        return f"deliveries={values.pop()}"
    return ", ".join(f"{k}={retries[k]}" for k in DELIVERY_KINDS if k in retries)


def modes_text(pairs: Iterable[tuple[str, str]], order: Sequence[str] = ()) -> str:
    """(mode, `mode_text`) pairs as one phrase, modes with the same budget named together:
    `tx-full, no-frontier apply×8; tcc confirm×8; saga, no-tx call×1`. Modes go in `order`
    first, then sorted; a mode with several budgets (cells that differ) lists each, joined
    by "or"."""
    texts: dict[str, list[str]] = {}
    for mode, text in pairs:
        seen = texts.setdefault(mode, [])
        if text not in seen:
            seen.append(text)
    first = [m for m in dict.fromkeys(order) if m in texts]
    groups: dict[str, list[str]] = {}
    for mode in first + sorted(m for m in texts if m not in first):
        groups.setdefault(" or ".join(texts[mode]), []).append(mode)
    return "; ".join(f"{', '.join(modes)} {text}" for text, modes in groups.items())

"""The reproduction's section on retry budgets: what every mode and the agent were allowed to
retry in each config's runs, so that a lead in a table can be read against what each side
was given.

`budgets_markdown(configs)` works from the configs alone (each mode's declared budget under
the cell's settings and `retries:` section, the agent's from its config and the workload's
agent knobs); the trial records hold the same budget per trial (`budget`), and every table
caption prints it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from harness.agents.task import AgentPolicy
from harness.experiment.budget import agent_text, limits_text, mode_text, modes_text, trial_budget
from harness.experiment.cells import cell_id, expand_cells
from harness.experiment.config import ExperimentConfig, cell_config
from harness.experiment.trial import derive_rng
from harness.workloads import get_workload

__all__ = ["budgets_markdown", "config_budgets"]

TITLE = "## Retry budgets"

INTRO = (
    "What each mode and the agent were allowed to retry. A mode's part counts the deliveries "
    "in all of one effect below the agent: `call` when the agent makes it, `apply` (a held-back "
    "effect applied at commit under its idempotency key), `confirm` (a TCC confirm, under its "
    "key) and `resend` (a gated send, without a key) at commit, `wrapper` when the "
    "integration re-issues a failed call before the agent sees it. A keyed delivery retried "
    "N times absorbs up to N-1 failures of one effect without a duplicate, so a mode with a "
    "larger budget may lead for that reason alone; a config with a `retries:` section gives "
    "every mode's retry loops the same bound (a mode without such a loop delivers once). The "
    "agent's own retries come on top and are the same for every mode of a config. Each trial "
    "record holds its budget (`budget`), and every table caption prints it."
)


def _policy(config: ExperimentConfig, cache: dict[str, AgentPolicy]) -> AgentPolicy:
    """The workload's agent knobs for this cell's params (trial 0's scenario: they depend on
    the params, not on the trial)."""
    key = json.dumps([config.workload, config.params, config.seed], sort_keys=True, default=str)
    if key not in cache:
        workload = get_workload(config.workload)
        scenario = workload.scenario(derive_rng(config.seed, "scenario", 0), 0, config.params)
        cache[key] = scenario.policy
    return cache[key]


def config_budgets(config: ExperimentConfig) -> list[dict[str, Any]]:
    """One row per group of the config's cells that share a budget: `cells` (their ids, or
    ["all"]), `retries` (what the `retries:` section set, "native" without one), `modes` and
    `agent` (the caption's texts)."""
    cache: dict[str, AgentPolicy] = {}
    rows: dict[tuple[str, str, str], list[str]] = {}
    cells = expand_cells(config)
    for cell in cells:
        cfg = cell_config(config, cell)
        settings = cfg.settings.mode_settings(cfg.retries)
        policy = _policy(cfg, cache)
        budgets = {m: trial_budget(m, settings, cfg.agent, policy) for m in config.modes}
        modes = modes_text(((m, mode_text(b)) for m, b in budgets.items()), config.modes)
        agents = ", ".join(dict.fromkeys(agent_text(b) for b in budgets.values()))
        limits = limits_text(settings.retries.given())
        key = (f"retries: {limits}" if limits else "native", modes, agents)
        rows.setdefault(key, []).append(cell_id(config, cell))
    whole = len(rows) == 1
    return [
        {"cells": ["all"] if whole else ids, "retries": r, "modes": m, "agent": a}
        for (r, m, a), ids in rows.items()
    ]


def _md(text: str) -> str:
    return text.replace("|", r"\|")


def budgets_markdown(configs: Sequence[ExperimentConfig]) -> str:
    """A Markdown section (`## Retry budgets`, a short explanation, one table row per config,
    or per group of its cells that differ) for REPRODUCTION.md."""
    lines = [TITLE, "", INTRO, "", "| config | cells | bounds | modes | agent |",
             "| :--- | :--- | :--- | :--- | :--- |"]
    for config in configs:
        for row in config_budgets(config):
            cells = ", ".join(row["cells"])
            lines.append(
                f"| `{_md(config.name or 'experiment')}` | {_md(cells)} | {_md(row['retries'])} "
                f"| {_md(row['modes'])} | {_md(row['agent'])} |"
            )
    return "\n".join(lines) + "\n"

"""`webshop`: a PROXY for paper Table 5's WebArena columns, not WebArena.

WebArena needs live web sites and a frontier model; this is an offline stand-in: one agent
per trial performs one scripted task (a gold plan of browser actions) on a small web shop
served in-process from the trial's real SQLite database and append-only mailbox
(`harness.workloads.webshop.shop`), with page- and element-level scopes after paper Table 4.
A trial is clean when the shop ends exactly as the task's gold plan leaves it (orders, stock,
carts, profiles, reviews, bookings and the confirmation mails) and the oracle finds no leak,
duplicate or unclassified residue.

Parameters (`params.*` in a config):

- `tasks` (default 30, 20 to 40): the size of the task bank; trial t performs task t mod tasks.
- `task_seed` (default 0): the seed the bank is drawn from.
- `step_retries` (default 2): how often the gold agent retries a failed call.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from harness.agents.task import AgentOutcome
from harness.workloads.base import Scenario
from harness.workloads.scripted import ScriptedParams, scripted_scenario
from harness.workloads.webshop import shop
from harness.workloads.webshop.tasks import goal_state, task_bank
from harness.workloads.webshop.tools import TOOLS
from harness.world.substrates import TrialEnv

__all__ = ["TOOLS", "WebshopParams", "WebshopWorkload"]


class WebshopParams(ScriptedParams):
    """`params` of the webshop proxy workload (see the module docstring)."""


def _metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
    return {"orders_placed": len(env.db.snapshot()["orders"]), "confirmations": len(env.messages())}


class WebshopWorkload:
    """Scripted web-shop tasks (PROXY for WebArena in paper Table 5): the same task, plan and
    goal state for every mode and fault cell of a trial."""

    name = "webshop"
    description = "PROXY for WebArena (not WebArena): scripted tasks on an in-process web shop"
    tools = TOOLS
    Params = WebshopParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = WebshopParams.model_validate(params)
        scripted = task_bank(p.tasks, p.task_seed)[trial % p.tasks]
        return scripted_scenario(
            scripted, setup=shop.setup, goal=goal_state, step_retries=p.step_retries,
            metrics=_metrics,
        )

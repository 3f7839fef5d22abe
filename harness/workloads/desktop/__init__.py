"""`desktop`: a PROXY for paper Table 5's OSWorld columns, not OSWorld.

OSWorld needs virtual machines and a frontier model; this is an offline stand-in: one agent
per trial performs one scripted task (a gold plan of UI actions) on a desktop of four apps
over the trial's real substrates (`harness.workloads.desktop.apps`): an editor whose
documents are real files, a file manager with a trash, a mail client (inbox in SQLite, sent
mail through the real append-only mailbox) and a settings store (SQLite), with UI-app scopes
after paper Table 4. A trial is clean when the desktop ends exactly as the task's gold plan
leaves it (files, trash, settings, inbox, sent mail) and the oracle finds no leak, duplicate
or unclassified residue.

Parameters (`params.*` in a config):

- `tasks` (default 30, 20 to 40): the size of the task bank; trial t performs task t mod tasks.
- `task_seed` (default 0): the seed the bank is drawn from.
- `step_retries` (default 2): how often the gold agent retries a failed call.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from harness.workloads.base import Scenario
from harness.workloads.desktop import apps
from harness.workloads.desktop.tasks import goal_state, task_bank
from harness.workloads.desktop.tools import TOOLS
from harness.workloads.scripted import ScriptedParams, scripted_scenario

__all__ = ["TOOLS", "DesktopParams", "DesktopWorkload"]


class DesktopParams(ScriptedParams):
    """`params` of the desktop proxy workload (see the module docstring)."""


class DesktopWorkload:
    """Scripted desktop tasks (PROXY for OSWorld in paper Table 5): the same task, plan and
    goal state for every mode and fault cell of a trial."""

    name = "desktop"
    description = "PROXY for OSWorld (not OSWorld): scripted tasks on a desktop of files, mail and settings"
    tools = TOOLS
    Params = DesktopParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = DesktopParams.model_validate(params)
        scripted = task_bank(p.tasks, p.task_seed)[trial % p.tasks]
        return scripted_scenario(
            scripted, setup=apps.setup, goal=goal_state, step_retries=p.step_retries,
        )

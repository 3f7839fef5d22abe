"""The do-nothing control and tau2's reward components on tau_retail, and the real-model
prompt following tau2's solo protocol (no user-simulator instruction reaches the model)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from harness.agents.llm import briefing
from harness.agents.policies import AgentConfig
from harness.agents.task import Task
from harness.experiment.config import load_config
from harness.experiment.runner import run
from harness.workloads.retail import goal_db, load_retail, select_tasks
from harness.workloads.retail.cow import db_sha256
from harness.workloads.retail.data import fresh_db
from harness.workloads.retail.reward import TRANSFER, communicated
from harness.workloads.retail.substrate import RETAIL_TOOLS
from harness.workloads.retail.workload import (
    PRIVATE_INSTRUCTIONS,
    _ticket,
    _tool_schemas,
)


def _records(config: str, **overrides: object) -> list[dict]:
    cfg = load_config(config, overrides={"agent.kind": "noop", **overrides})
    out = Path(tempfile.mkdtemp())
    run(cfg, out=out, jobs=1)
    return [r for f in out.rglob("*.jsonl") for line in open(f) if "metrics" in (r := json.loads(line))]


def _idle_is_right(task: dict) -> bool:
    """tau2 credits doing nothing: the gold changes no DB, hands nobody over, asks nothing told."""
    data = load_retail()
    crit = task["evaluation_criteria"]
    return (goal_db(data, task).sha256 == db_sha256(fresh_db(data))
            and not crit["communicate_info"]
            and not any(a["name"] == TRANSFER for a in crit["actions"]))


def test_noop_scores_only_where_doing_nothing_is_the_answer() -> None:
    records = _records("configs/tau_retail_fault_class.yaml", **{"modes": ["tx-full"]})
    tasks = select_tasks(load_retail(), "test", 30, 0)
    assert records and len(records) % 30 == 0
    expected = {t["id"] for t in tasks if _idle_is_right(t)}
    clean = {tasks[r["trial"] % 30]["id"] for r in records if r["metrics"]["clean"]}
    assert clean == expected  # {"65"}: the only sampled task whose right answer is to do nothing
    for r in records:
        assert r["metrics"]["steps"] == 0 and r["metrics"]["clean"] == r["reward"]["passed"]
        assert r["reward"]["components"]["stopped"] is True
    failed = {f for r in records for f in r["reward"]["failed"]}
    assert failed == {"db", "communicate", "transfer"}


def test_communicate_follows_tau2_rule() -> None:
    assert communicated("1,234.5", ["The total is 1234.5 dollars"]) is False  # tau2 strips the message's commas only
    assert communicated("302.67", ["It costs $302.67."])
    assert not communicated("cotton", [])


def test_no_private_instruction_reaches_the_model() -> None:
    """For every retail task, what the model is sent (system prompt and opening) holds the
    policy and the ticket, and none of the user simulator's private instructions. The check
    can fail: the ticket tau2's retail tasks used to be given (all four parts) holds them."""
    data = load_retail()
    policy = data.policy
    assert policy.strip()
    config = AgentConfig(kind="llm", model="m", base_url="http://127.0.0.1:1/v1", max_steps=30)
    leaked_before = 0
    for task in data.tasks:
        instructions = task["user_scenario"]["instructions"]
        private = [str(v).strip() for k, v in instructions.items()
                   if k in PRIVATE_INSTRUCTIONS and isinstance(v, str) and len(v.strip()) > 3]
        ticket = _ticket(task)
        assert ticket, task["id"]
        brief = briefing(config, "tau_retail", [Task("t", (), ticket=ticket)], _tool_schemas(),
                         policy, RETAIL_TOOLS)
        sent = brief.system + json.dumps(brief.opening(ticket))
        assert policy.strip() in brief.system
        assert not any(p in sent or json.dumps(p)[1:-1] in sent for p in private), task["id"]
        everything = "\n".join(str(v) for v in instructions.values() if isinstance(v, str))
        leaked_before += any(p in everything for p in private)
    assert leaked_before > 0  # the old ticket (every part) would have failed the check

"""The llm-like agent reads its errors: a refusal saying the order has moved on makes it read
the order back (a real call through the mode) and carry on when its own write is there; a
re-plan does not re-issue writes it saw succeed (unless it forgets); and `intrinsic_error`
makes it slip with no fault at about the configured rate.

Trials run on tau2 retail, on the hand-made rig of tests/policy_rig.py (`rig` fixture) or
through `run_trial`.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from policy_rig import (
    CANCEL,
    CANCEL_THEN_MODIFY,
    DATA,
    READS_THEN_CANCEL,
    TASKS,
    TRIAL,
    failing,
    failure,
    goal_sha,
    gold_args,
    only,
    site,
    spec,
)
from scipy import stats

from harness.agents.policies import (
    AgentConfig,
    Decision,
    ErrorKind,
    Failure,
    GoldPolicy,
    LlmLikePolicy,
    Reaction,
    classify,
    make_policy,
)
from harness.agents.task import Step
from harness.experiment.trial import run_trial
from harness.workloads.retail import call_tool, fresh_db, gold_actions
from harness.workloads.retail.substrate import RETAIL_TOOLS, reread
from harness.workloads.retail.tools import TOOLS, RetailToolError
from harness.world.faults import FaultClass, FaultConfig

ORDER_MOVED_ON = (
    "Non-pending order cannot be cancelled",
    "Non-pending order cannot be modified",
    "Non-delivered order cannot be exchanged",
    "Non-delivered order cannot be returned",
)


def llm_like(reaction: str = "give_up", **more: Any) -> LlmLikePolicy:
    policy = make_policy(only(reaction, **more), "tx-full", step_retries=2, tool_errors_fatal=True)
    assert isinstance(policy, LlmLikePolicy)
    return policy


def refused(message: str, *, read_only: bool = False, reread: Any = None) -> Failure:
    return Failure(3, "cancel_pending_order", "refused", message, 1, read_only, reread)


# ------------------------------------------------------------------------------ reading errors


def test_the_retail_refusals_of_a_write_that_already_landed_read_as_state_changes() -> None:
    # The texts are the tools' own: a cancelled order refuses a second cancel so.
    db = fresh_db(DATA)
    args = gold_args(CANCEL, 0)
    call_tool(db, "cancel_pending_order", args)
    with pytest.raises(RetailToolError) as again:
        call_tool(db, "cancel_pending_order", args)
    assert str(again.value) in ORDER_MOVED_ON
    for message in ORDER_MOVED_ON:
        assert classify(refused(message)) is ErrorKind.STATE
    for message in ("Invalid reason", "Order not found", "Payment method not found",
                    "The new item id should be different from the old item id"):
        assert classify(refused(message)) is ErrorKind.REFUSAL
    for kind in ("error", "timeout"):
        assert classify(failure(kind)) is ErrorKind.TRANSPORT


@pytest.mark.parametrize("reaction", ["retry", "alter", "carry_on", "replan", "give_up"])
def test_a_state_refusal_of_a_write_makes_the_agent_read_back_before_anything_else(reaction: str) -> None:
    policy = llm_like(reaction)
    rng = random.Random(3)
    before = rng.getstate()
    assert policy.react(refused(ORDER_MOVED_ON[1]), rng) == Decision(Reaction.REREAD)
    assert rng.getstate() == before  # deciding to look costs no draw
    # Its own write is there: the step is done, whatever the weights say.
    assert policy.react(refused(ORDER_MOVED_ON[1], reread="landed"), rng) == Decision(Reaction.CARRY_ON)
    # It is not (or the read told nothing): it reacts as before, by its weights.
    for seen in ("not_landed", "unknown"):
        assert policy.react(refused(ORDER_MOVED_ON[1], reread=seen), rng).reaction.value == reaction


def test_other_failures_never_trigger_a_read_back() -> None:
    policy = llm_like("retry")
    rng = random.Random(0)
    for f in (failure("error"), failure("timeout"), refused("Invalid reason")):
        assert policy.react(f, rng).reaction is Reaction.RETRY
    # A refused read is still information it moves on from.
    assert policy.react(refused(ORDER_MOVED_ON[0], read_only=True), rng).reaction is Reaction.CARRY_ON
    # The gold replay has no such reading: it is the scripted agent, unchanged.
    assert GoldPolicy(tool_errors_fatal=False).react(refused(ORDER_MOVED_ON[0]), rng).reaction is Reaction.CARRY_ON


def test_the_retail_read_back_names_the_order_and_recognises_the_change() -> None:
    db = fresh_db(DATA)
    args = gold_args(CANCEL, 0)
    check = reread("cancel_pending_order", args)
    assert check is not None and check.tool == "get_order_details"
    assert check.args == {"order_id": args["order_id"]}
    assert not check.landed(call_tool(db, "get_order_details", check.args))
    call_tool(db, "cancel_pending_order", args)
    assert check.landed(call_tool(db, "get_order_details", check.args))
    # Cancelled for the other reason is not this write.
    other = {**args, "reason": next(r for r in ("no longer needed", "ordered by mistake") if r != args["reason"])}
    other_check = reread("cancel_pending_order", other)
    assert other_check is not None and not other_check.landed(call_tool(db, "get_order_details", check.args))
    assert reread("get_order_details", {"order_id": args["order_id"]}) is None  # reads need none
    writes = [name for name, tool in TOOLS.items() if tool.writes]
    assert all(RETAIL_TOOLS[name].reread is not None for name in writes)


# ------------------------------------------------------------------------------ in the loop


@pytest.mark.parametrize("mode", ["no-tx", "saga", "checkpoint-replay"])
@pytest.mark.parametrize(("task", "step"), [(CANCEL, 0), (CANCEL_THEN_MODIFY, 1)])
def test_a_landed_write_refused_on_retry_is_read_back_and_not_repeated(
    rig: Any, mode: str, task: str, step: int
) -> None:
    # F2: the write lands, then the call fails. The agent retries; the tool refuses (the
    # order is no longer pending); the agent reads the order back and sees its change.
    write = gold_args(task, step)
    run = rig(mode, task, failing(task, step, FaultClass.F2), agent=only("retry"))
    assert run.outcome.reactions == ["retry", "reread", "carry_on"]
    name = gold_actions(TASKS[TRIAL[task]])[step]["name"]
    assert [n for n, a in run.delivered if a == write] == [name, name]  # the write and the refused retry
    assert run.delivered[-1] == ("get_order_details", {"order_id": write["order_id"]})
    assert len(run.ops(site(task, step), "write")) == 1  # it landed once
    assert len(run.ops(f"a0/task{task}/r{step}", "read")) == 1  # the read-back reached the DB
    assert run.outcome.steps == step + 3  # counted in the budget like any call
    assert run.outcome.committed and run.sha == goal_sha(task)


def test_before_the_read_back_a_refused_landed_write_was_retried_into_the_budget(rig: Any) -> None:
    # The control: an agent that does not read errors (a policy that never asks for a read
    # back) retries the refused write until its budget runs out.
    class Blind(LlmLikePolicy):
        def react(self, failure: Failure, rng: random.Random) -> Decision:
            return Decision(Reaction.RETRY)

    blind = Blind(1.0, 0.0, 0.0, 0.0, 0.0, 3, 6)
    run = rig("no-tx", CANCEL, failing(CANCEL, 0, FaultClass.F2), behaviour=blind)
    assert run.outcome.out_of_budget and not run.outcome.committed
    assert "reread" not in run.outcome.reactions and run.outcome.steps == 6


def test_a_refused_write_that_did_not_land_reacts_as_before_after_the_read_back(rig: Any) -> None:
    args = dict(gold_args(CANCEL, 0))
    other = {**args, "reason": next(r for r in ("no longer needed", "ordered by mistake") if r != args["reason"])}
    steps = (Step("cancel_pending_order", args), Step("cancel_pending_order", other))
    run = rig("no-tx", CANCEL, steps=steps, agent=only("carry_on"))
    assert run.outcome.reactions == ["reread", "carry_on"]
    assert [n for n, _ in run.delivered] == ["cancel_pending_order", "cancel_pending_order", "get_order_details"]
    assert run.outcome.results["step1"] == {"error": "Non-pending order cannot be cancelled"}


# ------------------------------------------------------------------------------ re-plans


@pytest.mark.parametrize("mode", ["tx-full", "no-tx"])
def test_a_replan_does_not_reissue_a_write_it_saw_succeed(rig: Any, mode: str) -> None:
    cancel = gold_args(CANCEL_THEN_MODIFY, 0)
    run = rig(mode, CANCEL_THEN_MODIFY, failing(CANCEL_THEN_MODIFY, 1), agent=only("replan", replan_depth=1))
    assert run.outcome.reactions == ["replan"]
    assert [a for n, a in run.delivered if n == "cancel_pending_order"] == [cancel]  # once
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 0)) == 1
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 1)) == 2
    assert run.outcome.steps == 3
    assert run.outcome.committed and run.sha == goal_sha(CANCEL_THEN_MODIFY)
    # An agent that forgets on every re-plan issues it again (and, the order being cancelled
    # already, meets the refusal and reads the order back).
    forgets = rig(mode, CANCEL_THEN_MODIFY, failing(CANCEL_THEN_MODIFY, 1),
                  agent=only("replan", replan_depth=1, forget_on_replan=1.0))
    assert [a for n, a in forgets.delivered if n == "cancel_pending_order"] == [cancel, cancel]
    assert forgets.injector.calls(site(CANCEL_THEN_MODIFY, 0)) == 2
    assert forgets.outcome.steps > run.outcome.steps
    assert forgets.sha == goal_sha(CANCEL_THEN_MODIFY)


class BackTo(LlmLikePolicy):
    """An llm-like agent whose every failure sends it back to step 7 (a fixed re-plan)."""

    def react(self, failure: Failure, rng: random.Random) -> Decision:
        return Decision(Reaction.REPLAN, to_step=7)


def test_a_deeper_replan_rereads_but_skips_the_writes_in_between(rig: Any) -> None:
    # Task 32: reads 0-7, cancel at 8, read 9, cancel at 10, read 11, return at 12.
    assert [a["name"] for a in gold_actions(TASKS[TRIAL[READS_THEN_CANCEL]])][8] == "cancel_pending_order"
    run = rig("tx-full", READS_THEN_CANCEL, failing(READS_THEN_CANCEL, 10, times=1),
              behaviour=BackTo(0.0, 0.0, 0.0, 1.0, 0.0, 3, 30))
    assert run.outcome.reactions == ["replan"]
    assert run.injector.calls(site(READS_THEN_CANCEL, 7)) == 2  # the reads from step 7 on: again
    assert run.injector.calls(site(READS_THEN_CANCEL, 8)) == 1  # the earlier cancel: never again
    assert run.injector.calls(site(READS_THEN_CANCEL, 9)) == 2
    assert run.injector.calls(site(READS_THEN_CANCEL, 10)) == 2
    assert run.outcome.committed and run.sha == goal_sha(READS_THEN_CANCEL)
    forgets = rig("tx-full", READS_THEN_CANCEL, failing(READS_THEN_CANCEL, 10, times=1),
                  behaviour=BackTo(0.0, 0.0, 0.0, 1.0, 0.0, 3, 30, forget_on_replan=1.0))
    # BackTo never sets `forget`, so the knob alone changes nothing: the policy decides.
    assert forgets.injector.calls(site(READS_THEN_CANCEL, 8)) == 1


def test_forget_on_replan_is_drawn_only_when_set() -> None:
    rng, again = random.Random(5), random.Random(5)
    plain = llm_like("replan").react(failure(), rng)
    assert not plain.forget
    assert llm_like("replan", forget_on_replan=0.0).react(failure(), again) == plain
    assert rng.getstate() == again.getstate()
    always = [llm_like("replan", forget_on_replan=1.0).react(failure(), rng).forget for _ in range(20)]
    assert all(always)


# ------------------------------------------------------------------------------ intrinsic errors


def test_the_mistake_is_drawn_once_per_task_and_only_when_the_rate_is_set() -> None:
    rng = random.Random(1)
    before = rng.getstate()
    assert llm_like().mistake([1, 4], rng) is None and rng.getstate() == before
    sure = llm_like(intrinsic_error=1.0)
    drawn = [sure.mistake([1, 4], random.Random(i)) for i in range(200)]
    assert all(m is not None and m.step in (1, 4) for m in drawn)
    kinds = [m.kind for m in drawn if m is not None]
    assert 60 < kinds.count("alter") < 140 and set(kinds) == {"alter", "stop"}
    assert sure.mistake([], random.Random(0)) is None  # nothing to get wrong in the state


def test_a_config_without_the_new_knobs_hashes_as_before() -> None:
    plain = AgentConfig(kind="llm-like", max_steps=30).model_dump()
    assert "intrinsic_error" not in plain and "forget_on_replan" not in plain
    assert AgentConfig(kind="llm-like", max_steps=30, intrinsic_error=0.2).model_dump()["intrinsic_error"] == 0.2
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError):
            AgentConfig(kind="llm-like", max_steps=30, intrinsic_error=bad)


def _fault_free(rate: float, seeds: range) -> list[dict[str, Any]]:
    agent = AgentConfig(kind="llm-like", max_steps=30, intrinsic_error=rate)
    return [run_trial(spec("tx-full", trial=t, agent=agent, seed=s)) for s in seeds for t in range(len(TASKS))]


def _writes(task_id: str) -> bool:
    return any(TOOLS[a["name"]].writes for a in gold_actions(TASKS[TRIAL[task_id]]))


def test_intrinsic_error_makes_fault_free_tasks_fail_at_about_the_configured_rate() -> None:
    rate = 0.3
    seeds = range(1, 11)  # 10 seeds x 30 tasks: 300 fault-free trials
    records = _fault_free(rate, seeds)
    writing = [r for r in records if _writes(r["agents"][0]["task"].removeprefix("task"))]
    mistaken = [r for r in writing if "mistake" in r["agents"][0]]
    # Every task that writes slips with probability `rate` (an exact binomial test, wide).
    assert stats.binomtest(len(mistaken), len(writing), rate).pvalue > 0.001
    assert not any("mistake" in r["agents"][0] for r in records if r not in writing)
    # A slip shows in the state (a wrong write, or one missing) nearly always; with no slip
    # the fault-free agent reaches the goal.
    unclean_mistaken = sum(not r["metrics"]["clean"] for r in mistaken) / len(mistaken)
    clean = [r for r in records if "mistake" not in r["agents"][0]]
    assert unclean_mistaken > 0.7
    assert sum(not r["metrics"]["clean"] for r in clean) / len(clean) < 0.05
    failed = sum(not r["metrics"]["clean"] for r in records) / len(records)
    assert 0.5 * rate < failed < 1.5 * rate
    # Without it, the same trials fail at most rarely.
    plain = _fault_free(0.0, range(1, 3))
    assert sum(not r["metrics"]["clean"] for r in plain) / len(plain) < 0.05
    assert not any("mistake" in r["agents"][0] for r in plain)


def test_a_higher_rate_only_adds_mistaken_tasks() -> None:
    low = _fault_free(0.15, range(1, 3))
    high = _fault_free(0.45, range(1, 3))
    slipped_low = {r["key"] + str(r["seed"]) for r in low if "mistake" in r["agents"][0]}
    slipped_high = {r["key"] + str(r["seed"]) for r in high if "mistake" in r["agents"][0]}
    assert slipped_low < slipped_high
    again = _fault_free(0.15, range(1, 3))
    assert [r["agents"] for r in again] == [r["agents"] for r in low]  # deterministic


def test_the_same_mistake_reaches_every_mode() -> None:
    faults = FaultConfig(rate=0.0)
    agent = AgentConfig(kind="llm-like", max_steps=30, intrinsic_error=0.5)
    for trial in range(8):
        records = [run_trial(spec(m, trial=trial, agent=agent, faults=faults)) for m in ("tx-full", "no-tx", "saga")]
        assert len({str(r["agents"][0].get("mistake")) for r in records}) == 1
        assert len({r["final"]["db_sha256"] for r in records}) == 1

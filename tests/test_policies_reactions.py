"""Agent policies' reactions to a failed call: the gold replay (retry step_retries times,
then restart; carry on after a refusal unless tool errors are fatal) and the seeded llm-like
reactions (retry, alter, carry on, replan, give up), each drawn by its weight and each doing
in the loop what it names.

Trials run on tau2 retail. Tests that need a fault at one exact call, or the op log, drive
`run_agent` on a hand-made rig with a scripted injector (the `rig` fixture, tests/policy_rig.py);
the others use `run_trial`.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from policy_rig import (
    CANCEL,
    CANCEL_THEN_MODIFY,
    DATA,
    INITIAL,
    READS_THEN_CANCEL,
    TASKS,
    TRIAL,
    WEIGHTS,
    ZERO,
    failing,
    failure,
    goal_sha,
    gold_args,
    only,
    site,
    spec,
    strip,
)

from atomix.effects import AbortSource
from harness.agents.policies import (
    AgentConfig,
    Decision,
    GoldPolicy,
    LlmLikePolicy,
    Reaction,
    make_policy,
)
from harness.agents.task import AgentPolicy, Step
from harness.experiment.trial import run_trial
from harness.workloads.retail import call_tool, fresh_db, gold_actions
from harness.workloads.retail.substrate import RETAIL_TOOLS
from harness.workloads.retail.tools import RetailToolError
from harness.world.faults import FaultClass, FaultConfig

# ------------------------------------------------------------------------------ gold


@pytest.mark.parametrize("retries", [0, 1, 2, 5])
def test_gold_retries_step_retries_times_then_restarts(retries: int) -> None:
    gold = GoldPolicy(step_retries=retries)
    rng = random.Random(0)
    for tries in range(1, retries + 1):
        assert gold.react(failure(tries=tries), rng) == Decision(Reaction.RETRY)
    last = gold.react(failure(tries=retries + 1), rng)
    assert last.reaction is Reaction.RESTART and not last.permanent
    assert last.source is AbortSource.TOOL_FAILURE
    timeout = gold.react(failure("timeout", tries=retries + 1), rng)
    assert timeout.reaction is Reaction.RESTART and timeout.source is AbortSource.TIMEOUT


def test_gold_reads_a_refusal_unless_tool_errors_are_fatal() -> None:
    rng = random.Random(0)
    for read_only in (False, True):
        refused = failure("refused", read_only=read_only)
        assert GoldPolicy(tool_errors_fatal=False).react(refused, rng).reaction is Reaction.CARRY_ON
        fatal = GoldPolicy(tool_errors_fatal=True).react(refused, rng)
        assert fatal.reaction is Reaction.RESTART and fatal.permanent


def test_make_policy_builds_gold_with_the_workloads_knobs() -> None:
    policy = make_policy(AgentConfig(max_steps=9, wrapper_retries_by_mode={"saga": 2}), "saga",
                         step_retries=5, tool_errors_fatal=False)
    assert policy == GoldPolicy(5, False, 9, 2)
    assert make_policy(AgentConfig(), "tx-full", step_retries=1, tool_errors_fatal=True) == GoldPolicy(1, True)


@pytest.mark.parametrize("retries", [0, 2, 3])
def test_gold_in_the_loop_retries_then_restarts_like_the_historical_agent(rig: Any, retries: int) -> None:
    policy = AgentPolicy(step_retries=retries, tool_errors_fatal=False)
    # Fail exactly step_retries + 1 deliveries of the only call: the first attempt gives up on
    # it, the second succeeds at once.
    for behaviour in (None, "config"):  # the loop's default agent, and the configured gold
        run = rig("tx-full", CANCEL, failing(CANCEL, 0, times=retries + 1), behaviour=behaviour,
                  policy=policy)
        assert run.outcome.reactions == ["retry"] * retries + ["restart"]
        assert run.outcome.attempts == 2 and run.outcome.committed
        assert run.outcome.steps == retries + 2 == run.injector.calls()
        assert run.sha == goal_sha(CANCEL)
    # One failure fewer: retried in place, no restart.
    run = rig("tx-full", CANCEL, failing(CANCEL, 0, times=retries), policy=policy)
    assert run.outcome.reactions == ["retry"] * retries
    assert run.outcome.attempts == 1 and run.outcome.committed


def test_gold_restarts_after_time_outs_with_the_timeout_abort_source(rig: Any) -> None:
    run = rig("tx-full", CANCEL, failing(CANCEL, 0, FaultClass.F5, times=3))
    assert run.outcome.reactions == ["retry", "retry", "restart"]
    assert run.outcome.aborts == ["timeout"]
    assert run.outcome.committed and run.sha == goal_sha(CANCEL)


def _refusal_steps() -> tuple[tuple[Step, ...], str]:
    """A look-up of a missing order (refused), then the real cancel of task 90."""
    missing = {"order_id": "#W0000000"}
    try:
        call_tool(fresh_db(DATA), "get_order_details", missing)
    except RetailToolError as exc:
        message = str(exc)
    else:  # pragma: no cover - the data would have to contain the order
        raise AssertionError("the missing order exists")
    cancel = Step("cancel_pending_order", gold_args(CANCEL, 0), save_as="cancel")
    return (Step("get_order_details", missing, save_as="lookup"), cancel), message


def test_gold_carries_on_after_a_refusal_with_the_error_in_memory(rig: Any) -> None:
    steps, message = _refusal_steps()
    run = rig("tx-full", CANCEL, steps=steps)  # retail: tool_errors_fatal=False
    assert run.outcome.committed
    assert run.outcome.reactions == ["carry_on"]
    assert run.outcome.results["lookup"] == {"error": message}
    assert run.outcome.results["cancel"]["status"] == "cancelled"
    assert run.outcome.steps == 2
    assert run.sha == goal_sha(CANCEL)


def test_gold_with_fatal_tool_errors_stops_at_a_refusal(rig: Any) -> None:
    steps, message = _refusal_steps()
    run = rig("tx-full", CANCEL, steps=steps, policy=AgentPolicy(tool_errors_fatal=True))
    assert not run.outcome.committed
    assert run.outcome.attempts == 1  # a refusal will not go away by starting over
    assert run.outcome.reactions == ["restart"]
    assert run.outcome.failure is not None and message in run.outcome.failure
    assert run.outcome.steps == 1
    assert run.sha == INITIAL


def test_gold_config_and_the_default_agent_give_identical_records() -> None:
    faults = FaultConfig(rate=0.3)
    for trial in range(6):
        default = run_trial(spec("tx-full", trial=trial, faults=faults))
        explicit = run_trial(spec("tx-full", trial=trial, faults=faults, agent=AgentConfig(kind="gold")))
        assert strip(default) == strip(explicit)


# ------------------------------------------------------------------------------ llm-like


def test_llm_like_is_deterministic_for_a_seed_and_records_its_reactions() -> None:
    agent = AgentConfig(kind="llm-like", max_steps=30)
    faults = FaultConfig(rate=0.3)
    drawn: set[str] = set()
    differs = False
    for trial in range(10):
        first = run_trial(spec("tx-full", trial=trial, agent=agent, faults=faults))
        again = run_trial(spec("tx-full", trial=trial, agent=agent, faults=faults))
        assert strip(first) == strip(again)
        reactions = first["agents"][0]["reactions"]
        assert set(reactions) <= {r.value for r in Reaction} - {"restart"}
        drawn.update(reactions)
        other = run_trial(spec("tx-full", trial=trial, agent=agent, faults=faults, seed=2))
        differs |= strip(other)["agents"] != strip(first)["agents"]
    assert len(drawn) >= 3  # several kinds of reaction were drawn
    assert differs  # and the seed matters


@pytest.mark.parametrize("reaction", WEIGHTS)  # the drawn reactions (not restart, not reread)
@pytest.mark.parametrize("kind", ["error", "timeout", "refused"])
def test_llm_like_with_all_weight_on_one_reaction_draws_that_reaction(reaction: str, kind: str) -> None:
    policy = make_policy(only(reaction, replan_depth=2), "tx-full", step_retries=2, tool_errors_fatal=True)
    assert isinstance(policy, LlmLikePolicy)
    rng = random.Random(7)
    for tries in (1, 2, 5):
        decision = policy.react(failure(kind, tries), rng)  # a failed or refused write
        assert decision.reaction.value == reaction
        if reaction == "replan":
            assert decision.to_step in (1, 2)  # 1 to replan_depth steps back from step 3
        if reaction == "give_up":
            expected = AbortSource.TIMEOUT if kind == "timeout" else AbortSource.TOOL_FAILURE
            assert decision.source is expected


def test_llm_like_replan_goes_back_one_to_depth_steps_never_before_the_first() -> None:
    policy = make_policy(only("replan", replan_depth=3), "tx-full", step_retries=2, tool_errors_fatal=True)
    rng = random.Random(0)
    targets = {policy.react(failure(step=5), rng).to_step for _ in range(200)}
    assert targets == {2, 3, 4}
    assert {policy.react(failure(step=1), rng).to_step for _ in range(50)} == {0}
    assert {policy.react(failure(step=0), rng).to_step for _ in range(20)} == {0}


def test_llm_like_weights_are_relative() -> None:
    policy = make_policy(AgentConfig(kind="llm-like", **{**ZERO, "retry": 3.0, "give_up": 1.0}, max_steps=30), "tx-full",
                         step_retries=2, tool_errors_fatal=True)
    rng = random.Random(11)
    drawn = [policy.react(failure(), rng).reaction for _ in range(4000)]
    share = drawn.count(Reaction.RETRY) / len(drawn)
    assert set(drawn) == {Reaction.RETRY, Reaction.GIVE_UP}
    assert 0.72 < share < 0.78


@pytest.mark.parametrize("reaction", WEIGHTS)
def test_llm_like_carries_on_after_a_refused_read_whatever_the_weights(reaction: str) -> None:
    policy = make_policy(only(reaction), "tx-full", step_retries=2, tool_errors_fatal=True)
    decision = policy.react(failure("refused", read_only=True), random.Random(0))
    assert decision.reaction is Reaction.CARRY_ON


def test_llm_like_refused_read_in_the_loop_is_carried_on_but_a_refused_write_is_not(rig: Any) -> None:
    steps, message = _refusal_steps()
    run = rig("tx-full", CANCEL, steps=steps, agent=only("give_up"))
    assert run.outcome.committed
    assert run.outcome.reactions == ["carry_on"]
    assert run.outcome.results["lookup"] == {"error": message}
    # The same agent meeting a refused write (the order is cancelled again, for the other
    # reason: another call, so no idempotency key makes it a duplicate) reads the order back
    # (the refusal says it is no longer pending), does not find its own change, and gives up.
    cancel = steps[1]
    args = dict(gold_args(CANCEL, 0))
    args["reason"] = next(r for r in ("no longer needed", "ordered by mistake") if r != args["reason"])
    run = rig("tx-full", CANCEL, steps=(cancel, Step("cancel_pending_order", args)), agent=only("give_up"))
    assert run.outcome.reactions == ["reread", "give_up"]
    assert run.outcome.steps == 3  # the cancel, the refused cancel, the read-back
    assert not run.outcome.committed
    assert run.sha == INITIAL


@pytest.mark.parametrize("fault", ["F1", "F2"])
def test_give_up_ends_the_task_and_leaves_nothing_under_tx_full(fault: str) -> None:
    faults = FaultConfig(rate=1.0, classes=fault)
    record = run_trial(spec("tx-full", CANCEL, agent=only("give_up"), faults=faults))
    (agent,) = record["agents"]
    assert agent["reactions"] == ["give_up"]
    assert not agent["committed"] and agent["failure"]
    assert agent["attempts"] == 1 and agent["steps"] == 1
    assert record["metrics"]["budget_exhausted"] == 0
    assert record["final"]["db_sha256"] == INITIAL
    if fault == "F2":
        # The control: without a transaction the ambiguous call's effect stays.
        plain = run_trial(spec("no-tx", CANCEL, agent=only("give_up"), faults=faults))
        assert plain["agents"][0]["reactions"] == ["give_up"]
        assert plain["final"]["db_sha256"] != INITIAL


@pytest.mark.parametrize("mode", ["tx-full", "saga"])
def test_give_up_after_an_earlier_write_landed_rolls_that_write_back(rig: Any, mode: str) -> None:
    run = rig(mode, CANCEL_THEN_MODIFY, failing(CANCEL_THEN_MODIFY, 1), agent=only("give_up"))
    assert run.outcome.reactions == ["give_up"]
    assert not run.outcome.committed and run.outcome.failure
    assert run.outcome.attempts == 1 and run.outcome.steps == 2
    assert [name for name, _ in run.delivered] == ["cancel_pending_order"]  # it did land
    assert run.sha == INITIAL


def test_carry_on_goes_on_to_the_next_step() -> None:
    record = run_trial(spec("tx-full", CANCEL_THEN_MODIFY, agent=only("carry_on"),
                            faults=FaultConfig(rate=1.0, classes="F1")))
    (agent,) = record["agents"]
    assert agent["reactions"] == ["carry_on", "carry_on"]
    assert agent["steps"] == 2 and agent["attempts"] == 1
    assert [f["site"] for f in record["faults"]] == [site(CANCEL_THEN_MODIFY, 0), site(CANCEL_THEN_MODIFY, 1)]
    assert agent["committed"]  # it took the failed calls as done
    assert not record["metrics"]["goal"]


def test_carry_on_in_the_loop_delivers_the_next_step_once(rig: Any) -> None:
    run = rig("tx-full", CANCEL_THEN_MODIFY, failing(CANCEL_THEN_MODIFY, 0), agent=only("carry_on"))
    assert run.outcome.reactions == ["carry_on"]
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 0)) == 1
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 1)) == 1
    assert [name for name, _ in run.delivered] == ["modify_pending_order_items"]
    assert run.outcome.committed


def test_alter_reissues_the_call_with_one_argument_changed(rig: Any) -> None:
    gold = gold_args(CANCEL, 0)
    # The control: a plain retry delivers the gold arguments.
    run = rig("tx-full", CANCEL, failing(CANCEL, 0), agent=only("retry"))
    assert run.delivered == [("cancel_pending_order", gold)]
    assert run.sha == goal_sha(CANCEL)
    run = rig("tx-full", CANCEL, failing(CANCEL, 0), agent=only("alter", max_steps=4))
    assert run.outcome.reactions[0] == "alter"
    assert run.injector.calls(site(CANCEL, 0)) >= 2  # the same step, issued again
    tool, args = run.delivered[0]  # the first delivery that reached the DB: the altered one
    assert tool == "cancel_pending_order"
    changed = {k for k in gold if args.get(k) != gold[k]}
    assert len(changed) == 1 and set(args) == set(gold)
    assert changed <= {"order_id", "reason"}
    assert run.sha != goal_sha(CANCEL)  # a plausible wrong action


def _payment_change() -> dict[str, Any]:
    """A valid modify_pending_order_payment: a pending order paid once, moved to another
    non-gift-card method of a user who has at least three."""
    db = fresh_db(DATA)
    for order_id, order in sorted(db["orders"].items()):
        methods = db["users"][order["user_id"]]["payment_methods"]
        history = order["payment_history"]
        if order["status"] != "pending" or len(history) != 1 or len(methods) < 3:
            continue
        for method_id, method in sorted(methods.items()):
            if method_id != history[0]["payment_method_id"] and method["source"] != "gift_card":
                return {"order_id": order_id, "payment_method_id": method_id}
    raise AssertionError("no suitable order in the retail DB")


def test_alter_on_a_payment_change_tries_another_argument_value(rig: Any) -> None:
    args = _payment_change()
    assert RETAIL_TOOLS["modify_pending_order_payment"].alternatives is not None
    step = (Step("modify_pending_order_payment", args, save_as="changed"),)
    control = rig("no-tx", CANCEL, failing(CANCEL, 0), agent=only("retry"), steps=step)
    assert control.delivered == [("modify_pending_order_payment", args)]
    run = rig("no-tx", CANCEL, failing(CANCEL, 0), agent=only("alter", max_steps=3), steps=step)
    assert run.outcome.reactions[0] == "alter"
    name, delivered = run.delivered[0]
    assert name == "modify_pending_order_payment"
    changed = {k for k in args if delivered[k] != args[k]}
    assert len(changed) == 1 and set(delivered) == set(args)
    db = fresh_db(DATA)
    user = db["users"][db["orders"][args["order_id"]]["user_id"]]
    if changed == {"payment_method_id"}:
        assert delivered["payment_method_id"] in user["payment_methods"]
    else:
        assert delivered["order_id"] in user["orders"]
    if run.outcome.committed and "error" not in run.outcome.results["changed"]:
        # It landed: the substrate holds the wrong action, not the requested one.
        order = run.env.extra["retail"].db["orders"][delivered["order_id"]]
        assert order["payment_history"][-2]["payment_method_id"] == delivered["payment_method_id"]


def test_replan_reissues_an_earlier_read(rig: Any) -> None:
    write = 8  # the first cancel of task 32, right after a get_order_details
    assert gold_actions(TASKS[TRIAL[READS_THEN_CANCEL]])[write - 1]["name"] == "get_order_details"
    plan = len(gold_actions(TASKS[TRIAL[READS_THEN_CANCEL]]))
    run = rig("tx-full", READS_THEN_CANCEL, failing(READS_THEN_CANCEL, write),
              agent=only("replan", replan_depth=1))
    assert run.outcome.reactions == ["replan"]
    reads = run.ops(site(READS_THEN_CANCEL, write - 1), "read")
    assert len(reads) == 2  # the read step went to the DB twice
    assert run.injector.calls(site(READS_THEN_CANCEL, write - 1)) == 2
    assert run.injector.calls(site(READS_THEN_CANCEL, write - 2)) == 1  # no further back
    assert run.outcome.steps == plan + 2  # the failed write and the re-read
    assert run.outcome.committed and run.sha == goal_sha(READS_THEN_CANCEL)
    # A plain retry reads once.
    run = rig("tx-full", READS_THEN_CANCEL, failing(READS_THEN_CANCEL, write), agent=only("retry"))
    assert len(run.ops(site(READS_THEN_CANCEL, write - 1), "read")) == 1

"""Agent policies (DESIGN.md section 4, configs/README.md "agent"): config validation, the
tau2 step budget, the gold replay, the seeded llm-like reactions, what a policy may see, and
that mode comparisons stay paired.

Trials run on tau2 retail. Tests that need a fault at one exact call, or the op log, drive
`run_agent` on a hand-made rig with a scripted injector; the others use `run_trial`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from atomix.effects import AbortSource
from harness.agents.policies import (
    AgentConfig,
    Decision,
    Failure,
    GoldPolicy,
    LlmLikePolicy,
    Policy,
    Reaction,
    make_policy,
)
from harness.agents.task import AgentOutcome, AgentPolicy, Step, run_agent
from harness.experiment.config import ConfigError, cell_config, expand_cells, validate_config
from harness.experiment.trial import TrialSpec, run_trial
from harness.modes.base import AgentContext, ModeSettings, get_mode, modes
from harness.workloads.retail import (
    call_tool,
    db_sha256,
    fresh_db,
    goal_db,
    gold_actions,
    load_retail,
)
from harness.workloads.retail.substrate import RETAIL_TOOLS
from harness.workloads.retail.tools import RetailToolError
from harness.workloads.retail.workload import TauRetailWorkload
from harness.world.boundary import Boundary
from harness.world.clock import VirtualClock
from harness.world.faults import FaultClass, FaultConfig, FaultInjector, InjectedFault, Point
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

WORKLOAD = TauRetailWorkload()
TASKS = WORKLOAD.tasks({})  # the default test split sample, as run_trial sees it
TRIAL = {task["id"]: index for index, task in enumerate(TASKS)}
DATA = load_retail()
INITIAL = db_sha256(fresh_db(DATA))

# Tasks used below (tau2 retail ids; their gold actions, R = read, W = write):
CANCEL = "90"  # W cancel_pending_order
CANCEL_THEN_MODIFY = "74"  # W cancel_pending_order, W modify_pending_order_items
READS_THEN_CANCEL = "32"  # R x8, W cancel (step 8), R, W cancel, R, W return
ZERO = {"retry": 0.0, "alter": 0.0, "carry_on": 0.0, "replan": 0.0, "give_up": 0.0}
WEIGHTS = tuple(ZERO)


def only(reaction: str, **more: Any) -> AgentConfig:
    """An llm-like agent that always reacts with `reaction`."""
    return AgentConfig(kind="llm-like", **{**ZERO, reaction: 1.0, "max_steps": 30, **more})


def spec(
    mode: str,
    task_id: str | None = None,
    *,
    trial: int | None = None,
    agent: AgentConfig | None = None,
    faults: FaultConfig | None = None,
    seed: int = 1,
) -> TrialSpec:
    index = TRIAL[task_id] if task_id is not None else trial
    assert index is not None
    return TrialSpec(
        "policies", "tau_retail", mode, "cell", {}, index, seed,
        faults=faults or FaultConfig(), agent=agent or AgentConfig(),
    )


def strip(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "timings"}


def goal_sha(task_id: str) -> str:
    return goal_db(DATA, TASKS[TRIAL[task_id]]).sha256


# ------------------------------------------------------------------------------ a rig


class Scripted(FaultInjector):
    """`script[(point, site)]` is the set of occurrences of that event to fault, with a class."""

    def __init__(self, script: dict[tuple[Point, str], tuple[FaultClass, set[int]]] | None = None) -> None:
        super().__init__(FaultConfig(rate=0.0), seed=0, cell="scripted", trial=0)
        self.script = script or {}
        self.asked: dict[tuple[Point, str], int] = {}

    def decide(self, point: Point, site: str, *, meta: dict[str, Any] | None = None) -> FaultClass | None:
        point = Point(point)
        occurrence = self.asked.get((point, site), 0)
        self.asked[(point, site)] = occurrence + 1
        index, self.events = self.events, self.events + 1
        fault, when = self.script.get((point, site), (None, set()))
        if fault is None or occurrence not in when:
            return None
        self.injected.append(InjectedFault(index, point, site, fault, occurrence))
        return fault

    def calls(self, site: str | None = None) -> int:
        """Forward deliveries that reached the boundary (of one site, or all)."""
        return sum(n for (p, s), n in self.asked.items() if p is Point.CALL and site in (None, s))


@dataclasses.dataclass
class Run:
    outcome: AgentOutcome
    env: TrialEnv
    injector: Scripted
    delivered: list[tuple[str, dict[str, Any]]]  # (tool, args) of calls that reached the DB

    @property
    def sha(self) -> str:
        return self.env.extra["retail"].snapshot()["db_sha256"]

    def ops(self, op_id: str, kind: str) -> list[Any]:
        return [op for op in self.env.oplog.ops() if op.meta.get("op") == op_id and op.kind == kind]


class Recording:
    """A policy wrapper recording every failure the agent loop hands it."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_steps = inner.max_steps
        self.wrapper_retries = inner.wrapper_retries
        self.seen: list[Failure] = []
        self.decided: list[Decision] = []

    def react(self, failure: Failure, rng: random.Random) -> Decision:
        self.seen.append(failure)
        decision = self.inner.react(failure, rng)
        self.decided.append(decision)
        return decision


def site(task_id: str, step: int) -> str:
    return f"a0/task{task_id}/{step}"


def failing(task_id: str, step: int, fault: FaultClass = FaultClass.F1, times: int = 1) -> Scripted:
    """Fault the first `times` deliveries of one step of the task."""
    return Scripted({(Point.CALL, site(task_id, step)): (fault, set(range(times)))})


@pytest.fixture
def rig() -> Iterator[Any]:
    envs: list[TrialEnv] = []

    def run(
        mode: str,
        task_id: str,
        injector: Scripted | None = None,
        *,
        agent: AgentConfig | None = None,
        behaviour: Policy | None | str = "config",
        policy: AgentPolicy | None = None,
        steps: tuple[Step, ...] | None = None,
        validate: tuple[int, ...] = (),
    ) -> Run:
        scenario = WORKLOAD.scenario(random.Random(0), TRIAL[task_id], {})
        env = TrialEnv.create()
        envs.append(env)
        scenario.setup(env)
        clock = VirtualClock()
        injector = injector or Scripted()
        boundary = Boundary(clock, injector, latency_ms=5.0, jitter_ms=0.0, rng=random.Random(0))
        settings = ModeSettings()
        trial = get_mode(mode).factory(env, clock, settings)
        policy = policy or scenario.policy
        if behaviour == "config":
            behaviour = make_policy(
                agent or AgentConfig(), mode,
                step_retries=policy.step_retries, tool_errors_fatal=policy.tool_errors_fatal,
            )
        delivered: list[tuple[str, dict[str, Any]]] = []

        def recorded(tool: ToolDef) -> ToolDef:
            def run_tool(env: TrialEnv, args: dict[str, Any], d: Delivery, tool: ToolDef = tool) -> Any:
                delivered.append((tool.name, dict(args)))
                return tool.run(env, args, d)

            return dataclasses.replace(tool, run=run_tool)

        tools = {name: recorded(tool) for name, tool in RETAIL_TOOLS.items()}
        task = scenario.tasks[0]
        if steps is not None:
            task = dataclasses.replace(task, steps=steps)
        if validate:
            task = dataclasses.replace(task, validate=validate)

        def make_ctx(attempt: int) -> AgentContext:
            return AgentContext("a0", attempt, f"policies/a0/{attempt}", env, clock, boundary, settings)

        agent_task = clock.spawn(
            run_agent(trial, make_ctx, task, tools, policy, random.Random(1), behaviour,  # type: ignore[arg-type]
                      random.Random(2)),
            "a0",
        )
        clock.run()
        if agent_task.error is not None:
            raise agent_task.error
        return Run(agent_task.result, env, injector, delivered)

    yield run
    for env in envs:
        env.close()


def gold_args(task_id: str, step: int) -> dict[str, Any]:
    return dict(gold_actions(TASKS[TRIAL[task_id]])[step]["arguments"])


# ------------------------------------------------------------------------------ 1. config


def test_agent_config_rejects_an_unknown_key() -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig.model_validate({"kind": "llm-like", "retires": 0.5})
    assert [e["loc"] for e in err.value.errors()] == [("retires",)]
    assert err.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, -math.inf])
def test_a_negative_or_non_finite_weight_is_rejected_naming_the_field(weight: str, value: float) -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig.model_validate({"kind": "llm-like", weight: value})
    errors = err.value.errors()
    assert [e["loc"] for e in errors] == [(weight,)]
    assert "finite" in errors[0]["msg"] and ">= 0" in errors[0]["msg"]


def test_llm_like_needs_a_step_budget() -> None:
    # Without one, weight only on retry would loop forever on a call that always fails.
    with pytest.raises(ValidationError, match="agent.max_steps"):
        AgentConfig(kind="llm-like", **{**ZERO, "retry": 1.0})


def test_a_failed_re_check_before_commit_is_a_tool_failure_not_a_stale_read(rig: Any) -> None:
    product = sorted(DATA.db["products"])[0]  # read, never written by the plan
    steps = (
        Step("get_product_details", {"product_id": product}, save_as="product"),
        Step("cancel_pending_order", gold_args(CANCEL, 0)),
    )
    recheck = Scripted({(Point.CALL, f"a0/task{CANCEL}/v0"): (FaultClass.F1, {0})})
    run = rig("tx-full", CANCEL, recheck, agent=only("carry_on"), steps=steps, validate=(0,))
    # The first attempt's re-check failed: a tool failure (the agent cannot tell whether its
    # read is stale), so tx-full aborts it cleanly and the fresh attempt commits.
    assert run.outcome.aborts == ["tool_failure"]
    assert run.outcome.committed and run.outcome.attempts == 2
    assert run.sha == goal_sha(CANCEL)


def test_all_zero_llm_like_weights_are_rejected_but_gold_ignores_the_weights() -> None:
    with pytest.raises(ValidationError, match="at least one reaction weight"):
        AgentConfig(kind="llm-like", **ZERO, max_steps=30)
    AgentConfig(kind="llm-like", **{**ZERO, "give_up": 1e-9}, max_steps=30)  # tiny but positive: fine
    assert AgentConfig(kind="gold", **ZERO).kind == "gold"


@pytest.mark.parametrize(
    ("key", "value"),
    [("kind", "gpt"), ("max_steps", 0), ("max_steps", 10_001), ("wrapper_retries", -1),
     ("wrapper_retries", 21), ("replan_depth", 0)],
)
def test_out_of_range_agent_values_are_rejected_naming_the_field(key: str, value: Any) -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig.model_validate({key: value})
    assert [e["loc"][0] for e in err.value.errors()] == [key]


def test_wrapper_retries_by_mode_rejects_an_unknown_mode_naming_the_allowed_ones() -> None:
    with pytest.raises(ValidationError) as err:
        AgentConfig(wrapper_retries_by_mode={"tx-full": 1, "tx-fulll": 2})
    message = str(err.value)
    assert "tx-fulll" in message
    assert "allowed:" in message
    for mode in modes():
        assert mode in message.split("allowed:", 1)[1]
    with pytest.raises(ValidationError, match="saga"):
        AgentConfig(wrapper_retries_by_mode={"saga": 21})
    config = AgentConfig(wrapper_retries=1, wrapper_retries_by_mode={"saga": 3})
    assert config.wrapper_retries_for("saga") == 3
    assert config.wrapper_retries_for("tx-full") == 1


def _experiment(**agent: Any) -> dict[str, Any]:
    return {
        "name": "policies",
        "workload": "tau_retail",
        "trials": 2,
        "modes": ["tx-full", "no-tx"],
        "agent": agent,
    }


def test_an_experiment_config_takes_an_agent_section_and_a_cell_can_override_its_kind() -> None:
    data = _experiment(kind="llm-like", max_steps=30)
    config = validate_config(data, "p.yaml")
    assert config.agent.kind == "llm-like"
    assert config.agent.max_steps == 30
    assert config.agent == AgentConfig(kind="llm-like", max_steps=30)

    data["grid"] = {"agent.kind": ["gold", "llm-like"]}
    config = validate_config(data, "p.yaml")
    cells = expand_cells(config)
    assert [c["agent.kind"] for c in cells] == ["gold", "llm-like"]
    kinds = [cell_config(config, c).agent for c in cells]
    assert [a.kind for a in kinds] == ["gold", "llm-like"]
    assert all(a.max_steps == 30 for a in kinds)  # the rest of the section is kept


def test_a_bad_agent_section_or_cell_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        validate_config(_experiment(kind="llm-like", retires=1), "p.yaml")
    assert "agent.retires" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config(_experiment(kind="llm-like", give_up=-1), "p.yaml")
    assert "agent.give_up" in str(err.value)
    data = _experiment(kind="gold")
    data["grid"] = {"agent.kind": ["gold", "gpt"]}
    with pytest.raises(ConfigError) as err:
        validate_config(data, "p.yaml")
    assert "agent.kind" in str(err.value) and "gpt" in str(err.value)
    # A cell that zeroes the last llm-like weight is reported by its label.
    data = _experiment(kind="llm-like", max_steps=30, **{**ZERO, "retry": 1.0})
    data["grid"] = {"agent.retry": [1.0, 0.0]}
    with pytest.raises(ConfigError) as err:
        validate_config(data, "p.yaml")
    assert "agent.retry=0.0" in str(err.value) and "at least one reaction weight" in str(err.value)


# ------------------------------------------------------------------------------ 2. budget


@pytest.mark.parametrize("max_steps", [1, 4, 7])
def test_the_budget_caps_the_calls_issued_and_each_call_is_one_delivery(max_steps: int) -> None:
    # Every call fails and the agent always retries: only the budget stops it.
    record = run_trial(spec("tx-full", CANCEL_THEN_MODIFY, agent=only("retry", max_steps=max_steps),
                            faults=FaultConfig(rate=1.0, classes="F1")))
    (agent,) = record["agents"]
    assert agent["steps"] == record["metrics"]["steps"] == max_steps
    # Deliveries counted below the agent (one injected fault per delivery here).
    assert len([f for f in record["faults"] if f["point"] == "call"]) == max_steps
    assert agent["reactions"] == ["retry"] * max_steps
    assert not agent["committed"]
    assert "step budget" in agent["failure"]
    assert record["metrics"]["budget_exhausted"] == 1


@pytest.mark.parametrize("mode", ["tx-full", "no-tx", "saga", "checkpoint-replay", "retry-only"])
def test_no_agent_ever_issues_more_calls_than_its_budget(mode: str) -> None:
    exhausted = 0
    for trial in range(12):
        record = run_trial(spec(mode, trial=trial, agent=AgentConfig(kind="llm-like", max_steps=6),
                                faults=FaultConfig(rate=0.35)))
        (agent,) = record["agents"]
        assert agent["steps"] <= 6, (trial, agent)
        if record["metrics"]["budget_exhausted"]:
            exhausted += 1
            assert agent["steps"] == 6
            assert "step budget" in agent["failure"]
            assert not agent["committed"]
    assert exhausted > 0  # the budget was exercised


def test_a_budget_equal_to_the_plan_is_enough_and_one_less_is_not() -> None:
    plan = len(gold_actions(TASKS[TRIAL[READS_THEN_CANCEL]]))
    enough = run_trial(spec("tx-full", READS_THEN_CANCEL, agent=AgentConfig(max_steps=plan)))
    assert enough["metrics"]["goal"] and enough["agents"][0]["committed"]
    assert enough["metrics"]["steps"] == plan and enough["metrics"]["budget_exhausted"] == 0
    short = run_trial(spec("tx-full", READS_THEN_CANCEL, agent=AgentConfig(max_steps=plan - 1)))
    assert not short["agents"][0]["committed"]
    assert short["metrics"]["steps"] == plan - 1 and short["metrics"]["budget_exhausted"] == 1
    assert short["final"]["db_sha256"] == INITIAL  # the writes before it were rolled back


@pytest.mark.parametrize("mode", ["tx-full", "saga"])
def test_a_restart_reissues_its_calls_and_pays_for_them(rig: Any, mode: str) -> None:
    # The cancel (step 0) lands every attempt; the modify (step 1) always fails. Gold retries
    # it step_retries=2 times, then restarts: each attempt costs 1 + 3 calls.
    doomed = failing(CANCEL_THEN_MODIFY, 1, times=100)
    run = rig(mode, CANCEL_THEN_MODIFY, doomed)
    attempts = AgentPolicy().max_attempts
    assert run.outcome.attempts == attempts
    assert run.outcome.steps == attempts * 4
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 0)) == attempts
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 1)) == attempts * 3
    assert run.injector.calls() == run.outcome.steps
    assert run.outcome.reactions == ["retry", "retry", "restart"] * attempts
    assert not run.outcome.committed
    assert run.sha == INITIAL  # every attempt was aborted and its cancel undone


@pytest.mark.parametrize("mode", ["tx-full", "saga"])
def test_an_exhausted_budget_ends_the_task_and_aborts_its_transaction(rig: Any, mode: str) -> None:
    doomed = failing(CANCEL_THEN_MODIFY, 1, times=100)
    run = rig(mode, CANCEL_THEN_MODIFY, doomed, agent=AgentConfig(max_steps=10))
    # Attempts 1 and 2 cost 4 calls each; attempt 3 issues the cancel (landed) and one modify.
    assert run.outcome.steps == 10 == run.injector.calls()
    assert run.outcome.attempts == 3
    assert run.outcome.failure is not None and "step budget" in run.outcome.failure
    assert not run.outcome.committed
    assert len(run.outcome.aborts) == 3
    assert run.injector.calls(site(CANCEL_THEN_MODIFY, 0)) == 3
    assert run.sha == INITIAL  # the third attempt's cancel was rolled back too
    # In the op log, each attempt's cancel was written and then restored.
    cancels = run.ops(site(CANCEL_THEN_MODIFY, 0), "write")
    assert [op.meta["attempt"] for op in cancels if not op.meta.get("undo")] == [1, 2, 3]
    assert [op.meta["attempt"] for op in cancels if op.meta.get("undo")] == [1, 2, 3]
    assert cancels[-1].meta.get("undo")


def test_without_restarts_the_agent_does_not_start_over(rig: Any) -> None:
    # no-tx cannot undo the cancel, so the gold agent reports the failure instead of repeating it.
    run = rig("no-tx", CANCEL_THEN_MODIFY, failing(CANCEL_THEN_MODIFY, 1, times=100))
    assert run.outcome.attempts == 1
    assert run.outcome.steps == 4 == run.injector.calls()
    assert not run.outcome.committed
    assert run.sha != INITIAL  # the cancel stays: what "aborted" means under tx-full is not free


def test_wrapper_retries_are_not_charged_to_the_budget() -> None:
    agent = only("retry", max_steps=4, wrapper_retries=2)
    record = run_trial(spec("tx-full", CANCEL, agent=agent, faults=FaultConfig(rate=1.0, classes="F1")))
    assert record["metrics"]["steps"] == 4
    assert record["agents"][0]["reactions"] == ["retry"] * 4  # the agent saw 4 failures
    assert len(record["faults"]) == 4 * 3  # each call was delivered three times below it


def test_wrapper_retries_by_mode_apply_to_that_mode_only() -> None:
    agent = only("retry", max_steps=3, wrapper_retries_by_mode={"tx-full": 1})
    faults = FaultConfig(rate=1.0, classes="F1")
    full = run_trial(spec("tx-full", CANCEL, agent=agent, faults=faults))
    plain = run_trial(spec("no-tx", CANCEL, agent=agent, faults=faults))
    assert full["metrics"]["steps"] == plain["metrics"]["steps"] == 3
    assert len(full["faults"]) == 6
    assert len(plain["faults"]) == 3


def test_a_failure_absorbed_by_the_wrapper_is_never_seen_by_the_agent(rig: Any) -> None:
    flaky = failing(CANCEL_THEN_MODIFY, 1, times=2)
    run = rig("tx-full", CANCEL_THEN_MODIFY, flaky, agent=AgentConfig(max_steps=2, wrapper_retries=2))
    assert run.outcome.committed
    assert run.outcome.reactions == []
    assert run.outcome.steps == 2
    assert run.injector.calls() == 4
    assert run.sha == goal_sha(CANCEL_THEN_MODIFY)


# ------------------------------------------------------------------------------ 3. gold


def failure(kind: str = "error", tries: int = 1, *, read_only: bool = False, step: int = 3) -> Failure:
    return Failure(step, "cancel_pending_order", kind, "call failed", tries, read_only)  # type: ignore[arg-type]


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


# ------------------------------------------------------------------------------ 4. llm-like


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


@pytest.mark.parametrize("reaction", [r.value for r in Reaction if r is not Reaction.RESTART])
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
    # reason: another call, so no idempotency key makes it a duplicate) gives up.
    cancel = steps[1]
    args = dict(gold_args(CANCEL, 0))
    args["reason"] = next(r for r in ("no longer needed", "ordered by mistake") if r != args["reason"])
    run = rig("tx-full", CANCEL, steps=(cancel, Step("cancel_pending_order", args)), agent=only("give_up"))
    assert run.outcome.reactions == ["give_up"]
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


# ------------------------------------------------------------------------------ 5. blind to class


@pytest.mark.parametrize(("task_id", "step"), [(READS_THEN_CANCEL, 2), (READS_THEN_CANCEL, 8), (CANCEL, 0)])
@pytest.mark.parametrize("mode", ["tx-full", "no-tx"])
@pytest.mark.parametrize("kind", ["gold", "llm-like"])
def test_the_policy_sees_the_same_failure_under_f1_and_f2(
    rig: Any, task_id: str, step: int, mode: str, kind: str
) -> None:
    seen = {}
    for fault in (FaultClass.F1, FaultClass.F2):
        scenario = WORKLOAD.scenario(random.Random(0), TRIAL[task_id], {})
        agent = AgentConfig(kind=kind, max_steps=40)  # type: ignore[arg-type]
        recorder = Recording(make_policy(agent, mode, step_retries=scenario.policy.step_retries,
                                         tool_errors_fatal=scenario.policy.tool_errors_fatal))
        rig(mode, task_id, failing(task_id, step, fault), behaviour=recorder)
        assert recorder.seen, fault
        seen[fault] = recorder.seen[0]
    assert seen[FaultClass.F1] == seen[FaultClass.F2]
    first = seen[FaultClass.F1]
    assert first.step == step and first.kind == "error" and first.tries == 1
    assert "F1" not in first.message and "F2" not in first.message


def test_failure_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        failure().kind = "refused"  # type: ignore[misc]


# ------------------------------------------------------------------------------ 6. paired modes


PAIRED = ["tx-full", "no-tx", "saga", "tcc", "checkpoint-replay", "occ"]


def test_modes_compared_without_faults_meet_the_same_agent() -> None:
    # Without faults the only failed calls are the refusals in tau2's gold trajectories (a
    # look-up of an unknown user, an exchange of an order not yet delivered): every mode meets
    # them identically, so reactions, steps and final DB agree.
    agent = AgentConfig(kind="llm-like", max_steps=30)
    empty = 0
    for trial in (0, 2, 8, 17, 21, 27):
        records = [run_trial(spec(mode, trial=trial, agent=agent)) for mode in PAIRED]
        assert len({r["final"]["db_sha256"] for r in records}) == 1, trial
        assert len({tuple(r["agents"][0]["reactions"]) for r in records}) == 1, trial
        assert len({r["metrics"]["steps"] for r in records}) == 1, trial
        assert all(r["exercised"]["faults_total"] == 0 for r in records)
        empty += records[0]["agents"][0]["reactions"] == []
    assert empty >= 3


def test_modes_meet_the_same_first_reaction_on_the_same_fault_draws() -> None:
    # Until the mechanisms diverge, every mode makes the same calls, meets the same faults
    # (Bernoulli draws are per call) and draws the same reactions from its own stream.
    agent = AgentConfig(kind="llm-like", max_steps=30)
    faults = FaultConfig(rate=0.3, classes="F1")
    exercised = 0
    for trial in range(12):
        records = [run_trial(spec(mode, trial=trial, agent=agent, faults=faults))
                   for mode in ("tx-full", "no-tx", "saga")]
        firsts = {tuple(r["agents"][0]["reactions"][:1]) for r in records}
        assert len(firsts) == 1, (trial, [r["agents"] for r in records])
        exercised += bool(next(iter(firsts)))
    assert exercised > 3


def test_reactions_do_not_shift_with_the_agents_think_time() -> None:
    # Reactions draw from their own stream: drawing plan delays must not change them. One
    # agent (no contention), F1 only (no effect lands), so both runs make the same calls.
    agent = AgentConfig(kind="llm-like", **{**ZERO, "retry": 1.0, "alter": 1.0, "carry_on": 1.0}, max_steps=30)
    faults = FaultConfig(rate=0.5, classes="F1")
    several = 0
    for trial in range(12):
        reactions = []
        for delay in ([0.0, 0.0], [20.0, 120.0]):
            params = {"agents": 1, "contended": 1, "plan_delay_ms": delay}
            record = run_trial(TrialSpec("policies", "tau_contention", "tx-full", "cell", {}, trial, 1,
                                         faults=faults, params=params, agent=agent))
            reactions.append(record["agents"][0]["reactions"])
        assert reactions[0] == reactions[1], trial
        several += len(reactions[0]) >= 2
    assert several >= 3

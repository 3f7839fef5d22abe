"""Retry budgets: every registered mode declares how many deliveries of one effect it makes
below the agent (harness.modes.base.RetryBudget), and that is what it does.

The behavioural tests drive each mode's session on real substrates (files, SQLite, the
append-only mailbox) through a fault boundary whose injector fails every delivery of a phase
(the call, or the commit), and count the deliveries the boundary saw. Whether a mode delivers
an effect at call time or holds it for commit is observed from a run without faults, never
assumed, so a new mode row is checked the same way.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from harness.agents.policies import AgentConfig
from harness.agents.task import Step, Task, declared_scopes
from harness.experiment.config import ConfigError, load_config
from harness.experiment.record import TrialRecord
from harness.experiment.runner import plan, read_records, run
from harness.experiment.trial import run_trial
from harness.modes.base import (
    Aborted,
    AgentContext,
    DeliveryLimits,
    ModeSettings,
    RetryBudget,
    TrialMode,
)
from harness.modes.registry import MODES, get_mode
from harness.workloads.synthetic import TOOLS, setup
from harness.world import faults
from harness.world.boundary import Boundary
from harness.world.clock import VirtualClock
from harness.world.faults import FaultClass, FaultConfig, FaultInjector, Point
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolCall, ToolError

ROOT = Path(__file__).resolve().parents[1]
SITE = "a0/t/0"
# Native bounds unlike the defaults, and `retries:` bounds unlike them and each other, so a
# mode reading the wrong one is caught.
NATIVE = ModeSettings(apply_attempts=5, step_retries=1, backoff_ms=1.0)
LIMITED = ModeSettings(
    apply_attempts=5, step_retries=1, backoff_ms=1.0,
    retries=DeliveryLimits(call=3, apply=2, confirm=4, resend=6),
)
CALLS = {
    "bufferable": ToolCall(TOOLS["buf_put"], {"name": "k0", "value": 7}, op_id=SITE),
    "irreversible": ToolCall(
        TOOLS["send"], {"to": "dave@example.com", "subject": "s", "body": "b"}, op_id=SITE
    ),
    "reversible": ToolCall(TOOLS["book"], {"slot": 0, "who": "a0"}, op_id=SITE),
}


class PhaseFaults(FaultInjector):
    """Fails every forward delivery (F1: nothing lands) while `failing` names the current
    phase, and counts the forward deliveries of each phase."""

    def __init__(self, failing: str | None) -> None:
        super().__init__(FaultConfig(rate=0.0), seed=0, cell="budget", trial=0)
        self.failing = failing
        self.phase = "call"
        self.counts = {"call": 0, "commit": 0}

    def decide(self, point: Point, site: str, *args: Any, **kwargs: Any) -> FaultClass | None:
        if Point(point) is not Point.CALL:
            return None
        self.counts[self.phase] += 1
        return FaultClass.F1 if self.phase == self.failing else None


def deliveries(mode: str, kind: str, settings: ModeSettings, failing: str | None) -> dict[str, int]:
    """One agent attempt making one call of `kind`, then committing, under `mode`: the
    forward deliveries the boundary saw in the call phase and in the commit phase."""
    env = TrialEnv.create()
    try:
        setup(env)
        clock = VirtualClock()
        injector = PhaseFaults(failing)
        boundary = Boundary(clock, injector, latency_ms=1.0, jitter_ms=0.0, rng=random.Random(0))
        trial = get_mode(mode).factory(env, clock, settings)
        call = CALLS[kind]
        ctx = AgentContext("a0", 1, "budget/a0/1", env, clock, boundary, settings)
        task = Task("t", (Step(call.name, dict(call.args)),))
        ctx.extra["declared_scopes"] = declared_scopes(task, TOOLS, env)
        session = trial.session(ctx)

        async def attempt() -> None:
            await session.begin()
            try:
                await session.call(call)
            except (faults.ToolFault, ToolError):
                pass
            injector.phase = "commit"
            try:
                await session.commit()
            except Aborted:
                pass

        task_ = clock.spawn(attempt(), "a0")
        clock.run()
        if task_.error is not None:
            raise task_.error
        return injector.counts
    finally:
        env.close()


def commit_bound(budget: RetryBudget) -> int:
    held = [n for n in (budget.apply, budget.confirm, budget.resend) if n]
    assert len(held) <= 1, f"a mode has at most one kind of commit-time delivery: {budget}"
    return held[0] if held else 0


@pytest.mark.parametrize("settings", [NATIVE, LIMITED], ids=["native", "retries"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_delivers_what_its_budget_declares(mode: str, settings: ModeSettings) -> None:
    budget = get_mode(mode).budget(settings)
    held_any = False
    for kind in CALLS:
        clean = deliveries(mode, kind, settings, failing=None)
        # Without faults an effect is delivered once: when the call is made, or at commit
        # (tcc's try is a round trip at call time, and its confirm delivers at commit).
        assert clean["call"] in (0, 1) and clean["commit"] in (0, 1), (kind, clean)
        at_call = deliveries(mode, kind, settings, failing="call")
        assert at_call["call"] == clean["call"] * budget.call, (kind, budget, at_call)
        at_commit = deliveries(mode, kind, settings, failing="commit")
        assert at_commit["call"] == clean["call"]
        assert at_commit["commit"] == clean["commit"] * commit_bound(budget), (kind, budget, at_commit)
        held_any |= clean["commit"] == 1
    # A declared commit-time bound is exercised by some effect, and only then.
    assert held_any == (commit_bound(budget) > 0), budget


def test_budgets_follow_the_settings_and_the_retries_bounds() -> None:
    assert get_mode("tx-full").budget(NATIVE) == RetryBudget(apply=5)
    assert get_mode("tx-full").budget(LIMITED) == RetryBudget(apply=2)
    assert get_mode("tcc").budget(LIMITED) == RetryBudget(confirm=4)
    assert get_mode("mutex-wal").budget(NATIVE) == RetryBudget(resend=5)
    assert get_mode("retry-only").budget(NATIVE) == RetryBudget(call=2)
    assert get_mode("retry-only").budget(LIMITED) == RetryBudget(call=3)
    # A mode without a retry loop has nothing to bound: it delivers once whatever the bound.
    assert get_mode("no-tx").budget(LIMITED) == RetryBudget()
    assert RetryBudget(apply=8).compact() == "apply×8"
    assert RetryBudget(call=3).compact() == "call×3"
    assert RetryBudget().compact() == "call×1"


def test_every_registered_mode_declares_a_budget() -> None:
    for name in MODES:
        budget = get_mode(name).budget(ModeSettings())
        assert isinstance(budget, RetryBudget) and budget.call >= 1, name

    def bare(env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> TrialMode:
        raise AssertionError("not built")

    from harness.modes.base import declared_budget

    with pytest.raises(TypeError, match="declares no delivery budget"):
        declared_budget(bare, ModeSettings())


def test_mode_settings_default_to_the_configs_defaults() -> None:
    from harness.experiment.config import SettingsModel

    assert SettingsModel().mode_settings() == ModeSettings()


# ------------------------------------------------------------------------------ config


def _config(tmp_path: Path, retries: str, extra: str = "") -> Path:
    path = tmp_path / "budget.yaml"
    path.write_text(
        "workload: synthetic\ntrials: 2\nmodes: [tx-full, retry-only, tcc, mutex-wal, no-tx]\n"
        "faults: {rate: 0.3, classes: F1}\n" + extra + retries,
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("retries", "expected"),
    [
        ("retries: {}\n", "retries: give `deliveries`"),
        ("retries: {deliveries: 0}\n", "retries.deliveries: Input should be greater than or equal to 1"),
        ("retries: {deliveries: 21}\n", "retries.deliveries: Input should be less than or equal to 20"),
        ("retries: {deliveries: true}\n", "retries.deliveries: Input should be a valid integer"),
        ("retries: {deliveries: 1.5}\n", "retries.deliveries: Input should be a valid integer"),
        ("retries: {delivery: 1}\n", "unknown key retries.delivery; did you mean retries.deliveries?"),
        ("retries: {resends: 1}\n", "unknown key retries.resends; did you mean retries.resend?"),
        ("retries: 1\n", "retries: Input should be a valid dictionary"),
    ],
)
def test_bad_retries_sections_name_file_key_and_what_is_allowed(
    tmp_path: Path, retries: str, expected: str
) -> None:
    path = _config(tmp_path, retries)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and expected in str(info.value)


def test_retries_refuse_per_mode_wrapper_retries(tmp_path: Path) -> None:
    extra = "agent: {wrapper_retries_by_mode: {tx-full: 3}}\n"
    with pytest.raises(ConfigError, match=r"retries: gives every mode the same delivery budget"):
        load_config(_config(tmp_path, "retries: {deliveries: 1}\n", extra))
    # A uniform wrapper is the same for every mode, so it stays allowed.
    load_config(_config(tmp_path, "retries: {deliveries: 1}\n", "agent: {wrapper_retries: 1}\n"))


def test_retries_reach_every_trial_and_keep_old_config_hashes(tmp_path: Path) -> None:
    from harness.experiment.config import config_hash

    path = _config(tmp_path, "")
    native = load_config(path)
    assert "retries" not in native.model_dump(mode="json")  # configs without it hash as before
    matched = load_config(path, overrides={"retries.deliveries": 1, "retries.apply": 2})
    assert config_hash(matched) != config_hash(native)
    for spec in plan(matched):
        assert spec.settings.retries == DeliveryLimits(call=1, apply=2, confirm=1, resend=1)
    with pytest.raises(ConfigError, match=r"--set retries.deliverie: unknown key"):
        load_config(path, overrides={"retries.deliverie": 1})


# ------------------------------------------------------------------------------ records


def test_the_record_holds_the_budget_the_trial_ran_with(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, "retries: {deliveries: 1}\n"))
    specs = {s.mode: s for s in plan(config) if s.trial == 0}
    record = run_trial(specs["tx-full"])
    # Every key the record type requires (the runner adds the hash); optional ones only when
    # the workload has them (this one has no task reward).
    # (NotRequired is invisible to the TypedDict under postponed annotations: read the text.)
    optional = {k for k, v in TrialRecord.__annotations__.items() if "NotRequired[" in str(v)}
    assert set(TrialRecord.__annotations__) - optional <= {*record, "config_hash"}
    assert {*record, "config_hash"} <= set(TrialRecord.__annotations__)
    assert "reward" not in record and "retry" not in record and "data_version" not in record
    assert record["budget"] == {
        "mode": {"call": 1, "apply": 1, "confirm": 0, "resend": 0},
        "agent": {"kind": "gold", "step_retries": 2, "max_attempts": 4, "max_steps": None,
                  "wrapper_retries": 0},
        "retries": {"call": 1, "apply": 1, "confirm": 1, "resend": 1},
    }
    assert run_trial(specs["retry-only"])["budget"]["mode"]["call"] == 1
    native = load_config(_config(tmp_path, ""))
    spec = next(s for s in plan(native) if s.mode == "retry-only")
    retry_only = run_trial(spec)["budget"]
    assert retry_only["mode"]["call"] == 3 and retry_only["retries"] == {}


def test_llm_like_agents_record_their_caps_not_a_retry_count() -> None:
    from harness.agents.budget import agent_budget

    config = AgentConfig(kind="llm-like", max_steps=30, wrapper_retries_by_mode={"tcc": 2})
    budget = agent_budget(config, "tcc", step_retries=2, max_attempts=4)
    assert budget.step_retries is None and budget.max_steps == 30 and budget.wrapper_retries == 2
    assert budget.compact() == "llm-like (retries drawn; max_steps 30, 4 attempts)"


def test_the_caption_and_the_reproduction_section_say_each_budget(tmp_path: Path) -> None:
    from harness.analysis.runs import load_run, write_run_report
    from harness.paper.budgets import budgets_markdown

    config = load_config(_config(tmp_path, "retries: {deliveries: 1, confirm: 2}\n"))
    result = run(config, out=tmp_path / "out", jobs=1)
    records = read_records(result.records_path)
    assert all("budget" in json.loads(json.dumps(r)) for r in records)
    report = write_run_report(load_run(result.run_dir))
    assert report.main is not None
    caption = report.main.footer
    assert "Delivery attempts per effect below the agent (retries: call=1, apply=1, confirm=2, resend=1)" in caption
    assert "tx-full apply×1; retry-only, no-tx call×1; tcc confirm×2; mutex-wal resend×1" in caption
    assert "Agent: gold (retries a failed call 2×; 4 attempts)." in caption
    md = (result.run_dir / "tables" / "clean.md").read_text(encoding="utf-8")
    assert "tcc confirm×2" in md
    section = budgets_markdown([config, load_config(_config(tmp_path, ""))])
    assert section.startswith("## Retry budgets\n")
    assert "| `budget` | all | retries: call=1, apply=1, confirm=2, resend=1 |" in section
    assert "tx-full apply×8; retry-only call×3; tcc confirm×8; mutex-wal resend×8; no-tx call×1" in section


def test_a_table_of_records_without_budgets_says_nothing_about_them() -> None:
    from harness.analysis.records import records_frame
    from harness.analysis.table import TableSpec, build_table

    records = [
        {"key": f"k{i}", "mode": "tx-full", "cell_id": "c", "cell": {}, "trial": i, "seed": 0,
         "metrics": {"clean": bool(i % 2)}}
        for i in range(4)
    ]
    table = build_table(records_frame(records), TableSpec("clean", "clean", "proportion"))
    assert table.budget == "" and "Delivery" not in table.footer

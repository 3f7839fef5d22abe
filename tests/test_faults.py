"""Tests of the fault injector (harness/world/faults.py)."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from harness.world.faults import (
    FAULTS,
    CompensationFailed,
    FaultClass,
    FaultConfig,
    FaultInjector,
    Point,
    Role,
    ToolCallFailed,
    ToolFault,
    ToolTimeout,
    compensate,
    deliver,
    derive_trial_seed,
)

ROOT = Path(__file__).resolve().parents[1]


def injector(
    seed: int = 7, cell: str = "cell-a", trial: int = 0, **config: object
) -> FaultInjector:
    return FaultInjector(FaultConfig(**config), seed=seed, cell=cell, trial=trial)


def run(inj: FaultInjector, n: int, point: Point = Point.CALL) -> list[FaultClass | None]:
    return [inj.decide(point, f"agent0/step{i}/try0") for i in range(n)]


class Probe:
    """A real call that counts how often it reached the substrate."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.calls


# ------------------------------------------------------------------ registry


def test_registry_describes_every_class_once() -> None:
    assert set(FAULTS) == set(FaultClass)
    for cls, spec in FAULTS.items():
        assert spec.name == cls  # the row is named by its class
        assert spec.description
        assert spec.points
    assert FAULTS[FaultClass.F3].points == {Point.COMPENSATE}
    for cls in (FaultClass.F1, FaultClass.F2, FaultClass.F4, FaultClass.F5):
        assert FAULTS[cls].points == {Point.CALL}


# ------------------------------------------------------------------ seeding & determinism


@pytest.mark.parametrize("arrival", ["bernoulli", "bursty"])
def test_same_seed_cell_trial_gives_identical_decisions_and_records(arrival: str) -> None:
    cfg = {"rate": 0.3} if arrival == "bernoulli" else {"arrival": "bursty", "burst_entry": 0.2}
    a, b = injector(**cfg), injector(**cfg)
    for i in range(500):
        point = Point.COMPENSATE if i % 7 == 0 else Point.CALL
        assert a.decide(point, f"s{i % 13}", meta={"i": i}) == b.decide(
            point, f"s{i % 13}", meta={"i": i}
        )
    assert a.records() == b.records()
    assert a.records(), "rate 0.3 over 500 events must inject something"


@pytest.mark.parametrize("arrival", ["bernoulli", "bursty"])
def test_different_trial_or_cell_gives_a_different_stream(arrival: str) -> None:
    cfg = {"rate": 0.3} if arrival == "bernoulli" else {"arrival": "bursty", "burst_entry": 0.2}
    base = run(injector(trial=0, **cfg), 300)
    assert run(injector(trial=1, **cfg), 300) != base
    assert run(injector(cell="cell-b", **cfg), 300) != base
    assert run(injector(seed=8, **cfg), 300) != base


def test_trial_seed_is_64_bit_and_independent_of_hash_salt() -> None:
    s = derive_trial_seed(7, "cell-a", 0)
    assert 0 <= s < 2**64
    assert s == derive_trial_seed(7, "cell-a", 0)
    assert len({derive_trial_seed(7, "cell-a", t) for t in range(100)}) == 100
    # Python's hash() of a str changes with PYTHONHASHSEED; the trial seed must not.
    code = "from harness.world.faults import derive_trial_seed; print(derive_trial_seed(7, 'cell-a', 0))"
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) == s


@settings(max_examples=60, deadline=None)
@given(
    others=st.lists(
        st.tuples(st.sampled_from(list(Point)), st.text(min_size=1, max_size=12)), max_size=40
    ),
    position=st.integers(min_value=0, max_value=40),
)
def test_bernoulli_decision_depends_only_on_point_site_occurrence(
    others: list[tuple[Point, str]], position: int
) -> None:
    target = (Point.CALL, "agent0/step3/try1")
    others = [o for o in others if o != target]
    alone = injector(rate=0.5)
    expected = [alone.decide(*target) for _ in range(3)]

    mixed = injector(rate=0.5)
    got = []
    seq = list(others)
    seq.insert(min(position, len(seq)), target)
    seq += [target, target]
    for point, site in seq:
        d = mixed.decide(point, site)
        if (point, site) == target:
            got.append(d)
    assert got == expected


def test_repeated_site_gets_independent_but_deterministic_draws() -> None:
    # The k-th delivery of one site is its own event: across many sites, first and second
    # draws must not always agree (they would, if occurrence were ignored).
    a, b = injector(rate=0.5), injector(rate=0.5)
    firsts = [a.decide(Point.CALL, f"s{i}") for i in range(200)]
    seconds = [a.decide(Point.CALL, f"s{i}") for i in range(200)]
    assert firsts != seconds
    assert [b.decide(Point.CALL, f"s{i}") for i in range(200)] == firsts
    assert [b.decide(Point.CALL, f"s{i}") for i in range(200)] == seconds
    assert {r["occurrence"] for r in a.records()} == {0, 1}


Event = tuple[str, Point, Role, str]  # (agent, point, role, site)


def _agent_plan(agent: str) -> list[Event]:
    # One agent's questions in its own order: reads, a write retried, a try, compensations.
    plan: list[Event] = []
    for step in range(12):
        site = f"{agent}/task/{step}"
        plan.append((agent, Point.CALL, Role.CALL, site))
        if step % 3 == 0:
            plan.append((agent, Point.CALL, Role.TRY, site))
            plan.append((agent, Point.CALL, Role.CALL, site))  # the same call's second delivery
        if step % 4 == 1:
            plan.append((agent, Point.COMPENSATE, Role.CALL, site))
    return plan


def _decisions(inj: FaultInjector, events: list[Event]) -> dict[tuple[object, ...], FaultClass | None]:
    for agent, point, role, site in events:
        inj.decide(point, site, role=role, agent=agent)
    out = {d.key(): d.fault for d in inj.decisions}
    assert len(out) == len(events)  # every key is asked once
    return out


@settings(max_examples=40, deadline=None)
@given(order=st.permutations([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2]),
       chunk=st.integers(min_value=1, max_value=9))
def test_bernoulli_draw_does_not_depend_on_the_order_of_questions_across_agents(
    order: list[int], chunk: int
) -> None:
    # Three agents ask the same per-agent sequences; only how their questions interleave
    # differs. Every (agent, point, role, site, occurrence) must get the same decision.
    plans = {a: _agent_plan(a) for a in ("a0", "a1", "a2")}
    agents = sorted(plans)
    alone = {}
    for a in agents:  # each agent alone, one after the other
        alone.update(_decisions(injector(rate=0.4), plans[a]))
    assert any(f is not None for f in alone.values()) and any(f is None for f in alone.values())

    cursors = {a: 0 for a in agents}
    interleaved: list[Event] = []
    for which in order * len(plans["a0"]):  # the permutation decides who asks next
        a = agents[which]
        take = plans[a][cursors[a]:cursors[a] + chunk]
        cursors[a] += len(take)
        interleaved += take
    for a in agents:  # whatever is left, in agent order
        interleaved += plans[a][cursors[a]:]
    assert _decisions(injector(rate=0.4), interleaved) == alone


def test_roles_have_their_own_occurrences() -> None:
    # A try delivered before the call's own delivery must not shift that delivery's draw:
    # the k-th CALL-role delivery of a site meets the same fault with or without tries.
    plain, with_tries = injector(rate=0.5), injector(rate=0.5)
    for i in range(200):
        plain.decide(Point.CALL, f"a0/t/{i}", agent="a0")
        with_tries.decide(Point.CALL, f"a0/t/{i}", role=Role.TRY, agent="a0")
        with_tries.decide(Point.CALL, f"a0/t/{i}", agent="a0")
    calls = [d for d in with_tries.decisions if d.role is Role.CALL]
    assert [(d.key(), d.fault) for d in calls] == [(d.key(), d.fault) for d in plain.decisions]
    # ... and the role and the agent are part of the draw (not merely logged).
    tries = [d.fault for d in with_tries.decisions if d.role is Role.TRY]
    assert tries != [d.fault for d in calls]
    other = injector(rate=0.5)
    assert [other.decide(Point.CALL, f"a0/t/{i}", agent="a1") for i in range(200)] != [
        d.fault for d in plain.decisions
    ]


def test_bernoulli_fault_times_do_not_depend_on_class_weights() -> None:
    # Same rate, different classes: the same CALL events fault (only the class differs), so an
    # F2-only cell and an F4-only cell hit the same logical calls.
    f2 = injector(rate=0.2, classes="F2")
    f4 = injector(rate=0.2, classes="F4")
    assert [d is None for d in run(f2, 400)] == [d is None for d in run(f4, 400)]


# ------------------------------------------------------------------ rates


def test_bernoulli_empirical_rate_within_binomial_tolerance() -> None:
    n, p = 20_000, 0.1
    hits = sum(d is not None for d in run(injector(rate=p), n))
    sd = math.sqrt(n * p * (1 - p))  # ~42 faults
    assert abs(hits - n * p) < 5 * sd


def test_bursty_marginal_rate_and_run_length() -> None:
    cfg = FaultConfig(arrival="bursty", burst_entry=0.04, burst_length=3.0, bad_rate=1.0)
    assert cfg.marginal_rate() == pytest.approx(0.04 / (0.04 + 1 / 3))
    assert cfg.marginal_rate() == pytest.approx(0.107, abs=5e-4)
    inj = FaultInjector(cfg, seed=11, cell="bursty", trial=3)
    n = 100_000
    hits = [d is not None for d in run(inj, n)]
    # Autocorrelation inflates the variance of the mean by (1+l)/(1-l), l = 1 - entry - 1/len
    # (~4.4x); sd of the rate is then ~0.002, and 0.01 is a generous bound.
    assert sum(hits) / n == pytest.approx(cfg.marginal_rate(), abs=0.01)

    runs, current = [], 0
    for h in hits:
        if h:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    # ~3,500 runs, geometric with mean 3 (sd ~2.4): se of the mean ~0.04.
    assert len(runs) > 2_000
    assert sum(runs) / len(runs) == pytest.approx(cfg.burst_length, abs=0.25)


def test_bursty_chain_advances_at_every_point() -> None:
    # Per event the chain consumes the same randomness at any point, so the CALL events of a
    # sequence interleaved with COMPENSATE events decide exactly as the events at the same
    # ordinals of an all-CALL sequence.
    cfg = {"arrival": "bursty", "burst_entry": 0.2, "classes": ["F1", "F2"]}
    a, b = injector(**cfg), injector(**cfg)
    seq_a = [a.decide(Point.COMPENSATE if i % 3 == 0 else Point.CALL, f"s{i}") for i in range(600)]
    seq_b = [b.decide(Point.CALL, f"s{i}") for i in range(600)]
    for i in range(600):
        if i % 3 == 0:
            assert seq_a[i] is None  # F3 has weight 0: nothing applies at COMPENSATE
        else:
            assert seq_a[i] == seq_b[i]
    assert any(d is not None for d in seq_b)


def test_bernoulli_marginal_rate_is_the_rate() -> None:
    assert FaultConfig(rate=0.1).marginal_rate() == 0.1


def test_rate_zero_and_disabled_never_inject() -> None:
    for inj in (FaultInjector.disabled(), injector(rate=0.0), injector()):
        for i in range(2_000):
            assert inj.decide(Point.CALL, f"s{i}") is None
            assert inj.decide(Point.COMPENSATE, f"s{i}") is None
        assert inj.injected == [] and inj.records() == []
    never = injector(arrival="bursty", burst_entry=0.0)
    assert all(d is None for d in run(never, 2_000))
    never = injector(arrival="bursty", bad_rate=0.0)
    assert all(d is None for d in run(never, 2_000))


def test_rate_one_always_injects_at_applicable_points() -> None:
    assert all(d is not None for d in run(injector(rate=1.0), 500))


# ------------------------------------------------------------------ classes


def test_single_class_config_gives_only_that_class() -> None:
    inj = injector(rate=0.5, classes="F2")
    got = set(run(inj, 2_000)) | set(run(inj, 2_000, Point.COMPENSATE))
    assert got == {None, FaultClass.F2}


def test_f3_only_at_compensate_and_only_f3_there() -> None:
    inj = injector(rate=0.5)  # mixed
    at_call = set(run(inj, 3_000))
    at_comp = set(run(inj, 3_000, Point.COMPENSATE))
    assert at_call == {None, FaultClass.F1, FaultClass.F2, FaultClass.F4, FaultClass.F5}
    assert at_comp == {None, FaultClass.F3}
    f3_only = injector(rate=1.0, classes="F3")
    assert all(d is None for d in run(f3_only, 500))
    assert all(d is FaultClass.F3 for d in run(f3_only, 500, Point.COMPENSATE))


def test_class_weights_are_respected() -> None:
    inj = injector(rate=1.0, classes={"F1": 3.0, "F5": 1.0, "F2": 0.0})
    got = run(inj, 8_000)
    assert set(got) == {FaultClass.F1, FaultClass.F5}
    share = got.count(FaultClass.F1) / len(got)
    assert share == pytest.approx(0.75, abs=0.03)  # sd ~0.005


# ------------------------------------------------------------------ records


def test_records_are_json_ready_and_complete() -> None:
    inj = injector(rate=1.0, classes="F2")
    inj.decide(Point.CALL, "a", meta={"tool": "refund", "mode": "tx-full"})
    inj.decide(Point.COMPENSATE, "a")  # no applicable class: an event, but no fault
    inj.decide(Point.CALL, "a")
    recs = inj.records()
    assert json.loads(json.dumps(recs)) == recs
    assert recs == [
        {
            "index": 0,
            "agent": "",
            "point": "call",
            "role": "call",
            "site": "a",
            "fault": "F2",
            "occurrence": 0,
            "meta": {"tool": "refund", "mode": "tx-full"},
        },
        {"index": 2, "agent": "", "point": "call", "role": "call", "site": "a", "fault": "F2",
         "occurrence": 1, "meta": {}},
    ]
    assert inj.events == 3


def test_meta_is_copied_at_decision_time() -> None:
    inj = injector(rate=1.0, classes="F1")
    meta = {"k": 1}
    inj.decide(Point.CALL, "a", meta=meta)
    meta["k"] = 2
    assert inj.records()[0]["meta"] == {"k": 1}


# ------------------------------------------------------------------ deliver / compensate


def forced(cls: str) -> FaultInjector:
    return injector(rate=1.0, classes=cls, stall_ms=1234.0)


def visible(exc: BaseException) -> tuple[object, ...]:
    """Everything a mode can observe of a failure: its type, text and attributes."""
    return (type(exc), exc.args, str(exc), sorted(vars(exc).items()))


def test_deliver_f1_makes_no_call_and_raises_call_failed() -> None:
    probe = Probe()
    with pytest.raises(ToolCallFailed) as exc:
        deliver(forced("F1"), "s", probe)
    assert probe.calls == 0
    assert exc.value.site == "s"
    assert isinstance(exc.value, ToolFault)


def test_deliver_f2_applies_once_then_raises_the_same_failure_as_f1() -> None:
    probe = Probe()
    with pytest.raises(ToolCallFailed):
        deliver(forced("F2"), "s", probe)
    assert probe.calls == 1


def test_f1_and_f2_are_indistinguishable_to_the_caller() -> None:
    # docs/design.md, "What a mode may see": only the oracle may know the class of an
    # injected fault.
    seen = {}
    for cls in ("F1", "F2"):
        inj = forced(cls)
        with pytest.raises(ToolFault) as exc:
            deliver(inj, "agent0/task/3", Probe(), meta={"op": "x"})
        seen[cls] = visible(exc.value)
        assert inj.records()[0]["fault"] == cls  # the class is in the oracle's records
    assert seen["F1"] == seen["F2"]
    assert not any("F1" in repr(v) or "F2" in repr(v) for v in seen["F1"])


def test_deliver_f4_delivers_exactly_twice_silently() -> None:
    probe = Probe()
    assert deliver(forced("F4"), "s", probe) == 2  # the second delivery's result
    assert probe.calls == 2


def test_deliver_f5_makes_no_call_and_raises_timeout_with_stall() -> None:
    probe = Probe()
    with pytest.raises(ToolTimeout) as exc:
        deliver(forced("F5"), "s", probe)
    assert probe.calls == 0
    assert exc.value.stall_ms == 1234.0
    assert isinstance(exc.value, ToolCallFailed)  # a timeout is a failure like any other
    assert "F5" not in str(exc.value)


def test_deliver_without_fault_calls_once() -> None:
    for inj in (None, FaultInjector.disabled(), forced("F3")):
        probe = Probe()
        assert deliver(inj, "s", probe) == 1
        assert probe.calls == 1


def test_deliver_records_the_fault_with_meta() -> None:
    inj = forced("F4")
    deliver(inj, "agent0/step1/try0", Probe(), meta={"tool": "t"})
    assert inj.records()[0]["site"] == "agent0/step1/try0"
    assert inj.records()[0]["meta"] == {"tool": "t"}


def test_real_error_from_the_call_preempts_the_injected_one() -> None:
    def boom() -> None:
        raise KeyError("real")

    with pytest.raises(KeyError):
        deliver(forced("F2"), "s", boom)


def test_compensate_f3_makes_no_call_and_raises() -> None:
    probe = Probe()
    with pytest.raises(CompensationFailed) as exc:
        compensate(forced("F3"), "s/undo", probe)
    assert probe.calls == 0
    assert exc.value.site == "s/undo"


def test_compensate_without_f3_calls_once() -> None:
    # Mixed at rate 1: at COMPENSATE only F3 applies, and with F3 excluded nothing does.
    for inj in (None, forced("F2"), forced("F4")):
        probe = Probe()
        assert compensate(inj, "s/undo", probe) == 1
        assert probe.calls == 1


def test_tool_faults_survive_pickling() -> None:
    # Trials may run in worker processes and send exceptions back.
    for exc in (
        ToolCallFailed("a"),
        ToolTimeout("c", stall_ms=50.0),
        CompensationFailed("d"),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert visible(back) == visible(exc)
    assert pickle.loads(pickle.dumps(ToolTimeout("c", stall_ms=50.0))).stall_ms == 50.0


# ------------------------------------------------------------------ config validation


def field_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> str:
    return str(excinfo.value.errors()[0]["loc"][0])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rate": 1.5}, "rate"),
        ({"rate": -0.1}, "rate"),
        ({"rate": float("nan")}, "rate"),
        ({"classes": "F9"}, "classes"),
        ({"classes": ["F2", "F9"]}, "classes"),
        ({"classes": {"F1": -1.0}}, "classes"),
        ({"classes": {"F1": 0.0, "F2": 0.0}}, "classes"),
        ({"classes": []}, "classes"),
        ({"burst_entry": 1.2}, "burst_entry"),
        ({"burst_length": 0.5}, "burst_length"),
        ({"bad_rate": -1}, "bad_rate"),
        ({"stall_ms": 0}, "stall_ms"),
        ({"arrival": "poisson"}, "arrival"),
        ({"arrival": "bursty", "rate": 0.1}, "rate"),
        ({"rate": 0.1, "arrival": "bursty"}, "rate"),
        ({"fp": 0.1}, "fp"),
    ],
)
def test_invalid_config_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        FaultConfig(**kwargs)
    assert field_of(exc) == field
    assert field in str(exc.value)


def test_config_is_immutable() -> None:
    cfg = FaultConfig(rate=0.1)
    with pytest.raises(ValidationError):
        cfg.rate = 0.2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("mixed", {c: 1.0 for c in FaultClass}),
        ("F2", {FaultClass.F2: 1.0}),
        ("f4", {FaultClass.F4: 1.0}),
        (["F2", "F4"], {FaultClass.F2: 1.0, FaultClass.F4: 1.0}),
        ({"F5": 2, "F1": 1}, {FaultClass.F1: 1.0, FaultClass.F5: 2.0}),
    ],
)
def test_class_shorthands_parse(given: object, expected: dict[FaultClass, float]) -> None:
    assert FaultConfig(classes=given).classes == expected


def test_default_classes_are_mixed() -> None:
    assert FaultConfig().classes == FaultConfig(classes="mixed").classes


@pytest.mark.parametrize(
    "cfg",
    [
        FaultConfig(rate=0.1, classes=["F2", "F4"]),
        FaultConfig(arrival="bursty", burst_entry=0.04, burst_length=3),
    ],
)
def test_config_round_trips_through_json(cfg: FaultConfig) -> None:
    # Trial records store the config; reproducing a trial re-reads it.
    assert FaultConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert FaultConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg

"""Paper Table 21: tx-full with deliberately wrong tool annotations, one kind per config."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from atomix import EffectClass, Runtime
from atomix.errors import ToolDefinitionError
from harness.experiment.trial import TrialSpec, run_trial
from harness.workloads.annotation_errors import VARIANTS, AnnotationErrorsWorkload, failure_mode

ANNOTATIONS = tuple(VARIANTS)
N = 30
SUMMED = ("invariant_violations", "leaked_external", "leaked_mail", "leaked_charges", "leaks",
          "unsafe", "silent_failure", "alerted_failure", "false_wait", "contended", "aborts")


def _run(annotation: str, trial: int) -> dict[str, Any]:
    params = {"annotation": annotation}
    spec = TrialSpec("t21", "annotation_errors", "tx-full", annotation, params, trial, 21, params=params)
    return run_trial(spec)


@pytest.fixture(scope="module")
def sums() -> dict[str, dict[str, float]]:
    """Per annotation: how many of N trials had each measure (nonzero counts as one)."""
    out: dict[str, dict[str, float]] = {}
    for annotation in ANNOTATIONS:
        totals: dict[str, float] = defaultdict(float)
        for trial in range(N):
            metrics = _run(annotation, trial)["metrics"]
            for key in SUMMED:
                totals[key] += bool(metrics[key])
        out[annotation] = dict(totals)
    return out


def test_the_control_is_safe_and_exercised(sums: dict[str, dict[str, float]]) -> None:
    control = sums["control"]
    assert control["unsafe"] == control["false_wait"] == 0
    assert control["contended"] > 0 and control["aborts"] > 0  # the mistakes had a chance to bite


def test_each_mistake_fails_the_way_the_paper_says(sums: dict[str, dict[str, float]]) -> None:
    assert failure_mode(sums) == {
        "control": "none",
        "over_broad": "failure-closed",
        "too_narrow": "failure-open",
        "wrong_class": "failure-open",
        "wrong_class_bufferable": "none",
        "missing_compensation": "failure-open with alert",
    }


def test_what_each_mistake_breaks(sums: dict[str, dict[str, float]]) -> None:
    narrow, wrong, missing = sums["too_narrow"], sums["wrong_class"], sums["missing_compensation"]
    assert narrow["invariant_violations"] > 0 and narrow["leaked_external"] == 0
    # The eagerly sent mail is what leaks, and the oracle reads it from the sink as well.
    assert wrong["leaked_mail"] == wrong["leaks"] == wrong["leaked_external"] > 0
    assert wrong["leaked_charges"] == wrong["invariant_violations"] == 0
    # The charge without a refund is what leaks, and every such trial raised an alert.
    assert missing["leaked_charges"] == missing["alerted_failure"] == missing["leaked_external"] > 0
    assert missing["leaked_mail"] == missing["invariant_violations"] == 0
    assert sums["over_broad"]["invariant_violations"] == sums["over_broad"]["leaked_external"] == 0


def test_every_configuration_meets_the_same_orders() -> None:
    workload = AnnotationErrorsWorkload()
    plans: dict[str, Any] = {}
    for annotation in ANNOTATIONS:
        scenario = workload.scenario(random.Random(5), 3, {"annotation": annotation})
        plans[annotation] = (
            [[(s.args if isinstance(s.args, dict) else None) for s in t.steps] for t in scenario.tasks],
            scenario.start_offsets_ms,
        )
    assert all(plan == plans["control"] for plan in plans.values())


def test_the_runtime_refuses_a_reversible_tool_without_compensation() -> None:
    # Why the missing compensation is modelled as a handler that cannot refund: the
    # runtime's own tool definition fails closed on a literally missing one.
    rt = Runtime()
    with pytest.raises(ToolDefinitionError, match="compensat"):
        rt.tool(effect=EffectClass.REVERSIBLE, writes="payments:charge:{order}")(lambda order: None)

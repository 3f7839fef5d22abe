"""Paper Table 14: lines of code measured from the source, the audit of which tool fields a
mechanism reads, the R/I/S probe under real modes, and the config mappings."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from harness.experiment.config import load_config
from harness.experiment.trial import TrialSpec, run_trial
from harness.workloads import loc
from harness.workloads.integration_cost import ToolAudit, measures, wiring_lines
from harness.workloads.retail.substrate import RETAIL_TOOLS

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def spec(mode: str, trial: int = 0) -> TrialSpec:
    return TrialSpec(config="integration_cost", workload="integration_cost", mode=mode,
                     cell_id="all", cell={}, trial=trial, seed=14)


def load_module(tmp_path: Path, name: str, source: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A real module file inside a directory the line counter counts (tmp_path)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.setattr(loc, "PROJECT", (*loc.PROJECT, tmp_path))
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, name, module)
    module_spec.loader.exec_module(module)
    return module


def test_code_lines_skip_blanks_comments_and_docstrings(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent('''\
        """Module docstring,
        two lines."""

        # a comment
        X = """a string that is data,
        not a docstring"""


        def f(a):
            """Docstring."""
            return (a +  # trailing comment: still code
                    1)
        '''), encoding="utf-8")
    assert sorted(loc.code_lines(str(path))) == [5, 6, 9, 11, 12]


def test_reach_follows_helpers_methods_and_closures_not_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = load_module(tmp_path, "reach_probe", '''\
        class Store:
            def before(self, k):
                return helper(k)

            def unused(self):
                return 0


        def helper(k):
            return [k for _ in range(1)]


        def unrelated():
            return 1


        def store(env) -> Store:
            return Store()


        def make(k):
            def reads(env):
                return store(env).before(k)
            return reads
        ''', monkeypatch)
    lines = {n for _, n in loc.reach_lines([mod.make("x")], count_in=(tmp_path,))}
    # reads (22-23), store (17-18), Store.before (2-3), helper (9-10); never unused or unrelated
    assert lines == {22, 23, 17, 18, 2, 3, 9, 10}
    whole = {n for _, n in loc.reach_lines([mod.Store], count_in=(tmp_path,), whole_classes=True)}
    assert {5, 6} <= whole and 13 not in whole


def test_the_audit_records_only_reads_made_by_a_mode_session() -> None:
    audit = ToolAudit()
    tools = audit.wrap(RETAIL_TOOLS)
    tool = tools["cancel_pending_order"]
    assert tool.effect is RETAIL_TOOLS["cancel_pending_order"].effect and tool.before is not None
    assert audit.fields == {}  # read here, by no session


@pytest.mark.parametrize(
    ("mode", "module", "read", "not_read"),
    [
        ("tx-full", "harness/modes/tx.py", {"reads", "writes", "effect", "key", "before", "undo"}, {"check"}),
        ("tcc", "baselines/tcc.py", {"check", "effect"}, {"before", "undo", "reads", "key"}),
        ("saga", "baselines/saga.py", {"before", "undo", "effect"}, {"check", "reads", "key"}),
        ("occ", "baselines/occ.py", {"reads", "writes", "before", "undo"}, {"check", "key"}),
        ("mutex-wal", "baselines/mutex_wal.py", {"before", "undo", "effect"}, {"check", "reads"}),
    ],
)
def test_a_trial_measures_the_mechanism_it_ran(mode: str, module: str, read: set[str], not_read: set[str]) -> None:
    record = run_trial(spec(mode))
    final, m = record["final"], record["metrics"]
    assert final["integration_module"] == module
    assert read <= set(final["wiring_fields"]) and not not_read & set(final["wiring_fields"])
    assert m["integration_loc"] == len(loc.code_lines(str(loc.ROOT / module)))
    assert m["wiring_loc"] == len(wiring_lines(RETAIL_TOOLS, frozenset(final["wiring_fields"])))
    assert m["wiring_loc_per_tool"] == m["wiring_loc"] / len(RETAIL_TOOLS)


def test_more_fields_read_means_more_wiring() -> None:
    tx = measures("harness.modes.tx", frozenset({"reads", "writes", "effect", "key", "before", "undo"}))
    tcc = measures("baselines.tcc", frozenset({"check", "effect"}))
    assert tx["wiring_loc"] > tcc["wiring_loc"] > 0
    # The runtime the tx-full shim drives is far larger than what a baseline imports.
    assert tx["library_loc"] > 10 * tcc["library_loc"]


@pytest.mark.parametrize(
    ("mode", "recovery", "gating", "isolation"),
    [
        ("tx-full", True, True, True),
        ("saga", True, False, False),  # compensates, sends eagerly, no isolation
        ("occ", True, False, True),  # rolls back and revalidates, sends eagerly
        ("tcc", True, True, False),  # confirms nothing of an abort, validates no read
        ("mutex-wal", True, True, False),  # its mutex is per workflow
        ("no-tx", False, False, False),
    ],
)
def test_the_probe_measures_what_a_mode_composes_with(
    mode: str, recovery: bool, gating: bool, isolation: bool
) -> None:
    m = run_trial(spec(mode, trial=3))["metrics"]
    assert (m["composes_recovery"], m["composes_gating"], m["composes_isolation"]) == (
        recovery, gating, isolation)


def test_same_seed_same_record_apart_from_timings() -> None:
    first, second = run_trial(spec("occ", 1)), run_trial(spec("occ", 1))
    first.pop("timings"), second.pop("timings")
    assert first == second


def test_table_14_is_mapped_by_integration_cost_and_leakage() -> None:
    cost = load_config(CONFIGS / "integration_cost.yaml")
    primary = [e for e in cost.paper if e.table == 14 and not e.variant]
    variant = [e for e in cost.paper if e.table == 14 and e.variant]
    assert primary and variant
    assert set(primary[0].columns) == {"tx_manager LOC (one-time)", "Per-tool wiring (per integrated tool)"}
    assert variant[0].columns["tx_manager LOC (one-time)"].metric == "library_loc"
    leakage = load_config(CONFIGS / "leakage.yaml")
    (leaks,) = [e for e in leakage.paper if e.table == 14]
    assert leaks.columns["Leaks/500"].stat == "count"
    # 500 invalid sends per mode: five abort sources, 100 trials each.
    assert leakage.trials * len(leakage.grid["params.source"]) == 500

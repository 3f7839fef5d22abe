"""The desktop PROXY workload (paper Table 5's OSWorld columns, not OSWorld): its apps on real
files, real SQLite and a real mailbox, its UI-app scopes, the settlement metadata of its
actions (keys, undo, checks), its task bank and goal states, and whole trials under real
modes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError
from support import CONFIGS

from atomix.effects import EffectClass
from atomix.scope_parsing import parse_scope
from harness.agents.policies import AgentConfig
from harness.experiment.config import load_config
from harness.experiment.trial import TrialSpec, run_trial
from harness.workloads import get_workload
from harness.workloads.desktop import DesktopParams, apps
from harness.workloads.desktop.tasks import KINDS, goal_state, task_bank
from harness.workloads.desktop.tools import TOOLS
from harness.world.faults import FaultConfig
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolError


@pytest.fixture
def env() -> Any:
    e = TrialEnv.create()
    apps.setup(e)
    yield e
    e.close()


def _run(env: TrialEnv, tool: str, key: str | None = None, **args: Any) -> Any:
    return TOOLS[tool].run(env, args, Delivery(key, {"agent": "a0", "attempt": 1, "op": f"op-{tool}"}))


# --------------------------------------------------------------------------- scopes


def test_ui_scopes_name_the_app_and_element_and_file_actions_also_name_the_file(env: TrialEnv) -> None:
    writes = TOOLS["type_text"].writes(env, {"path": "docs/todo.txt", "text": "x"})
    assert writes[0] == "ui:editor:docs/todo.txt:text_input"
    assert writes[1] == env.files.scope("docs/todo.txt") and writes[1].startswith("fs:/")
    editor = parse_scope(apps.ui("editor"))
    assert editor.covers(parse_scope(writes[0]))
    # The file manager's view of the same file is another UI scope; the file scope joins them.
    trash = TOOLS["trash_file"].writes(env, {"path": "docs/todo.txt"})
    assert not parse_scope(trash[0]).overlaps(parse_scope(writes[0]))
    assert parse_scope(trash[1]) == parse_scope(writes[1])
    assert TOOLS["set_setting"].writes(env, {"section": "display", "key": "theme", "value": "dark"}) == [
        "ui:settings:display:theme"]
    assert "mail:sam@example.com" in TOOLS["send_mail"].writes(env, {"to": "Sam@Example.com", "subject": "", "body": ""})


def test_read_only_actions_carry_no_scope(env: TrialEnv) -> None:
    for name in ("open_app", "read_doc"):
        tool = TOOLS[name]
        assert tool.effect is None
        assert tool.reads(env, {"app": "mail", "path": "docs/todo.txt"}) == []
    assert TOOLS["send_mail"].effect is EffectClass.IRREVERSIBLE
    assert TOOLS["trash_file"].effect is EffectClass.REVERSIBLE


# --------------------------------------------------------------------------- the apps


def test_editor_actions_change_the_real_file(env: TrialEnv) -> None:
    _run(env, "type_text", path="docs/todo.txt", text="- buy milk")
    _run(env, "replace_text", path="docs/todo.txt", old="plumber", new="electrician")
    text = (env.files.root / "docs" / "todo.txt").read_text()
    assert text == "- call the electrician\n- renew passport\n- buy milk\n"
    with pytest.raises(ToolError, match="not found"):
        _run(env, "replace_text", path="docs/todo.txt", old="plumber", new="x")
    with pytest.raises(ToolError, match="no such document"):
        _run(env, "read_doc", path="../outside.txt")


def test_trash_moves_the_file_and_its_undo_brings_it_back(env: TrialEnv) -> None:
    start = env.snapshot()
    tool, args = TOOLS["trash_file"], {"path": "downloads/setup-old.exe"}
    assert tool.before is not None and tool.undo is not None
    before = tool.before(env, args)
    tool.run(env, args, Delivery("k", {"op": "t"}))
    files = env.snapshot()["files"]
    assert "downloads/setup-old.exe" not in files and files["Trash/setup-old.exe"] == "MZ old installer\n"
    tool.undo(env, args, before, Delivery(None, {"op": "t", "undo": True}))
    assert env.snapshot() == start


def test_a_keyed_redelivery_changes_nothing_and_an_unkeyed_one_applies_twice(env: TrialEnv) -> None:
    _run(env, "move_file", key="k1", path="downloads/receipt-77.pdf", dst="docs/receipt-77.pdf")
    assert _run(env, "move_file", key="k1", path="downloads/receipt-77.pdf", dst="docs/receipt-77.pdf") == (
        "docs/receipt-77.pdf")  # answered, not refused: the key was applied
    for key in ("k3", "k3", None, None):
        TOOLS["toggle_setting"].run(env, {"section": "notifications", "key": "dnd"}, Delivery(key, {"op": "t"}))
    assert env.db.get("settings", "notifications.dnd") == {"value": True}  # once keyed + twice unkeyed
    for key in ("k4", "k4"):
        _run(env, "send_mail", key=key, to="bob@example.com", subject="s", body="b")
    assert len(env.messages()) == 1
    assert _run(env, "replace_text", key="k5", path="docs/letter.txt", old="Sam", new="Ms Lee") == 1
    assert _run(env, "replace_text", key="k5", path="docs/letter.txt", old="Sam", new="Ms Lee") == 0


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("type_text", {"path": "docs/report.txt", "text": "more"}),
        ("replace_text", {"path": "docs/report.txt", "old": "4%", "new": "5%"}),
        ("new_doc", {"path": "notes/new.txt", "text": "hello\n"}),
        ("move_file", {"path": "downloads/invoice-1042.pdf", "dst": "docs/invoice-1042.pdf"}),
        ("set_setting", {"section": "editor", "key": "tab_width", "value": 2}),
        ("toggle_setting", {"section": "privacy", "key": "location"}),
        ("mark_read", {"msg": "m3"}),
        ("move_message", {"msg": "m3", "folder": "receipts"}),
    ],
)
def test_undo_restores_what_a_revocable_action_wrote(env: TrialEnv, tool: str, args: dict[str, Any]) -> None:
    start = env.snapshot()
    t = TOOLS[tool]
    assert t.before is not None and t.undo is not None
    before = t.before(env, args)
    t.run(env, args, Delivery("k", {"op": tool}))
    assert env.snapshot() != start
    t.undo(env, args, before, Delivery(None, {"op": tool, "undo": True}))
    assert env.snapshot() == start


def test_checks_refuse_bad_arguments_without_any_effect(env: TrialEnv) -> None:
    start = env.snapshot()
    checks = [
        ("set_setting", {"section": "display", "key": "theme", "value": 3}, "takes a str"),
        ("toggle_setting", {"section": "display", "key": "theme"}, "not a switch"),
        ("move_file", {"path": "docs/todo.txt", "dst": "docs/report.txt"}, "already exists"),
        ("move_message", {"msg": "m1", "folder": "spam"}, "no folder"),
        ("type_text", {"path": "docs/missing.txt", "text": "x"}, "no such file"),
    ]
    for name, args, message in checks:
        check = TOOLS[name].check
        assert check is not None
        with pytest.raises(ToolError, match=message):
            check(env, args)
    assert env.snapshot() == start


# --------------------------------------------------------------------------- tasks and goals


def test_the_task_bank_is_a_pure_function_of_size_and_seed() -> None:
    a, b = task_bank(30, 0), task_bank(30, 0)
    assert [(t.kind, t.task) for t in a] == [(t.kind, t.task) for t in b]
    assert [t.task.steps for t in task_bank(30, 1)] != [t.task.steps for t in a]
    assert Counter(t.kind for t in a) == dict.fromkeys(KINDS, 5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_gold_plan_runs_without_refusal_and_changes_the_desktop(seed: int) -> None:
    initial = TrialEnv.create()
    try:
        apps.setup(initial)
        start = initial.snapshot()
    finally:
        initial.close()
    for scripted in task_bank(40, seed):
        goal = goal_state(scripted.task)  # raises if a gold step is refused
        assert goal != start, scripted.task.task_id
        sends = sum(s.tool == "send_mail" for s in scripted.task.steps)
        assert len(goal["mailbox"]) == sends


def test_params_are_checked_strictly() -> None:
    assert DesktopParams.model_validate({}).tasks == 30
    for bad in ({"tasks": 19}, {"task_seed": -1}, {"step_retries": 2.0}, {"apps": 3}):
        with pytest.raises(ValidationError):
            DesktopParams.model_validate(bad)


# --------------------------------------------------------------------------- whole trials


def _spec(mode: str, trial: int, faults: FaultConfig | None = None, kind: str = "gold") -> TrialSpec:
    return TrialSpec("probe", "desktop", mode, "c", {}, trial, 5, faults=faults or FaultConfig(),
                     params={"tasks": 30}, agent=AgentConfig(kind=kind, max_steps=30))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["tx-full", "checkpoint-replay", "tcc", "saga", "mutex-wal"])
def test_without_faults_every_mode_ends_clean_on_every_kind_of_task(mode: str) -> None:
    for trial in range(len(KINDS)):
        record = run_trial(_spec(mode, trial))
        assert record["metrics"]["clean"], (mode, record["final"], record["agents"])
        assert record["final"]["kind"] == KINDS[trial]


def test_duplicate_deliveries_are_absorbed_by_keys_under_tx_full_and_doubled_under_saga() -> None:
    every_call_twice = FaultConfig(rate=1.0, classes="F4")
    trial = 0  # an "edit_doc" task: typing a line is not idempotent
    tx = run_trial(_spec("tx-full", trial, every_call_twice))
    saga = run_trial(_spec("saga", trial, every_call_twice))
    assert tx["metrics"]["clean"] and tx["metrics"]["duplicates"] == 0
    assert not saga["metrics"]["clean"] and saga["metrics"]["duplicates"] > 0


def test_without_an_abort_nothing_is_compensated_so_f3_finds_nothing_to_fail() -> None:
    # F3 fires only at a compensation, and a committed cleanup (a reversible trash) has none.
    for mode in ("tx-full", "saga"):
        record = run_trial(_spec(mode, 3, FaultConfig(rate=1.0, classes="F3")))  # a cleanup task
        assert record["metrics"]["clean"], mode  # nothing aborted, so nothing was compensated
        assert record["exercised"]["compensations"] == 0


def test_a_trial_is_reproducible_from_its_spec() -> None:
    spec = _spec("tcc", 5, FaultConfig(rate=0.3, classes="mixed"), kind="llm-like")
    a, b = run_trial(spec), run_trial(spec)
    a.pop("timings"), b.pop("timings")
    assert a == b


def test_the_config_is_labelled_a_proxy_and_maps_table_5() -> None:
    config = load_config(CONFIGS / "desktop_proxy.yaml")
    assert "proxy" in config.name and "PROXY" in config.description and "not OSWorld" in config.description
    assert all("PROXY" in t.title for t in config.report.tables)
    (entry,) = config.paper
    assert entry.table == 5 and not entry.variant  # the proxy is how Table 5 is reproduced here
    assert get_workload("desktop").description.startswith("PROXY for OSWorld")

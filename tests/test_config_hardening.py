"""Hostile and malformed configs: each is refused with exit 2 and one line naming the file
and the problem (and the line or key where known), never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support import CONFIGS, Stopwatch
from typer.testing import CliRunner

import harness.analysis.runs  # noqa: F401 - imported up front so that timings exclude it
from cli import app
from harness.experiment.config import DEFAULT_LIMITS, ConfigError, load_config
from harness.experiment.yamlload import MAX_DEPTH, YamlInputError, load_yaml

runner = CliRunner()

TINY: dict[str, Any] = {
    "name": "tiny",
    "workload": "synthetic",
    "trials": 2,
    "modes": ["tx-full", "no-tx"],
    "grid": {"faults.rate": [0.0, 0.3]},
}

BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
)


def write(tmp_path: Path, text: str | bytes, name: str = "case.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def tiny_text(**changes: Any) -> str:
    return yaml.safe_dump({**TINY, **changes}, sort_keys=False)


def refused(path: Path, *args: str, command: str = "validate") -> str:
    """Run the command; assert exit 2, no traceback, and a first line naming the file."""
    result = runner.invoke(app, [command, str(path), *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.output.startswith(str(path)), result.output
    return result.output


# --------------------------------------------------------------------------- the YAML layer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"name: caf\xe9\nworkload: synthetic\n", "line 1: not UTF-8 text: byte 0xe9"),
        ("name: x\n".encode("utf-16"), "not UTF-8 text"),
        (BOMB, "alias bomb"),
        ("workload: synthetic\nparams: &p {agents: *p}\n", "line 2: alias *p is used inside"),
        ("grid: &g {faults.rate: [*g]}\n", "self-referencing"),
        ("params: {agents: " + "[" * 40 + "]" * 40 + "}\n", f"nested more than {MAX_DEPTH}"),
        ("params: {agents: " + "[" * 5000 + "]" * 5000 + "}\n", "nesting depth"),  # libyaml's own cap
        ("a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 60)), f"nested more than {MAX_DEPTH}"),
        ("name: a\nworkload: synthetic\nname: b\n", "line 3: duplicate key 'name' (first at line 1)"),
        ("faults: {rate: 0.1, rate: 0.2}\n", "duplicate key 'rate'"),
        ("a: 1\n---\nb: 2\n", "line 2: not valid YAML: expected a single document"),
        ("a: \x00\n", "character #x0000 is not allowed"),
        ("a: !!binary aGk=\n", "tag:yaml.org,2002:binary is not allowed"),
        ("a: !!python/object:os.system x\n", "could not determine a constructor"),
    ],
)
def test_hostile_yaml_is_refused_in_one_line(tmp_path: Path, text: str | bytes, expected: str) -> None:
    path = write(tmp_path, text)
    with Stopwatch() as took:  # (time spent waiting for a busy CPU aside)
        output = refused(path)
    assert took.seconds < 3
    assert expected in output
    assert output.strip().count("\n") == 0, output  # one line


def test_aliases_and_merge_keys_within_bounds_still_work() -> None:
    data = load_yaml("base: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\nd: *b\nday: 2024-01-01\n")
    assert data == {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}, "d": {"x": 1, "y": 2}, "day": "2024-01-01"}
    with pytest.raises(YamlInputError, match="once aliases are expanded"):
        load_yaml("a: &a " + "[" * 20 + "1" + "]" * 20 + "\nb: " + "[" * 20 + "*a" + "]" * 20)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_parse_exactly_as_before(path: Path) -> None:
    assert load_yaml(path.read_bytes()) == yaml.safe_load(path.read_bytes())
    load_config(path)


# --------------------------------------------------------------------------- names and cells


@pytest.mark.parametrize("name", ["..", ".", "../escape", "/tmp/abs", "a/b", "a\\b", "", "x" * 101])
def test_names_that_would_leave_the_results_directory_are_refused(tmp_path: Path, name: str) -> None:
    output = refused(write(tmp_path, tiny_text(name=name)))
    assert "name: the name must be" in output


def test_a_file_name_that_is_not_an_identifier_needs_a_name_key(tmp_path: Path) -> None:
    text = yaml.safe_dump({k: v for k, v in TINY.items() if k != "name"})
    output = refused(write(tmp_path, text, "my config.yaml"))
    assert "name: not given" in output


def test_duplicate_cell_ids_are_refused(tmp_path: Path) -> None:
    output = refused(write(tmp_path, tiny_text(grid={"faults.rate": [0.1, 0.10]})))
    assert "cell id 'faults.rate=0.1' occurs twice" in output
    cells = [{"label": "a", "faults.rate": 0.1}, {"label": "a", "faults.rate": 0.2}]
    output = refused(write(tmp_path, tiny_text(grid={}, cells=cells)))
    assert "occurs twice" in output


@pytest.mark.parametrize(
    ("key", "value"),
    [("labels", {"faults.rate": "../fp"}), ("grid", {"faults..rate": [1]}), ("cells", [{"label": "a/b"}])],
)
def test_labels_and_keys_are_plain(tmp_path: Path, key: str, value: Any) -> None:
    refused(write(tmp_path, tiny_text(**{key: value})))


# --------------------------------------------------------------------------- params


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"agents": "4"}, "params.agents: Input should be a valid integer"),
        ({"agents": True}, "params.agents: Input should be a valid integer"),
        ({"agents": 1.5}, "params.agents"),
        ({"agents": 10**30}, "params.agents: Input should be less than or equal to 64"),
        ({"agents": 0}, "params.agents: Input should be greater than or equal to 1"),
        ({"veto_rate": float("nan")}, "params.veto_rate"),
        ({"veto_rate": 1.5}, "params.veto_rate"),
        ({"step_retries": [1]}, "params.step_retries"),
        ({"agent": 1}, "unknown key params.agent; did you mean params.agents?"),
    ],
)
def test_synthetic_params_are_validated(tmp_path: Path, params: dict[str, Any], expected: str) -> None:
    assert expected in refused(write(tmp_path, tiny_text(params=params)))


@pytest.mark.parametrize(
    ("config", "params", "expected"),
    [
        ("tau_retail.yaml", {"sample": 0}, "params.sample: must be an integer >= 1 or 'all', got 0"),
        ("tau_retail.yaml", {"sample": 115}, "params.split/sample: sample 115 exceeds split 'base'"),
        ("tau_retail.yaml", {"split": "test", "sample": 41}, "sample 41 exceeds split 'test'"),
        ("tau_retail.yaml", {"split": "dev"}, "unknown split 'dev'"),
        ("tau_retail.yaml", {"data_dir": "/nonexistent"}, "params.data_dir:"),
        ("tau_retail.yaml", {"data_dir": "a\x00b"}, "params.data_dir:"),
        ("tau_contention.yaml", {"agents": 1025}, "params.agents: Input should be less than or equal to 1024"),
        ("tau_contention.yaml", {"contended": 10**6}, "params.contended: must be at most"),
        ("tau_contention.yaml", {"plan_delay_ms": [120, 20]}, "params.plan_delay_ms"),
        ("tau_contention.yaml", {"plan_delay_ms": ["a", 2]}, "params.plan_delay_ms.0"),
        ("tau_contention.yaml", {"max_attempts": 2**70}, "params.max_attempts"),
        ("leakage.yaml", {"source": "meteor"}, "params.source: Input should be 'tool_failure'"),
    ],
)
def test_workload_params_are_validated(
    tmp_path: Path, config: str, params: dict[str, Any], expected: str
) -> None:
    data = yaml.safe_load((CONFIGS / config).read_text())
    data["params"] = {**(data.get("params") or {}), **params}
    data["grid"] = {k: v for k, v in (data.get("grid") or {}).items() if not k.startswith("params.")}
    assert expected in refused(write(tmp_path, yaml.safe_dump(data)))


def test_grid_values_for_params_are_validated_per_cell(tmp_path: Path) -> None:
    data = yaml.safe_load((CONFIGS / "tau_contention.yaml").read_text())
    data["grid"] = {"params.agents": [4, "x", 9999]}
    output = refused(write(tmp_path, yaml.safe_dump(data)))
    assert "cell [agents=x]: params.agents: Input should be a valid integer" in output
    assert "cell [agents=9999]: params.agents:" in output
    assert "agents=4" not in output


def test_a_problem_shared_by_every_cell_is_said_once(tmp_path: Path) -> None:
    output = refused(write(tmp_path, tiny_text(params={"agents": "many"})))
    assert output.count("params.agents") == 1 and "cell [" not in output


@pytest.mark.parametrize("char", ["\u200b", "\ufeff", "\u202e", "\x07", "\ue000"])
def test_invisible_characters_are_refused_with_their_key(tmp_path: Path, char: str) -> None:
    tables = [{"name": "clean", "metric": "clean", "title": f"Clean{char} trials"}]
    output = refused(write(tmp_path, tiny_text(report={"tables": tables})))
    assert f"report.tables.0.title: contains U+{ord(char):04X}" in output


def test_a_title_that_is_not_mathtext_still_runs(tmp_path: Path) -> None:
    tables = [{"name": "clean", "metric": "clean", "title": "bad $\\frac$ math"}]
    path = write(tmp_path, tiny_text(report={"tables": tables, "plots": [{"table": "clean"}]}, trials=1))
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "runs"), "--jobs", "1"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


# --------------------------------------------------------------------------- size caps


def test_a_huge_grid_is_refused_before_it_is_built(tmp_path: Path) -> None:
    grid = {f"params.k{i}": list(range(10)) for i in range(10)}  # 10^10 cells
    with Stopwatch() as took:  # (time spent waiting for a busy CPU aside)
        output = refused(write(tmp_path, tiny_text(grid=grid)))
    assert took.seconds < 2
    assert "grid: 10,000,000,000 cells exceed the limit of 1,000" in output
    assert "--max-cells" in output


def test_the_size_caps_can_be_raised(tmp_path: Path) -> None:
    path = write(tmp_path, tiny_text(grid={"seed": list(range(20))}, trials=100_000))
    output = refused(path)  # 20 x 2 x 100,000 = 4,000,000 trials
    assert "4,000,000 trials exceed the limit of 1,000,000" in output and "--max-trials" in output
    result = runner.invoke(app, ["validate", str(path), "--max-trials", "4000000"])
    assert result.exit_code == 0, result.output
    assert "cells exceed the limit of 10" in refused(path, "--max-cells", "10", "--max-trials", "10000000")
    assert DEFAULT_LIMITS.max_cells == 1_000 and DEFAULT_LIMITS.max_trials == 1_000_000
    # run and sweep share the check: nothing is started.
    out = tmp_path / "runs"
    refused(path, "--out", str(out), command="run")
    refused(path, "--set", "seed=1,2", "--max-cells", "1", "--out", str(out), command="sweep")
    assert not out.exists()


# --------------------------------------------------------------------------- --set


@pytest.mark.parametrize(
    ("command", "item", "expected"),
    [
        ("run", "params.agents=foo", "params.agents: Input should be a valid integer"),
        ("run", "params.agents=1e400", "params.agents"),
        ("run", "fp=.nan", "faults.rate"),
        ("run", "name=..", "name: the name must be"),
        ("run", "a..b=1", "--set a..b: 'a..b' is not a dotted config key"),
        ("run", "faults.rate.x=1", "faults.rate: Input should be a valid number"),
        ("run", "faults=5", "faults: Input should be a valid dictionary"),
        ("sweep", "params.veto_rate=0,2", "params.veto_rate=2]: params.veto_rate"),
        ("sweep", "faults.rate=0.1,0.1", "occurs twice"),
    ],
)
def test_bad_set_values_get_the_same_validation(
    tmp_path: Path, command: str, item: str, expected: str
) -> None:
    data = {**TINY, "labels": {"faults.rate": "fp"}}
    path = write(tmp_path, yaml.safe_dump(data))
    out = tmp_path / "runs"
    output = refused(path, "--set", item, "--out", str(out), command=command)
    assert expected in output
    assert not out.exists()


@pytest.mark.parametrize("value", ["&a [*a]", "[" * 100 + "]" * 100, "{a: 1, a: 2}"])
def test_hostile_set_values_are_bad_parameters(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, tiny_text())
    result = runner.invoke(app, ["run", str(path), "--set", f"params.agents={value}", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--set" in result.output


# --------------------------------------------------------------------------- list


def test_list_shows_a_broken_config_as_invalid(tmp_path: Path) -> None:
    directory = tmp_path / "configs"
    directory.mkdir()
    write(directory, tiny_text(description="fine"), "good.yaml")
    write(directory, b"name: caf\xe9\n", "latin1.yaml")
    write(directory, BOMB, "bomb.yaml")
    write(directory, tiny_text(params={"agents": "x"}), "badparams.yaml")
    result = runner.invoke(app, ["list", "configs", "--configs", str(directory)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "fine" in result.output
    assert result.output.count("INVALID") == 3
    assert "not UTF-8" in result.output and "alias bomb" in result.output


def test_config_error_is_a_value_error_with_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, tiny_text(trials=0)))
    assert info.value.problems and "trials" in info.value.problems[0]

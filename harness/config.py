"""Experiment configs: YAML files validated by pydantic models.

A config names a workload, the modes to compare, a number of trials and a base fault
configuration, plus a grid (or an explicit list) of cells: each cell overrides dotted keys
of the config (`faults.rate`, `faults.classes`, `params.agents`, ...). Every cell is
validated as a whole config, so an out-of-range value in a grid is reported by its key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import ConfigError  # defined there (cheap to import); used here
from harness.faults import FaultConfig
from harness.modes import ModeSettings
from harness.policies import AgentConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SettingsModel(_Strict):
    """Time-outs and retry bounds shared by every mode (simulated milliseconds)."""

    timeout_ms: float = Field(30_000.0, gt=0)
    apply_attempts: int = Field(8, ge=1, le=20)
    step_retries: int = Field(2, ge=0, le=20)
    backoff_ms: float = Field(20.0, ge=0)

    def mode_settings(self) -> ModeSettings:
        return ModeSettings(self.timeout_ms, self.apply_attempts, self.step_retries, self.backoff_ms)


class ToolModel(_Strict):
    """Simulated tool latency per real delivery."""

    latency_ms: float = Field(5.0, ge=0)
    jitter_ms: float = Field(2.0, ge=0)


class TableModel(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    metric: str
    kind: Literal["proportion", "mean", "per_1000", "sum"] = "proportion"
    columns: list[str] = []
    rows: str = "mode"
    title: str = ""
    method: Literal["clopper-pearson", "wilson"] = "clopper-pearson"
    # What must have occurred in a cell for it to be a result (else "n/a (not exercised)");
    # None: the default rule of harness.report.is_exercised.
    requires: Literal[
        "faults", "F1", "F2", "F3", "F4", "F5",
        "aborts", "compensations", "irreversible_calls", "sends", "none",
    ] | None = None


class PlotModel(_Strict):
    table: str
    kind: Literal["bar", "line"] = "bar"
    x: str | None = None
    name: str = ""


class ReportModel(_Strict):
    tables: list[TableModel] = []
    plots: list[PlotModel] = []
    main: str | None = None  # the table printed in the terminal; default: the first


class ExperimentConfig(_Strict):
    """One experiment. See configs/README.md for every key."""

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    workload: str
    params: dict[str, Any] = {}
    seed: int = 0
    trials: int = Field(ge=1, le=1_000_000)
    modes: list[str] = Field(min_length=1)
    faults: FaultConfig = FaultConfig()
    grid: dict[str, list[Any]] = {}
    cells: list[dict[str, Any]] = []
    labels: dict[str, str] = {}
    settings: SettingsModel = SettingsModel()
    agent: AgentConfig = AgentConfig()
    tool: ToolModel = ToolModel()
    report: ReportModel = ReportModel()

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, v: str) -> str:
        from harness.workloads import WORKLOADS

        if v not in WORKLOADS:
            raise ValueError(f"unknown workload {v!r}; allowed: {', '.join(sorted(WORKLOADS))}")
        return v

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, v: list[str]) -> list[str]:
        from harness.modes import modes

        known = modes()
        bad = [m for m in v if m not in known]
        if bad:
            raise ValueError(f"unknown mode(s) {bad}; allowed: {', '.join(sorted(known))}")
        if len(set(v)) != len(v):
            raise ValueError("a mode is listed twice")
        return v

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"grid key {key!r} has no values")
        return v


def _format_loc(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _problems(exc: ValidationError, prefix: str = "") -> list[str]:
    out = []
    for err in exc.errors():
        loc = _format_loc(err["loc"])
        value = err.get("input")
        shown = "" if isinstance(value, dict) or "got" in err["msg"] else f" (got {value!r})"
        out.append(f"{prefix}{loc}: {err['msg']}{shown}")
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise KeyError(f"{key}: {part!r} is not a mapping")
        node = nxt
    node[parts[-1]] = value


def get_dotted(data: Mapping[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


def load_config(
    path: str | Path,
    *,
    overrides: Mapping[str, Any] | None = None,
    grid: Mapping[str, list[Any]] | None = None,
) -> ExperimentConfig:
    """Read and validate a config file; raise ConfigError naming file and key on any problem.

    `overrides` set dotted keys; `grid` adds (or replaces) grid keys. Both apply before
    validation.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path, [f"cannot read: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(path, [f"not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(path, ["(top level): must be a mapping of keys to values"])
    data.setdefault("name", path.stem)
    for key, value in (overrides or {}).items():
        try:
            set_dotted(data, key, value)
        except KeyError as exc:
            raise ConfigError(path, [str(exc)]) from None
    base = data.get("grid")
    if grid and (base is None or isinstance(base, dict)):  # a broken grid is left to validation
        data["grid"] = {**(base or {}), **grid}
    return validate_config(data, path)


def validate_config(data: dict[str, Any], path: str | Path = "<config>") -> ExperimentConfig:
    try:
        config = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, _problems(exc)) from None
    problems = []
    for cell in expand_cells(config):
        try:
            cell_config(config, cell)
        except ValidationError as exc:
            label = ", ".join(f"{k}={v}" for k, v in cell.items())
            problems.extend(_problems(exc, prefix=f"cell [{label}]: "))
        except KeyError as exc:
            problems.append(f"cell: {exc.args[0]}")
    from harness.workloads import get_workload

    workload = get_workload(config.workload)
    check = getattr(workload, "check", None)
    if check is not None:
        for cell in expand_cells(config):
            try:
                check(cell_config(config, cell).params)
            except (ValueError, KeyError) as exc:
                problems.append(str(exc))
                break
            except ValidationError:
                break  # already reported above
    names = {t.name for t in config.report.tables}
    for i, plot in enumerate(config.report.plots):
        if plot.table not in names:
            problems.append(f"report.plots.{i}.table: unknown table {plot.table!r}; allowed: {sorted(names)}")
    if config.report.main is not None and config.report.main not in names:
        problems.append(f"report.main: unknown table {config.report.main!r}; allowed: {sorted(names)}")
    if problems:
        raise ConfigError(path, problems)
    return config


def expand_cells(config: ExperimentConfig) -> list[dict[str, Any]]:
    """The cells: explicit `cells`, each crossed with the `grid` (or the grid alone)."""
    base = config.cells or [{}]
    keys = list(config.grid)
    combos = list(itertools.product(*(config.grid[k] for k in keys))) if keys else [()]
    return [{**cell, **dict(zip(keys, combo, strict=True))} for cell in base for combo in combos]


def cell_config(config: ExperimentConfig, cell: Mapping[str, Any]) -> ExperimentConfig:
    """The config with one cell's overrides applied (validated)."""
    data = config.model_dump(mode="json")
    for key, value in cell.items():
        if key == CELL_LABEL:
            continue
        set_dotted(data, key, copy.deepcopy(value))
    data["grid"], data["cells"] = {}, []
    return ExperimentConfig.model_validate(data)


CELL_LABEL = "label"  # a cell key that names the cell instead of overriding a config key


def cell_label(config: ExperimentConfig, key: str) -> str:
    return config.labels.get(key, key)


def cell_id(config: ExperimentConfig, cell: Mapping[str, Any]) -> str:
    if not cell:
        return "all"
    if CELL_LABEL in cell:
        # A named cell is its label plus the grid keys it was crossed with.
        shown = {CELL_LABEL: cell[CELL_LABEL], **{k: v for k, v in cell.items() if k in config.grid}}
        return ",".join(f"{cell_label(config, k)}={_short(v)}" for k, v in shown.items())
    return ",".join(f"{cell_label(config, k)}={_short(v)}" for k, v in cell.items())


def _short(value: Any) -> str:
    if isinstance(value, str | int | float | bool):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def config_hash(config: ExperimentConfig) -> str:
    blob = json.dumps(config.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]

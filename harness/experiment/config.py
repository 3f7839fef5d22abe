"""Experiment configs: YAML files validated by pydantic models.

A config names a workload, the modes to compare, a number of trials and a base fault
configuration, plus a grid (or an explicit list) of cells: each cell overrides dotted keys
of the config (`faults.rate`, `faults.classes`, `params.agents`, ...). Every cell is
validated as a whole config, its `params` by the workload's own model, so an out-of-range
value in a grid is reported by its cell and key before any trial runs.

Loading is bounded (harness.experiment.yamlload): input that is not UTF-8, alias bombs, cyclic aliases,
deep nesting and repeated keys are refused, and so is a grid larger than `SizeLimits`.
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.agents.policies import AgentConfig
from harness.errors import ConfigError  # defined there (cheap to import); used here
from harness.experiment.cells import CELL_LABEL, cell_id, count_cells, expand_cells
from harness.experiment.paper_section import paper_problems
from harness.experiment.sections import (
    DOTTED_KEY,
    MAX_MS,
    PaperTableModel,
    ReportModel,
    RetriesModel,
    StrictModel,
    check_dotted_key,
    check_identifier,
)
from harness.experiment.yamlload import MAX_BYTES, YamlInputError, load_yaml
from harness.modes.base import DeliveryLimits, ModeSettings
from harness.registry import did_you_mean
from harness.world.faults import FaultConfig


@dataclass(frozen=True)
class SizeLimits:
    """Caps on what one config may plan; `validate`, `run` and `sweep` enforce them before
    expanding the grid (a 10^10-cell grid must be refused, not built). The options
    `--max-cells` and `--max-trials` raise them."""

    # The paper's configs have at most 15 cells; 1,000 validate in well under a second
    # (each cell is a whole config to check), 10,000 take seconds.
    max_cells: int = 1_000
    max_trials: int = 1_000_000  # cells x modes x trials per cell


DEFAULT_LIMITS = SizeLimits()


class SettingsModel(StrictModel):
    """Time-outs and the modes' native retry bounds (simulated milliseconds); a `retries:`
    section overrides the retry bounds for every mode alike."""

    timeout_ms: float = Field(30_000.0, gt=0, le=MAX_MS)
    apply_attempts: int = Field(8, ge=1, le=20)
    step_retries: int = Field(2, ge=0, le=20)
    backoff_ms: float = Field(20.0, ge=0, le=MAX_MS)

    def mode_settings(self, retries: RetriesModel | None = None) -> ModeSettings:
        """The settings modes read, with the `retries:` bounds (if any) applied."""
        bounds = retries.bounds() if retries is not None else {}
        # One shared (frozen) instance per value: a plan asks once per trial and mode.
        return _mode_settings(
            self.timeout_ms, self.apply_attempts, self.step_retries, self.backoff_ms,
            DeliveryLimits(**bounds),
        )


@functools.lru_cache(maxsize=256)
def _mode_settings(
    timeout_ms: float, apply_attempts: int, step_retries: int, backoff_ms: float,
    retries: DeliveryLimits,
) -> ModeSettings:
    return ModeSettings(timeout_ms, apply_attempts, step_retries, backoff_ms, retries)


class ToolModel(StrictModel):
    """Simulated tool latency per real delivery."""

    latency_ms: float = Field(5.0, ge=0, le=MAX_MS)
    jitter_ms: float = Field(2.0, ge=0, le=MAX_MS)


class ExperimentConfig(StrictModel):
    """One experiment. See configs/README.md for every key."""

    name: str | None = None
    description: str = ""
    workload: str
    # Kept as written (the manifest and config hash are unchanged); validated per cell by
    # the workload's own model in validate_config.
    params: dict[str, Any] = {}
    seed: int = Field(0, ge=-(2**63), le=2**63 - 1)
    trials: int = Field(ge=1, le=1_000_000)
    modes: list[str] = Field(min_length=1)
    faults: FaultConfig = FaultConfig()
    grid: dict[str, list[Any]] = {}
    cells: list[dict[str, Any]] = []
    labels: dict[str, str] = {}
    settings: SettingsModel = SettingsModel()
    # One delivery budget for every mode (None: each mode at its native bounds, `settings`).
    retries: RetriesModel | None = None
    agent: AgentConfig = AgentConfig()
    tool: ToolModel = ToolModel()
    report: ReportModel = ReportModel()
    paper: list[PaperTableModel] = []
    # Trial stores on disk and fsynced (harness.world.substrates.TrialEnv); false: RAM, no fsync.
    durable: bool = False

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        # Left out while false, so configs from before the key keep their hash (and their
        # runs stay resumable); true is dumped, hashed and stored like any other key.
        if not self.durable:
            data.pop("durable", None)
        if self.retries is None:
            data.pop("retries", None)  # likewise: configs without it keep their hash
        return data

    @model_validator(mode="after")
    def _one_budget(self) -> ExperimentConfig:
        # `retries` gives every mode the same budget; per-mode wrapper retries would give some
        # modes more deliveries below the agent than others again.
        if self.retries is not None and self.agent.wrapper_retries_by_mode:
            raise ValueError(
                "retries: gives every mode the same delivery budget, but "
                f"agent.wrapper_retries_by_mode gives {sorted(self.agent.wrapper_retries_by_mode)} "
                "their own wrapper retries; drop one of the two (a uniform "
                "agent.wrapper_retries is allowed)"
            )
        return self

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        # The name is a directory under --out: "..", "a/b" or "/x" would write elsewhere.
        return v if v is None else check_identifier(v, "the name")

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, v: str) -> str:
        from harness.workloads import WORKLOADS

        if v not in WORKLOADS:
            hint = did_you_mean(v, sorted(WORKLOADS))
            raise ValueError(
                f"unknown workload {v!r}{hint}; allowed: {', '.join(sorted(WORKLOADS))}"
            )
        return v

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, v: list[str]) -> list[str]:
        from harness.modes.registry import modes

        known = modes()
        bad = [m for m in v if m not in known]
        if bad:
            raise ValueError(unknown_modes_message(bad, known))
        if len(set(v)) != len(v):
            raise ValueError("a mode is listed twice")
        return v

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            check_dotted_key(key)
            if not values:
                raise ValueError(f"grid key {key!r} has no values")
        return v

    @field_validator("cells")
    @classmethod
    def _cell_keys(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, cell in enumerate(v):
            for key in cell:
                try:
                    check_dotted_key(key)
                except ValueError as exc:
                    raise ValueError(f"cell {i}: {exc}") from None
            if CELL_LABEL in cell:
                check_identifier(cell[CELL_LABEL], f"cell {i}'s label")
        return v

    @field_validator("labels")
    @classmethod
    def _label_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key, label in v.items():
            check_dotted_key(key)
            check_identifier(label, f"the label of {key}")
        if len(set(v.values())) != len(v):
            raise ValueError("two keys have the same label")
        return v


def unknown_modes_message(bad: Sequence[str], known: Sequence[str]) -> str:
    """`unknown mode 'tx-ful'; did you mean tx-full?; allowed: ...`."""
    hints = [h for h in (did_you_mean(b, sorted(known), "") for b in bad) if h]
    which = f"mode {bad[0]!r}" if len(bad) == 1 else f"modes {list(bad)}"
    hint = f"; {'; '.join(hints)}" if hints else ""
    return f"unknown {which}{hint}; allowed: {', '.join(sorted(known))}"


def _sub_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (`FaultConfig`, `FaultConfig | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def key_choices(model: type[BaseModel], parts: Sequence[str]) -> list[str] | None:
    """The keys allowed beside the last of `parts` under `model` (dotted, full path), or
    None when the path leaves the models (a free mapping such as `params`, or a list)."""
    for part in parts[:-1]:
        field = model.model_fields.get(part)
        sub = _sub_model(field.annotation) if field is not None else None
        if sub is None:
            return None
        model = sub
    prefix = ".".join(parts[:-1])
    return [f"{prefix}.{name}" if prefix else name for name in model.model_fields]


def unknown_key(key: str, model: type[BaseModel] | None = None) -> str | None:
    """`unknown key faults.rat; did you mean faults.rate?` if the dotted `key` names no
    config key (None if it does, or if it is under a free mapping such as `params`)."""
    parts = key.split(".")
    choices = key_choices(model or ExperimentConfig, parts)
    if choices is None or key in choices:
        return None
    if not parts[-1].isidentifier() and len(parts) > 1:
        return None  # a list index or similar: left to validation
    return f"unknown key {key}{did_you_mean(key, choices)}"


def _format_loc(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _problems(
    exc: ValidationError, under: str = "", model: type[BaseModel] | None = None
) -> list[str]:
    """One line per error: `<under>.<key path>: <message> (got <value>)`; an unknown key is
    `unknown key <path>; did you mean <path>?` (`model`: the one validated, for the hint)."""
    out = []
    for err in exc.errors():
        loc = [under] if under else []
        loc += [str(p) for p in err["loc"]]
        if err["type"] == "extra_forbidden" and err["loc"]:
            parts = [str(p) for p in err["loc"]]
            choices = key_choices(model or ExperimentConfig, parts)
            shown = ".".join(loc)
            if choices is not None:
                prefix = f"{under}." if under else ""
                hint = did_you_mean(".".join(parts), choices)
                hint = hint.replace("did you mean ", f"did you mean {prefix}")
                out.append(f"unknown key {shown}{hint}")
                continue
        msg = err["msg"].removeprefix("Value error, ")
        # A model-level check names its key itself ("agents: must be ..."): make it the path.
        named = re.match(r"([A-Za-z0-9_/]+): ", msg) if not err["loc"] else None
        if named:
            loc.append(named.group(1))
            msg = msg[named.end() :]
        value = err.get("input")
        shown = "" if isinstance(value, dict) or "got" in msg else f" (got {_short_repr(value)})"
        out.append(f"{_format_loc(loc)}: {msg}{shown}")
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
    limits: SizeLimits | None = DEFAULT_LIMITS,
) -> ExperimentConfig:
    """Read and validate a config file; raise ConfigError naming file and key on any problem.

    `overrides` set dotted keys; `grid` adds (or replaces) grid keys. Both apply before
    validation, so a bad `--set` value is reported like a bad value in the file. `limits`
    caps cells and trials (None: no cap).
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)  # bounded: the path may be /dev/zero
    except FileNotFoundError:
        raise ConfigError(path, [f"no such file{_similar_file(path)}"]) from None
    except OSError as exc:
        raise ConfigError(path, [f"cannot read: {exc.strerror or exc}"]) from None
    try:
        data = load_yaml(raw)
    except YamlInputError as exc:
        raise ConfigError(path, [str(exc)]) from None
    if not isinstance(data, dict):
        raise ConfigError(path, ["(top level): must be a mapping of keys to values"])
    if "name" not in data:
        try:
            data["name"] = check_identifier(path.stem, "the file name")
        except ValueError as exc:
            raise ConfigError(path, [f"name: not given, and {exc}; add a `name:` key"]) from None
    for key, value in (overrides or {}).items():
        unknown = unknown_key(key) if DOTTED_KEY.fullmatch(key) else None
        if unknown:
            raise ConfigError(path, [f"--set {key}: {unknown}"])
        try:
            set_dotted(data, check_dotted_key(key), value)
        except (KeyError, ValueError) as exc:
            raise ConfigError(path, [f"--set {key}: {exc.args[0]}"]) from None
    base = data.get("grid")
    if grid and (base is None or isinstance(base, dict)):  # a broken grid is left to validation
        data["grid"] = {**(base or {}), **grid}
    config = validate_config(data, path, limits)
    # An override of the modes or cells (`--modes`, `sweep --set`) may drop what the paper
    # section maps; that is a narrower run, not a broken file, so only the file's own
    # mapping against the paper's cells is checked then.
    reshaped = bool(grid) or any(
        k.split(".")[0] in ("modes", "grid", "cells", "labels") for k in overrides or {}
    )
    problems = paper_problems(config, against_config=not reshaped)
    if problems:
        raise ConfigError(path, problems)
    return config


def _similar_file(path: Path) -> str:
    """`; did you mean configs/tau_retail.yaml?` for a mistyped config file name."""
    try:
        names = sorted(p.name for p in path.parent.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"; did you mean {path.parent / close[0]}?" if close else ""


# More lines than this are summarised: a 10,000-cell grid with one bad key is one problem.
MAX_PROBLEMS = 12


# Control, format (zero-width, BOM, bidi), surrogate and private-use characters: never
# meant in a config, invisible when read, and they break what the text is written into
# (a U+FEFF in a title stops matplotlib's PDF writer; a lone surrogate cannot be UTF-8).
_INVISIBLE = frozenset(("Cc", "Cf", "Cs", "Co"))
_ALLOWED_CONTROLS = frozenset("\n\t")


def _unprintable(node: Any, loc: str = "") -> list[str]:
    """`<key path>: ...` for every string (key or value) holding such a character."""
    found: list[str] = []

    def check(text: str, where: str) -> None:
        for i, ch in enumerate(text):
            if ch not in _ALLOWED_CONTROLS and unicodedata.category(ch) in _INVISIBLE:
                found.append(
                    f"{where or '(top level)'}: contains U+{ord(ch):04X} ({unicodedata.name(ch, 'a control character')}) "
                    f"at position {i}; only visible text is allowed"
                )
                return

    if isinstance(node, str):
        check(node, loc)
    elif isinstance(node, dict):
        for key, value in node.items():
            where = f"{loc}.{key}" if loc else str(key)
            if isinstance(key, str):
                check(key, where)
            found += _unprintable(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _unprintable(value, f"{loc}.{i}" if loc else str(i))
    return found


def check_size(config: ExperimentConfig, limits: SizeLimits, path: str | Path = "<config>") -> None:
    """ConfigError if the config plans more cells or trials than `limits` allow."""
    cells = count_cells(config)
    if cells > limits.max_cells:
        raise ConfigError(path, [
            f"grid: {cells:,} cells exceed the limit of {limits.max_cells:,} "
            "(raise it with --max-cells N if you mean it)"
        ])
    total = cells * len(config.modes) * config.trials
    if total > limits.max_trials:
        raise ConfigError(path, [
            f"trials: {cells:,} cells x {len(config.modes)} modes x {config.trials:,} trials = "
            f"{total:,} trials exceed the limit of {limits.max_trials:,} "
            "(lower --trials, or raise the limit with --max-trials N)"
        ])


def validate_config(
    data: dict[str, Any], path: str | Path = "<config>", limits: SizeLimits | None = None
) -> ExperimentConfig:
    """The validated config, or ConfigError listing every problem (file, cell and key).

    Guarantees on success: every cell, merged with the base config, is a valid config whose
    `params` the cell's workload accepts; cell ids are unique; plots and `report.main` name
    existing tables; with `limits`, the grid is within them; no text holds an invisible
    character.
    """
    from harness.workloads import params_model

    unprintable = _unprintable(data)
    if unprintable:
        raise ConfigError(path, unprintable[:MAX_PROBLEMS])
    try:
        config = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, _problems(exc)) from None
    if limits is not None:
        check_size(config, limits, path)
    cells = expand_cells(config)
    base = config.model_dump(mode="json")
    per_cell: list[list[str]] = []
    seen: set[str] = set()
    checked: dict[str, list[str]] = {}  # params -> their problems: cells often share params
    for cell in cells:
        cid = cell_id(config, cell)
        found: list[str] = []
        if cid in seen:
            found.append(f"cell id {cid!r} occurs twice (a repeated grid value or cell); cell ids must be unique")
        seen.add(cid)
        try:
            cfg = cell_config(config, cell, base=base)
        except ValidationError as exc:
            found.extend(_problems(exc))
        except KeyError as exc:
            found.append(str(exc.args[0]))
        else:
            key = repr((cfg.workload, cfg.params))
            if key not in checked:
                try:
                    params_model(cfg.workload).model_validate(cfg.params)
                    checked[key] = []
                except ValidationError as exc:
                    checked[key] = _problems(
                        exc, under="params", model=params_model(cfg.workload)
                    )
            found.extend(checked[key])
            found.extend(_agent_kind_problems(cfg))
        per_cell.append(found)
    problems = _merge_cell_problems(config, cells, per_cell)
    names = {t.name for t in config.report.tables}
    for i, plot in enumerate(config.report.plots):
        if plot.table not in names:
            problems.append(f"report.plots.{i}.table: unknown table {plot.table!r}; allowed: {sorted(names)}")
    if config.report.main is not None and config.report.main not in names:
        problems.append(f"report.main: unknown table {config.report.main!r}; allowed: {sorted(names)}")
    if problems:
        raise ConfigError(path, problems)
    return config


def _agent_kind_problems(cfg: ExperimentConfig) -> list[str]:
    """The do-nothing control on a workload that probes a mechanism would read as clean
    whatever the mechanism did, so it is refused there rather than reported."""
    from harness.workloads import WORKLOADS

    if cfg.agent.kind == "noop" and getattr(WORKLOADS[cfg.workload], "probes_mechanism", False):
        return [
            f"agent.kind: 'noop' does not apply to workload {cfg.workload!r}: its trials "
            "probe a mechanism whose verdict holds whatever the agent does, so an idle agent "
            "would read as clean; allowed here: gold, llm-like"
        ]
    return []


def _merge_cell_problems(
    config: ExperimentConfig, cells: list[dict[str, Any]], per_cell: list[list[str]]
) -> list[str]:
    """A problem every cell has is said once without a cell; the others name their cell."""
    common = set.intersection(*(set(p) for p in per_cell)) if len(cells) > 1 else set()
    problems = [p for p in per_cell[0] if p in common] if common else []
    for cell, found in zip(cells, per_cell, strict=True):
        label = "" if cell == {} else f"cell [{cell_id(config, cell)}]: "
        problems.extend(f"{label}{p}" for p in found if p not in common)
    if len(problems) > MAX_PROBLEMS:
        more = len(problems) - MAX_PROBLEMS + 1
        problems = [*problems[: MAX_PROBLEMS - 1], f"... and {more:,} more problems"]
    return problems


def config_difference(stored: Any, now: Any, at: str = "") -> str | None:
    """The first key where two dumped configs differ: `trials: 30 in the run, 10 now`."""
    if isinstance(stored, dict) and isinstance(now, dict):
        for key in [*stored, *(k for k in now if k not in stored)]:
            where = f"{at}.{key}" if at else str(key)
            if key not in now:
                return f"{where}: {_short_repr(stored[key])} in the run, not set now"
            if key not in stored:
                return f"{where}: not in the run, {_short_repr(now[key])} now"
            found = config_difference(stored[key], now[key], where)
            if found:
                return found
        return None
    if stored != now or type(stored) is not type(now):
        return f"{at or '(config)'}: {_short_repr(stored)} in the run, {_short_repr(now)} now"
    return None


def config_hash(config: ExperimentConfig) -> str:
    # `paper` says how runs compare with the paper, not what they run: editing it must not
    # orphan a run's records.
    blob = json.dumps(config.model_dump(mode="json", exclude={"paper"}), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cell_config(
    config: ExperimentConfig, cell: Mapping[str, Any], *, base: dict[str, Any] | None = None
) -> ExperimentConfig:
    """The config with one cell's overrides applied (validated).

    `base` is `config.model_dump(mode="json")` when the caller has it: dumping once for
    many cells is what keeps a large grid quick. It is not modified.
    """
    data = dict(config.model_dump(mode="json") if base is None else base)
    data["grid"], data["cells"] = {}, []
    for key, value in cell.items():
        if key == CELL_LABEL:
            continue
        # Copy only the mappings on the key's path: the rest is shared with `base`, which
        # neither this nor pydantic's validation mutates.
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is not None and not isinstance(nxt, dict):
                raise KeyError(f"{key}: {part!r} is not a mapping")
            node[part] = nxt = dict(nxt or {})
            node = nxt
        node[parts[-1]] = copy.deepcopy(value)
    return ExperimentConfig.model_validate(data)

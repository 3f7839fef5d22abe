"""Command-line overrides of a config: `--trials/--seed/--modes`, `run --set KEY=VALUE`,
`sweep --set KEY=V1,V2,...`, the size caps, and the stored config a resumed run starts from.

A bad flag value is a `ConfigError` whose `path` is the flag (`--set`, `--modes`), so that the
caller can blame the flag rather than the config file; a comma-separated list with an empty
item is a plain `ValueError` whose message names the flag itself. A problem of the config
(or of the run directory) is a `ConfigError` naming the file (or a `RunError`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.experiment.config import (
    DEFAULT_LIMITS,
    ExperimentConfig,
    SizeLimits,
    set_dotted,
    unknown_key,
    unknown_modes_message,
    validate_config,
)
from harness.experiment.rundir import MANIFEST, read_manifest
from harness.experiment.sections import DOTTED_KEY
from harness.experiment.yamlload import MAX_BYTES, YamlInputError, load_yaml
from harness.modes.registry import modes as known_modes
from harness.registry import did_you_mean

SET = "--set"


def size_limits(max_cells: int | None, max_trials: int | None) -> SizeLimits:
    """The size caps for load_config: the defaults, raised (or lowered) where given."""
    return SizeLimits(
        max_cells=max_cells or DEFAULT_LIMITS.max_cells,
        max_trials=max_trials or DEFAULT_LIMITS.max_trials,
    )


def split_list(value: str, what: str) -> list[str]:
    """`a,b` as ["a", "b"]; ValueError naming `what` (the flag) if an item is empty."""
    items = [v.strip() for v in value.split(",")]
    if not all(items):
        raise ValueError(
            f"{what} must be a comma-separated list without empty items, got {value!r}"
        )
    return items


def check_modes(names: list[str]) -> list[str]:
    """`--modes` names, checked here so that a typo blames the flag, not the config file."""
    known = known_modes()
    bad = [m for m in names if m not in known]
    if bad:
        raise ConfigError("--modes", [unknown_modes_message(bad, list(known))])
    if len(set(names)) != len(names):
        raise ConfigError("--modes", [f"a mode is listed twice in {','.join(names)!r}"])
    return names


def flag_overrides(trials: int | None, seed: int | None, modes: str | None) -> dict[str, Any]:
    """The config keys `--trials`, `--seed` and `--modes` override (only those given)."""
    out: dict[str, Any] = {}
    if trials is not None:
        out["trials"] = trials
    if seed is not None:
        out["seed"] = seed
    if modes is not None:
        out["modes"] = check_modes(split_list(modes, "--modes"))
    return out


def check_set_key(item: str, key: str, labels: Iterable[str] = ()) -> None:
    """Refuse a `--set` key that names no config key (with a did-you-mean among the config
    keys, else among `labels`)."""
    if not DOTTED_KEY.fullmatch(key):
        return  # load_config says what a dotted key is
    problem = unknown_key(key)
    if problem is None:
        return
    if "did you mean" not in problem:
        problem += did_you_mean(key, list(labels))
    raise ConfigError(SET, [f"{item!r}: {problem}"])


def set_value(item: str, text: str) -> Any:
    """One `--set` value, parsed as YAML by the config loader's bounded parser."""
    try:
        return load_yaml(text)
    except YamlInputError as exc:
        raise ConfigError(SET, [f"{item!r}: {exc}"]) from None


def key_value(item: str, expected: str) -> tuple[str, str]:
    """One `--set` item split at its first `=`, or refused saying what is `expected`."""
    key, eq, value = item.partition("=")
    key = key.strip()
    if not eq or not key or not value.strip():
        raise ConfigError(SET, [f"expected {expected}, got {item!r}"])
    return key, value


def sweep_grid(sets: list[str]) -> dict[str, list[Any]]:
    """`sweep --set KEY=V1,V2,...`: the grid keys to add (or replace), with their values."""
    grid: dict[str, list[Any]] = {}
    for item in sets:
        key, values = key_value(item, "KEY=V1,V2,... (e.g. faults.rate=0,0.1)")
        check_set_key(item, key)
        grid[key] = [set_value(item, v) for v in split_list(values, f"--set {key}")]
    return grid


def raw_config(config: Path | None, resume: Path | None) -> dict[str, Any]:
    """The mapping `run --set` resolves labels and grid keys against: the config file, else
    (resuming without one) the run's stored config; RunError if that run has none.

    A file that cannot be read or parsed gives {}: load_config reports its problem itself.
    """
    if config is None:
        return read_manifest(resume)["config"] if resume is not None else {}
    try:
        with config.open("rb") as fh:
            raw = load_yaml(fh.read(MAX_BYTES + 1))
    except (OSError, YamlInputError):
        raw = None
    return raw if isinstance(raw, dict) else {}


def run_sets(
    raw: Mapping[str, Any], sets: list[str] | None
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """`run --set KEY=VALUE`: (overrides, grid) for load_config; `raw` is the config.

    KEY is a dotted config key or one of the config's labels (e.g. `fp`). A key the grid
    varies is pinned to the one value (a one-value grid), so the cell id still names it,
    spelled as the grid spells it (`fp=0` pins the grid's 0.0: cell `fp=0.0`).
    """
    if not sets:
        return {}, {}
    labels, raw_grid = raw.get("labels"), raw.get("grid")
    if not isinstance(labels, dict):
        labels = {}  # load_config reports a malformed section itself
    if not isinstance(raw_grid, dict):
        raw_grid = {}
    by_label = {str(label): str(key) for key, label in labels.items()}
    overrides: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    for item in sets:
        key, value = key_value(item, "KEY=VALUE (e.g. agent.kind=gold or fp=0.1)")
        if key not in by_label:
            check_set_key(item, key, by_label)
        key = by_label.get(key, key)
        parsed = set_value(item, value)
        if key in raw_grid:
            values = raw_grid[key] if isinstance(raw_grid[key], list) else []
            # True == 1 in Python, but a grid of 1s is not pinned by `--set key=true`.
            same = [
                v for v in values if v == parsed and isinstance(v, bool) == isinstance(parsed, bool)
            ]
            grid[key] = [same[0] if same else parsed]
        else:
            overrides[key] = parsed
    return overrides, grid


def stored_config(
    run_dir: Path,
    overrides: Mapping[str, Any] | None = None,
    grid: Mapping[str, list[Any]] | None = None,
    limits: SizeLimits = DEFAULT_LIMITS,
) -> ExperimentConfig:
    """The resolved config a run directory's manifest keeps, with `overrides` and `grid`
    applied and validated; RunError if it is not a usable run, ConfigError naming the
    manifest if the result is not a valid config."""
    data = copy.deepcopy(read_manifest(run_dir)["config"])
    path = run_dir / MANIFEST
    for key, value in (overrides or {}).items():
        try:
            set_dotted(data, key, value)
        except KeyError as exc:
            raise ConfigError(path, [f"--set {key}: {exc.args[0]}"]) from None
    if grid:
        data["grid"] = {**(data.get("grid") or {}), **grid}
    return validate_config(data, path, limits)

"""configs/README.md documents exactly the keys the config models accept."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from harness.analysis.runs import check_report
from harness.experiment.config import ExperimentConfig, validate_config

README = Path(__file__).resolve().parents[1] / "configs" / "README.md"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    # An optional section (`retries: RetriesModel | None`) documents its model's keys.
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return _model_of(args[0]) if len(args) == 1 else None


def field_paths(model: type[BaseModel] = ExperimentConfig, prefix: str = "") -> dict[str, Any]:
    """Every key path of the models: `faults.rate`, `report.tables[].name`, ..."""
    paths: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        path = prefix + name
        paths[path] = info.annotation
        nested = _model_of(info.annotation)
        args = typing.get_args(info.annotation)
        if nested is not None:
            paths.update(field_paths(nested, path + "."))
        elif typing.get_origin(info.annotation) is list and args and _model_of(args[0]):
            paths.update(field_paths(args[0], path + "[]."))
    return paths


def _free_form(annotation: Any) -> bool:
    """A mapping of arbitrary keys (e.g. `params`): anything below it is not a model key."""
    return typing.get_origin(annotation) is dict


def readme() -> str:
    return README.read_text(encoding="utf-8")


def documented_keys(text: str) -> list[str]:
    """The first column of every key table: rows like "| `faults.rate` | ... |"."""
    return re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)


def test_every_field_is_documented() -> None:
    text = readme()
    missing = [p for p in field_paths() if f"`{p}`" not in text]
    assert not missing, f"configs/README.md does not document: {missing}"


def test_key_tables_list_exactly_the_model_fields() -> None:
    keys = documented_keys(readme())
    assert len(keys) == len(set(keys)), "a key is documented twice"
    paths = set(field_paths())
    assert set(keys) - paths == set(), "README documents keys the models do not have"
    assert paths - set(keys) == set(), "README key tables miss model keys"


def test_readme_mentions_no_unknown_key() -> None:
    paths = field_paths()
    top = {p for p in paths if "." not in p and "[" not in p}
    unknown = []
    for token in re.findall(
        r"`([A-Za-z_][A-Za-z0-9_]*(?:(?:\[\])?\.[A-Za-z_][A-Za-z0-9_]*)+)`", readme()
    ):
        if token.split(".")[0].split("[")[0] not in top:
            continue  # not a config key (e.g. a module name)
        parts = token.split(".")
        known = token in paths or any(
            ".".join(parts[:i]) in paths and _free_form(paths[".".join(parts[:i])])
            for i in range(1, len(parts))
        )
        if not known:
            unknown.append(token)
    assert not unknown, f"configs/README.md mentions keys the models do not have: {unknown}"


def test_readme_example_is_a_valid_config() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", readme(), flags=re.DOTALL)
    assert blocks, "configs/README.md has no YAML example"
    for block in blocks:
        config = validate_config(yaml.safe_load(block), README)
        check_report(config, README)

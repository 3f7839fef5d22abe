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
    "webshop": ("harness.workloads.webshop", "WebshopWorkload"),
    "desktop": ("harness.workloads.desktop", "DesktopWorkload"),
    "aliasing": ("harness.workloads.aliasing", "AliasingWorkload"),
    "annotation_errors": ("harness.workloads.annotation_errors", "AnnotationErrorsWorkload"),
    "crash_windows": ("harness.workloads.crash_windows", "CrashWindowsWorkload"),
    "integration_cost": ("harness.workloads.integration_cost", "IntegrationCostWorkload"),
    "speculation": ("harness.workloads.speculation", "SpeculationWorkload"),
    "granularity": ("harness.workloads.granularity", "GranularityWorkload"),
    "frontier_contract": ("harness.workloads.frontier_contract", "FrontierContractWorkload"),
}


def _workload_class(name: str) -> Any:
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; allowed: {', '.join(sorted(WORKLOADS))}")
    module, cls = WORKLOADS[name]
    return getattr(importlib.import_module(module), cls)


def get_workload(name: str) -> Any:
    return _workload_class(name)()


def params_model(name: str) -> Any:
    """The pydantic model (a harness.workloads.base.WorkloadParams) of a workload's `params`:
    every workload class declares it as `Params`, so the registry above is the only list."""
    return _workload_class(name).Params

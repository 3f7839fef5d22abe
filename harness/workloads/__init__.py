"""The table of workloads: a workload is a module (a class with `name`, `description`,
`tools`, a `Params` model and `scenario`, see `harness.workloads.base.Workload`) plus one row
here. Each row names its class lazily, so that naming a workload imports only that one."""

from __future__ import annotations

from typing import Any

from harness.registry import Entry, Registry

WORKLOADS: Registry[Any] = Registry("workload", [
    Entry(name, target)
    for name, target in (
        ("synthetic", "harness.workloads.synthetic:SyntheticWorkload"),
        ("tau_retail", "harness.workloads.retail.workload:TauRetailWorkload"),
        ("tau_contention", "harness.workloads.retail.workload:TauContentionWorkload"),
        ("tau_airline", "harness.workloads.airline.workload:TauAirlineWorkload"),
        ("tau_airline_stress", "harness.workloads.airline.stress:TauAirlineStressWorkload"),
        ("leakage", "harness.workloads.leakage:LeakageWorkload"),
        ("webshop", "harness.workloads.webshop:WebshopWorkload"),
        ("desktop", "harness.workloads.desktop:DesktopWorkload"),
        ("aliasing", "harness.workloads.aliasing:AliasingWorkload"),
        ("annotation_errors", "harness.workloads.annotation_errors:AnnotationErrorsWorkload"),
        ("crash_windows", "harness.workloads.crash_windows:CrashWindowsWorkload"),
        ("integration_cost", "harness.workloads.integration_cost:IntegrationCostWorkload"),
        ("speculation", "harness.workloads.speculation:SpeculationWorkload"),
        ("granularity", "harness.workloads.granularity:GranularityWorkload"),
        ("frontier_contract", "harness.workloads.frontier_contract:FrontierContractWorkload"),
        ("epoch_order", "harness.workloads.epoch_order:EpochOrderWorkload"),
    )
])


def get_workload(name: str) -> Any:
    """A fresh instance of workload `name`; UnknownName (a KeyError) lists what is allowed."""
    return WORKLOADS[name]()


def params_model(name: str) -> Any:
    """The pydantic model (a harness.workloads.base.WorkloadParams) of a workload's `params`:
    every workload class declares it as `Params`, so the table above is the only list."""
    return WORKLOADS[name].Params

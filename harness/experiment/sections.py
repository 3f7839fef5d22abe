"""The models every config section is built from: the strict base (unknown keys and
non-finite numbers refused), the `report:` section (tables and plots) and the `paper:`
section (how a config's cells answer the paper's result tables; checked against the
paper's cells by `harness.experiment.paper_section`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# A name that becomes a path component (run directories, table and plot files) or a column:
# plain characters, never "." or ".." (which would leave the results directory).
IDENTIFIER = re.compile(r"[A-Za-z0-9_.-]{1,100}")


# A dotted config key, as grid keys, cell keys and --set use them: `faults.rate`.
DOTTED_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def check_identifier(value: str, what: str = "a name") -> str:
    """`value` if it is a plain identifier, else ValueError saying what is allowed."""
    if not isinstance(value, str) or not IDENTIFIER.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"{what} must be 1-100 characters of A-Z a-z 0-9 _ . - and not '.' or '..', got {value!r}"
        )
    return value


def check_dotted_key(key: Any) -> str:
    """`key` if it is a dotted config key (`faults.rate`), else ValueError."""
    if not isinstance(key, str) or not DOTTED_KEY.fullmatch(key):
        raise ValueError(
            f"{key!r} is not a dotted config key (parts of A-Z a-z 0-9 _ - joined by '.', "
            "e.g. faults.rate)"
        )
    return key



class StrictModel(BaseModel):
    # NaN and infinities are refused: a NaN passes no comparison and an infinite latency or
    # time-out never lets a trial end.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# The longest simulated duration a config may ask for: about 11.6 simulated days.
MAX_MS = 1e9


# What must have occurred in a cell for it to be a result (else "n/a (not exercised)");
# None: the default rule of harness.analysis.records.is_exercised.
Requires = Literal[
    "faults", "F1", "F2", "F3", "F4", "F5",
    "aborts", "compensations", "irreversible_calls", "sends", "none",
]


class TableModel(StrictModel):
    name: str
    metric: str
    kind: Literal["proportion", "mean", "per_1000", "sum"] = "proportion"
    columns: list[str] = []
    rows: str = "mode"
    title: str = ""
    method: Literal["clopper-pearson", "wilson"] = "clopper-pearson"
    requires: Requires | None = None

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return check_identifier(v, "a table name")


class PlotModel(StrictModel):
    table: str
    kind: Literal["bar", "line"] = "bar"
    x: str | None = None
    name: str = ""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return check_identifier(v, "a plot name") if v else v  # "": the default <table>-<kind>


class ReportModel(StrictModel):
    tables: list[TableModel] = []
    plots: list[PlotModel] = []
    main: str | None = None  # the table printed in the terminal; default: the first


#: How a paper column is measured on our trials (see configs/README.md, `paper`).
PAPER_STATS: tuple[str, ...] = ("proportion", "mean", "per_1000", "count", "trials")


class PaperRowModel(StrictModel):
    """One paper row as our trials: a mode (omitted: the config's only mode) and the cell
    parameters (labels or dotted keys, values as the config gives them) that select cells."""

    mode: str | None = None
    cell: dict[str, Any] = {}


class PaperColumnModel(StrictModel):
    """One paper column as a statistic of a metric over the selected trials, or (`of` and
    `part`) a part of another column of the table (its interval bound or count), shown with
    it and never judged on its own. Guarantees: exactly one of the two forms."""

    metric: str | None = None
    stat: Literal["proportion", "mean", "per_1000", "count", "trials"] | None = None
    cell: dict[str, Any] = {}
    scale: float = Field(1.0, gt=0, le=1e6)
    zero: bool = False
    requires: Requires | None = None
    of: str | None = None
    part: Literal["lower", "upper", "half-width", "count"] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> PaperColumnModel:
        if self.of is not None or self.part is not None:
            # By value, not by fields set: a dumped and re-validated config sets them all.
            extra = sorted(
                name
                for name, info in type(self).model_fields.items()
                if name not in ("of", "part") and getattr(self, name) != info.default
            )
            if self.of is None or self.part is None:
                raise ValueError("`of` and `part` go together (e.g. of: Leak rate, part: lower)")
            if extra:
                raise ValueError(f"a part of another column takes only `of` and `part`, not {extra}")
            return self
        if self.metric is None or self.stat is None:
            raise ValueError(
                f"a column needs `metric` and `stat` (one of {', '.join(PAPER_STATS)}), "
                "or `of` and `part`"
            )
        if self.zero and self.stat not in ("proportion", "count"):
            raise ValueError("`zero` (count trials whose metric is 0) needs stat proportion or count")
        if self.scale != 1.0 and self.stat != "mean":
            raise ValueError("`scale` applies to stat mean only")
        return self


class PaperTableModel(StrictModel):
    """How this config's trials reproduce one of the paper's result tables: paper row label
    -> our mode (and cells), paper column label -> statistic of our trials, and why the
    cells it leaves out cannot be compared. `variant` (non-empty) marks a labelled variant
    of the table's protocol, shown beside the primary reproduction and never instead of it.
    Checked against harness/experiment/paper_cells.csv when the config is loaded (`paper_problems`)."""

    table: int
    variant: str = ""
    rows: dict[str, str | PaperRowModel | list[PaperRowModel]] = {}
    columns: dict[str, PaperColumnModel] = {}
    requires: Requires | None = None
    unmapped: dict[str, str] = {}

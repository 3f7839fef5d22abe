"""The models every config section is built from: the strict base (unknown keys and
non-finite numbers refused), the `report:` section (tables and plots) and the `paper:`
section (how a config's cells answer the paper's result tables; checked against the
paper's cells by `harness.experiment.paper_section`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from harness.registry import did_you_mean

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


#: The most deliveries of one effect a `retries:` bound may allow (as `settings.apply_attempts`).
MAX_DELIVERIES = 20


class RetriesModel(StrictModel):
    """The `retries:` section: one delivery budget for every mode (configs/README.md).

    `deliveries` bounds every kind of retry loop a mode has below the agent (a call's retries,
    a commit-time apply, a confirm, a gated resend) to that many deliveries of one effect; a
    per-kind key overrides it for its kind. Guarantees: at least one key is given, each an
    integer from 1 to MAX_DELIVERIES.
    """

    deliveries: int | None = Field(None, ge=1, le=MAX_DELIVERIES, strict=True)
    call: int | None = Field(None, ge=1, le=MAX_DELIVERIES, strict=True)
    apply: int | None = Field(None, ge=1, le=MAX_DELIVERIES, strict=True)
    confirm: int | None = Field(None, ge=1, le=MAX_DELIVERIES, strict=True)
    resend: int | None = Field(None, ge=1, le=MAX_DELIVERIES, strict=True)

    @model_validator(mode="after")
    def _something_set(self) -> RetriesModel:
        if all(getattr(self, k) is None for k in type(self).model_fields):
            raise ValueError(
                "give `deliveries` (every kind of delivery) or at least one of "
                "`call`, `apply`, `confirm`, `resend` (an integer from 1 to "
                f"{MAX_DELIVERIES}), or leave the section out"
            )
        return self

    def bounds(self) -> dict[str, int]:
        """Deliveries per kind (`call`, `apply`, `confirm`, `resend`) this section sets."""
        kinds = ("call", "apply", "confirm", "resend")
        out = {k: self.deliveries for k in kinds} if self.deliveries is not None else {}
        out.update({k: v for k in kinds if (v := getattr(self, k)) is not None})
        return {k: int(v) for k, v in out.items() if v is not None}


# What must have occurred in a cell for it to be a result (else "n/a (not exercised)");
# None: the default rule of harness.analysis.exercised.is_exercised.
# "metric:NAME": the cell's trials summed the workload's metric NAME above 0.
_REQUIRES_NAMES = (
    "faults", "F1", "F2", "F3", "F4", "F5",
    "aborts", "compensations", "irreversible_calls", "sends", "none",
)


def _check_requires(v: str) -> str:
    if v in _REQUIRES_NAMES or (v.startswith("metric:") and v[len("metric:"):].isidentifier()):
        return v
    raise ValueError(
        f"unknown requirement {v!r}{did_you_mean(v, _REQUIRES_NAMES)}; allowed: "
        f"{', '.join(map(repr, _REQUIRES_NAMES))}, or 'metric:NAME' (NAME a metric of the records)"
    )


Requires = Annotated[str, AfterValidator(_check_requires)]


class TableModel(StrictModel):
    name: str
    metric: str
    kind: Literal["proportion", "mean", "per_1000", "sum"] = "proportion"
    columns: list[str] = []
    rows: str = "mode"
    title: str = ""
    method: Literal["clopper-pearson", "wilson"] = "clopper-pearson"
    requires: Requires | None = None
    # Which way of the metric is good, for the paired verdicts under the main table: None
    # reads as "higher" (success rates); "lower" for harm (residue, violations, waits, leaks).
    better: Literal["higher", "lower"] | None = None

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return check_identifier(v, "a table name")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out while unset, so configs from before the key keep their hash.
        return _without_unset(handler(self), "better")

    @property
    def direction(self) -> Literal["higher", "lower"]:
        """The good direction of the metric: `better`, else "higher"."""
        return self.better or "higher"


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
    """The `report:` section: tables, plots, the table printed in the terminal (`main`,
    default the first) and the mode the others are tested against under it (`baseline`,
    default tx-full when the config runs it)."""

    tables: list[TableModel] = []
    plots: list[PlotModel] = []
    main: str | None = None
    baseline: str | None = None

    @field_validator("baseline")
    @classmethod
    def _known_mode(cls, v: str | None) -> str | None:
        from harness.modes.registry import modes

        known = modes()
        if v is not None and v not in known:
            hint = did_you_mean(v, sorted(known))
            raise ValueError(f"unknown mode {v!r}{hint}; allowed: {', '.join(sorted(known))}")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out while unset, so configs from before the key keep their hash.
        return _without_unset(handler(self), "baseline")


def _without_unset(data: dict[str, Any], key: str) -> dict[str, Any]:
    if data.get(key) is None:
        data.pop(key, None)
    return data


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

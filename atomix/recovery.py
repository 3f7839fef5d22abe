"""Recovery: finish or undo the transactions a dead process left in its durable log.

For every unfinished transaction of a run that is no longer alive (see `atomix.log`):

- committed (its committed mark is in the log): every effect not marked settled is delivered
  again under its original idempotency key, in the order the live commit used (rows of one
  database in one SQLite transaction, then single applies, then gated releases). The stores
  (FileStore, SQLiteStore, MailboxSink) keep their applied keys durably, so an effect that had
  landed before the crash is dropped by the store: each effect is applied exactly once.
  Reversible effects of a committed transaction are final already.
- not committed: it aborts. Staged and gated effects were never applied (nothing is applied
  before the committed mark), so they are simply dropped; reversible calls that were (or may
  have been: logged as started, no result) externalised are compensated in reverse order.
- what cannot be done here is reported, and the transaction stays in the log for the next
  recovery: a user tool's effect when the program's tools are not at hand (`atomix recover`
  runs without them: "call rt.recover()"), an effect whose arguments were not exactly JSON or
  that was built by hand, a redo or compensation that raised.

A delivery that fails here counts as one more attempt: the effect stays for the next
recovery, until the log's ``max_delivery_attempts`` moves it to the dead letters. A record
that cannot be decoded is quarantined (see `TxLog.quarantine_bad_records`) and reported as
needing a human; the rest recovers. A compensation gets its key (`Call.key`, derived from the
effect's logged key, the same the live abort used; `Call.compensation_key` is the key for the
undo itself), so a compensating tool that honours it compensates at most once even when the process died between the compensation and its mark.

Housekeeping: the applied keys of dead runs that have nothing unfinished are pruned from their
stores once the log's ``key_retention`` has passed, and the temporary files a killed writer
left under a file store's root are removed.

Recovering twice is a no-op: a finished transaction's rows are gone from the log.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomix.effects import BUFFERABLE, IRREVERSIBLE, REVERSIBLE
from atomix.log import TxLog
from atomix.log_format import (
    APPLIED,
    CALLING,
    COMPENSATED,
    RELEASED,
    RESIDUE,
    SETTLED,
    LoggedEffect,
    LoggedTx,
)
from atomix.tools import KEY_PARAM, Call, ToolSpec

NEEDS_TOOLS = "needs the program's tools (call rt.recover())"


@dataclass(frozen=True, slots=True)
class RecoveredTx:
    """One transaction recovery settled: `outcome` is "committed" (finished) or "aborted"."""

    name: str
    outcome: str
    delivered: int = 0  # effects applied or released now
    already: int = 0  # effects the store had already applied (its key check dropped them)
    compensated: int = 0
    unknown_result: int = 0  # compensated calls that died before their result was logged


@dataclass(frozen=True, slots=True)
class Attention:
    """An effect recovery could not settle, and why."""

    tx: str
    key: str
    tool: str
    why: str

    def __str__(self) -> str:
        return f"{self.tx} {self.tool} [{self.key}]: {self.why}"


@dataclass(slots=True)
class RecoveryReport:
    """What one recovery did. `clean` means the log holds no unfinished transaction of a
    dead run any more; otherwise `pending` (the program's tools are needed) and
    `needs_human` (nothing automatic can settle it) say what is left."""

    log: str
    finished: list[RecoveredTx] = field(default_factory=list)
    aborted: list[RecoveredTx] = field(default_factory=list)
    pending: list[Attention] = field(default_factory=list)
    needs_human: list[Attention] = field(default_factory=list)
    #: Deliveries that failed here and stay for the next recovery (with their attempt count).
    retrying: list[Attention] = field(default_factory=list)
    #: Deliveries that failed their last allowed attempt here: now in the dead letters.
    dead: list[Attention] = field(default_factory=list)
    #: Records quarantined by earlier recoveries (this one's are in `needs_human`).
    quarantined_before: int = 0
    #: Housekeeping: temporary files removed, applied keys pruned from the stores.
    temp_files_removed: int = 0
    keys_pruned: int = 0

    @property
    def clean(self) -> bool:
        return not self.pending and not self.needs_human and not self.retrying and not self.dead

    @property
    def delivered(self) -> int:
        return sum(t.delivered for t in self.finished)

    @property
    def already(self) -> int:
        return sum(t.already for t in self.finished)

    @property
    def compensated(self) -> int:
        return sum(t.compensated for t in self.aborted)

    def lines(self) -> list[str]:
        out = [
            f"recovered {self.log}: {len(self.finished)} committed transaction(s) finished "
            f"({self.delivered} effect(s) delivered, {self.already} already applied), "
            f"{len(self.aborted)} aborted ({self.compensated} compensation(s))"
        ]
        if self.pending:
            out.append(f"pending, {NEEDS_TOOLS}:")
            out += [f"  {a}" if a.why != NEEDS_TOOLS else f"  {a.tx} {a.tool} [{a.key}]" for a in self.pending]
        if self.needs_human:
            out.append("needs a human:")
            out += [f"  {a}" for a in self.needs_human]
        if self.retrying:
            out.append("delivery failed, retried by the next recovery:")
            out += [f"  {a}" for a in self.retrying]
        if self.dead:
            out.append("delivery failed for the last time, moved to the dead letters:")
            out += [f"  {a}" for a in self.dead]
        if self.quarantined_before:
            out.append(
                f"{self.quarantined_before} record(s) in quarantine from earlier recoveries "
                "(atomix recover --status)"
            )
        if self.temp_files_removed or self.keys_pruned:
            out.append(
                f"housekeeping: {self.temp_files_removed} temporary file(s) removed, "
                f"{self.keys_pruned} applied key(s) of finished runs pruned"
            )
        if self.clean:
            out.append("nothing left to do")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


class _Unavailable(Exception):
    """This effect cannot be settled here; `pending` says whether the program's tools could,
    `failed` that its delivery was tried and failed (an attempt that counts)."""

    def __init__(self, why: str, *, pending: bool = False, failed: bool = False) -> None:
        super().__init__(why)
        self.pending = pending
        self.failed = failed


class _Stores:
    """The stores recovery opens, one per path (closed at the end)."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, bool], Any] = {}
        self.dbs: dict[str, Any] = {}
        self.outboxes: dict[str, Any] = {}

    def file(self, root: str, casefold: bool) -> Any:
        from atomix.adapters.filesystem import FileStore

        store = self.files.get((root, casefold))
        if store is None:
            store = self.files[(root, casefold)] = FileStore(root, casefold=casefold)
        return store

    def db(self, path: str) -> Any:
        from atomix.adapters.sqlite import SQLiteStore

        store = self.dbs.get(path)
        if store is None:
            store = self.dbs[path] = SQLiteStore(path)
        return store

    def outbox(self, path: str) -> Any:
        from atomix.adapters.mailbox import MailboxSink

        sink = self.outboxes.get(path)
        if sink is None:
            sink = self.outboxes[path] = MailboxSink(path)
        return sink

    def close(self) -> None:
        for store in self.dbs.values():
            store.close()


def recover(
    log: TxLog | Path | str,
    *,
    tools: Mapping[str, ToolSpec | None] | None = None,
    exclude_runs: set[str] | None = None,
) -> RecoveryReport:
    """Finish or abort every unfinished transaction of a dead run in `log` (see the module
    docstring). `tools` is the program's registry (name -> ToolSpec) for user tools' effects;
    None (the CLI) reports them as pending. A path opens the log, and closes it after: it
    must exist (`LogError` otherwise), and no live process may hold it (`LogBusy`)."""
    own = not isinstance(log, TxLog)
    txlog = log if isinstance(log, TxLog) else TxLog(log, create=False)
    report = RecoveryReport(txlog.location)
    stores = _Stores()
    try:
        skip = set(txlog.own_runs) | (exclude_runs or set())
        earlier = len(txlog.quarantined())
        for item in txlog.quarantine_bad_records(exclude_runs=skip):
            report.needs_human.append(
                Attention(item.ident, "-", item.what, f"quarantined, not recovered: {item.reason}")
            )
        report.quarantined_before = earlier
        for tx in txlog.unfinished(exclude_runs=skip):
            if tx.committed:
                _finish(txlog, tx, tools, stores, report)
            else:
                _abort(txlog, tx, tools, report)
        if not exclude_runs:
            _housekeep(txlog, stores, report)
    finally:
        stores.close()
        if own:
            txlog.close()
    return report


def _attention(report: RecoveryReport, tx: LoggedTx, effect: LoggedEffect, exc: _Unavailable) -> None:
    item = Attention(tx.name, effect.key, effect.tool, str(exc))
    (report.pending if exc.pending else report.needs_human).append(item)


def _finish(
    log: TxLog,
    tx: LoggedTx,
    tools: Mapping[str, ToolSpec | None] | None,
    stores: _Stores,
    report: RecoveryReport,
) -> None:
    todo = [e for e in tx.effects if e.effect_class is not REVERSIBLE and e.status not in SETTLED]
    # The live commit's order: bufferable effects (one database's rows as one batch, at the
    # place of its first row), then gated releases.
    steps: list[list[LoggedEffect]] = []
    batches: dict[str, list[LoggedEffect]] = {}
    for effect in todo:
        if effect.effect_class is not BUFFERABLE:
            continue
        if effect.redo.get("kind") == "sqlite.row" and effect.problem is None:
            db = effect.redo["db"]
            if db not in batches:
                batches[db] = []
                steps.append(batches[db])
            batches[db].append(effect)
        else:
            steps.append([effect])
    steps += [[e] for e in todo if e.effect_class is IRREVERSIBLE]
    delivered = already = 0
    left = 0
    for step in steps:
        try:
            results = _redo_step(step, tools, stores)
        except _Unavailable as exc:
            if not exc.failed:
                for effect in step:
                    _attention(report, tx, effect, exc)
                left += len(step)
                continue
            for effect in step:  # one more failed attempt: retried next time, or dead
                item = Attention(tx.name, effect.key, effect.tool, str(exc))
                if log.delivery_failed(tx.run_id, tx.txid, effect.key, effect.status, str(exc)):
                    report.dead.append(item)
                else:
                    report.retrying.append(item)
                    left += 1
            continue
        for effect, fresh in zip(step, results, strict=True):
            status = APPLIED if effect.effect_class is BUFFERABLE else RELEASED
            log.set_status(tx.run_id, tx.txid, effect.key, status)
            delivered += fresh
            already += not fresh
    if left == 0:
        log.forget(tx.run_id, tx.txid)
        report.finished.append(RecoveredTx(tx.name, "committed", delivered, already))


def _redo_rows(step: list[LoggedEffect], tools: Any, stores: _Stores) -> list[bool]:
    """One database's rows of one transaction, as one batch (as they applied live)."""
    from atomix.adapters.sqlite import row_effect

    store = stores.db(step[0].redo["db"])
    had = store.applied_keys()
    effects = [
        row_effect(store, e.redo["table"], e.redo["k"], e.redo["value"], key=e.key, tool=e.tool)
        for e in step
    ]
    store.apply_batch(effects)
    return [e.key not in had for e in step]


def _redo_file(step: list[LoggedEffect], tools: Any, stores: _Stores) -> list[bool]:
    first = step[0]
    redo = first.redo
    store = stores.file(redo["root"], bool(redo.get("casefold")))
    data = redo["text"] if "text" in redo else base64.b64decode(redo["data_b64"])
    return [bool(store.write(redo["path"], data, key=first.key))]


def _redo_mail(step: list[LoggedEffect], tools: Any, stores: _Stores) -> list[bool]:
    first = step[0]
    redo = first.redo
    sink = stores.outbox(redo["outbox"])
    return [bool(sink.send(redo["to"], redo["subject"], redo["body"], key=first.key))]


def _redo_tool(
    step: list[LoggedEffect], tools: Mapping[str, ToolSpec | None] | None, stores: _Stores
) -> list[bool]:
    first = step[0]
    spec = _spec(first.redo["tool"], tools)
    kwargs = dict(first.redo["args"])
    if spec.wants_key:
        kwargs[KEY_PARAM] = first.key
    _run(spec.fn, kwargs)
    return [True]


#: How each kind of redo record is delivered again: a new kind is one function and one entry.
_REDO: dict[str, Callable[..., list[bool]]] = {
    "sqlite.row": _redo_rows,
    "fs.write": _redo_file,
    "mail.send": _redo_mail,
    "tool": _redo_tool,
}


def _redo_step(
    step: list[LoggedEffect], tools: Mapping[str, ToolSpec | None] | None, stores: _Stores
) -> list[bool]:
    """Deliver one step under the effects' own keys; per effect, whether it landed now (False:
    the store had its key already)."""
    first = step[0]
    if first.problem is not None:
        raise _Unavailable(f"cannot be redone exactly: {first.problem}")
    redo = _REDO.get(str(first.redo.get("kind")))
    if redo is None:
        raise _Unavailable("built by hand, no redo record: only its program knew how to apply it")
    try:
        return redo(step, tools, stores)
    except _Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - counted; the effect stays for the next recovery
        raise _Unavailable(f"redo failed: {type(exc).__name__}: {exc}", failed=True) from exc


def _abort(
    log: TxLog, tx: LoggedTx, tools: Mapping[str, ToolSpec | None] | None, report: RecoveryReport
) -> None:
    # Staged and gated effects never left (nothing applies before the committed mark).
    undo = [
        e for e in reversed(tx.effects)
        if e.effect_class is REVERSIBLE and e.status not in (COMPENSATED,)
    ]
    compensated = unknown = left = 0
    for effect in undo:
        try:
            _compensate(effect, tools)
        except _Unavailable as exc:
            _attention(report, tx, effect, exc)
            if not exc.pending and effect.status != RESIDUE:
                log.set_status(tx.run_id, tx.txid, effect.key, RESIDUE)
            left += 1
            continue
        log.set_status(tx.run_id, tx.txid, effect.key, COMPENSATED)
        compensated += 1
        unknown += effect.status == CALLING
    if left == 0:
        log.forget(tx.run_id, tx.txid)
        report.aborted.append(RecoveredTx(tx.name, "aborted", compensated=compensated, unknown_result=unknown))


def _compensate(effect: LoggedEffect, tools: Mapping[str, ToolSpec | None] | None) -> None:
    redo = effect.redo
    if redo.get("kind") != "tool":
        raise _Unavailable("a reversible effect built by hand: its compensation is lost with its process")
    if effect.problem is not None:
        raise _Unavailable(f"cannot be compensated exactly: {effect.problem}")
    spec = _spec(redo["tool"], tools)
    if spec.compensate is None:
        raise _Unavailable(f"tool {spec.name!r} has no compensation in this program")
    # A call logged as started but not returned may or may not have acted: its compensation
    # gets result None (compensations must tolerate an effect that never happened).
    call = Call(
        redo["tool"], dict(redo["args"]), redo.get("result"), redo.get("before"),
        key=effect.key,  # as the live call had it (its compensation_key follows from it)
    )
    try:
        _run(spec.compensate, {"call": call}, positional=True)
    except _Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - residue: reported, retried by the next recovery
        raise _Unavailable(f"compensation failed: {type(exc).__name__}: {exc}") from exc


def _spec(name: str, tools: Mapping[str, ToolSpec | None] | None) -> ToolSpec:
    if tools is None:
        raise _Unavailable(NEEDS_TOOLS, pending=True)
    if name not in tools:
        raise _Unavailable(f"no tool named {name!r} is defined in this program", pending=True)
    spec = tools[name]
    if spec is None:
        raise _Unavailable(f"two different tools are named {name!r}: which one is meant is unknown")
    return spec


def _run(fn: Callable[..., Any], kwargs: dict[str, Any], *, positional: bool = False) -> Any:
    result = fn(*kwargs.values()) if positional else fn(**kwargs)
    if inspect.isawaitable(result):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if not asyncio.iscoroutine(result):  # as asyncio.run raises it, here
                raise ValueError(f"a coroutine was expected, got {result!r}")  # noqa: B904
            return asyncio.run(result)
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise _Unavailable("an async tool cannot be redone from inside a running event loop")
    return result


def _housekeep(log: TxLog, stores: _Stores, report: RecoveryReport) -> None:
    """Remove what killed writers left (temporary files under file-store roots), and prune
    the applied keys of finished dead runs (see the module docstring). Never fatal: what
    fails here is reported and tried again by the next recovery."""
    prunable, fresh = log.dead_run_stores()
    for kind, path in fresh:
        if kind == "fs.write":
            if not Path(path).is_dir():
                continue
            try:
                report.temp_files_removed += stores.file(path, False).sweep_temp_files()
            except Exception as exc:  # noqa: BLE001 - housekeeping is never fatal
                report.needs_human.append(Attention("-", "-", path, f"temporary files not swept: {exc}"))
    for run_id, run_stores in prunable.items():
        try:
            for kind, path in run_stores:
                if kind == "fs.write" and Path(path).is_dir():
                    report.keys_pruned += stores.file(path, False).prune_keys(f"{run_id}:")
                elif kind == "sqlite.row" and Path(path).exists():
                    report.keys_pruned += stores.db(path).prune_keys(f"{run_id}:")
        except Exception as exc:  # noqa: BLE001 - housekeeping is never fatal
            report.needs_human.append(Attention(run_id, "-", "-", f"applied keys not pruned: {exc}"))
            continue
        log.pruned(run_id)

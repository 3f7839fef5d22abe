"""The random-kill crash harness: a seeded program over the public API, SIGKILLed at a random
time, recovered (perhaps killed again while recovering), and judged from the stores alone.

The program (`run_program`, in a forked child) runs two threads, each a seeded sequence of
transactions over `Runtime(log=DIR)`: whole-file writes (`file_tools`), SQLite rows
(`sqlite_tools`), unkeyed mail (`mail_tools`), a keyed send (a user irreversible tool with
`key="{msg_id}"`), and bookings on an append-only `Ledger` (a user reversible tool whose
compensation appends a cancellation: run twice, it shows twice). Some transactions roll back a
nested savepoint, some run three concurrent savepoints (executor workers, or asyncio tasks
under `gather`) of which one fails, some are aborted by the program, some run in asyncio, and
some write one resource both threads share. Before a transaction begins the program appends
`B <tx>` to an append-only journal, and after the block returns `C <tx>` (or `A <tx>` /
`X <tx> <error>` when it saw it abort): one `write` each, which SIGKILL cannot undo.

The judge (`judge`) rebuilds the program from its seed and reads only the stores (files and the
FileStore's journal, SQLite rows and `_atomix_applied`, the outbox, the ledger) and the journal:
- lost: an effect of a transaction the program saw commit is missing;
- duplicated: an effect (a compensation included) landed more often than it was made;
- half-settled: a transaction the program did not see settle left some of its effects, not all;
- leaked: an effect that must be absent (aborted transaction, rolled-back savepoint, failed
  concurrent savepoint) is there;
- order: a resource's final state or sequence contradicts commit order (two writes to one file
  in one transaction, two mails to one address, a file + row + mailbox both threads share).

`python tests/crash_child.py --seed N` runs and judges one seed (see `main`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomix import Call, Runtime
from atomix.adapters import FileStore, MailboxSink, SQLiteStore
from atomix.adapters.tools import file_tools, mail_tools, sqlite_tools

THREADS = ("a", "b")
TXS_PER_THREAD = 20
WORKERS = 3  # concurrent savepoints per transaction that has them
SHARED = "shared"  # the file, row key and mailbox local part both threads write
_FORK = multiprocessing.get_context("fork")
#: Parts of the program that `ATOMIX_CRASH_WITHOUT` (comma-separated) can leave out, to tell
#: which one a failure needs. The default leaves nothing out.
FEATURES = ("concurrent", "rollback", "abort", "async", "shared", "book", "kmail", "seq")


def without() -> frozenset[str]:
    """The features `ATOMIX_CRASH_WITHOUT` leaves out; a name not in FEATURES is an error."""
    names = frozenset(x.strip() for x in os.environ.get("ATOMIX_CRASH_WITHOUT", "").split(",") if x.strip())
    unknown = sorted(names - set(FEATURES))
    if unknown:
        raise ValueError(f"ATOMIX_CRASH_WITHOUT: unknown {unknown}; allowed: {', '.join(FEATURES)}")
    return names


# ------------------------------------------------------------------------------- the program
@dataclass(frozen=True)
class Op:
    """One tool use with its own identity: the judge finds it in the stores by `ident`."""

    kind: str  # fs | row | mail | kmail | book | seq | shared
    ident: str


@dataclass
class TxPlan:
    """One transaction of the program, rebuilt from the seed by the child and the judge."""

    name: str
    thread: str
    before: list[Op]  # outer body, before any nested block
    after: list[Op]  # outer body, after the nested blocks
    rolled_back: list[Op] = field(default_factory=list)  # a savepoint that raises
    workers: list[tuple[list[Op], list[Op]]] = field(default_factory=list)  # (first, second)
    failing_worker: int | None = None
    app_abort: bool = False
    use_async: bool = False

    def kept(self, worker_ok: dict[int, bool] | None = None) -> list[Op]:
        """The effects this transaction keeps if it commits (workers that failed excluded)."""
        ops = list(self.before) + list(self.after)
        for k, (first, second) in enumerate(self.workers):
            ok = (k != self.failing_worker) if worker_ok is None else worker_ok.get(k, False)
            if ok:
                ops += first + second
        return ops

    def part(self, op: Op) -> str:
        """Where `op` is made: "concurrent" (a concurrent savepoint), "rollback" (the
        rolled-back savepoint) or "body"."""
        if op in self.rolled_back:
            return "rollback"
        if any(op in first + second for first, second in self.workers):
            return "concurrent"
        return "body"

    def undone(self, worker_ok: dict[int, bool] | None = None) -> list[Op]:
        """The effects that must be absent even if it commits."""
        ops = list(self.rolled_back)
        for k, (first, second) in enumerate(self.workers):
            ok = (k != self.failing_worker) if worker_ok is None else worker_ok.get(k, False)
            if not ok:
                ops += first + second
        return ops


def make_program(seed: int) -> list[TxPlan]:
    rng = random.Random(f"crash-program:{seed}")
    plans: list[TxPlan] = []
    off = without()
    simple = [k for k in ("fs", "row", "mail", "kmail", "book", "seq") if k not in off]
    nested = [k for k in ("fs", "row", "mail", "book") if k not in off]
    for thread in THREADS:
        for i in range(TXS_PER_THREAD):
            name = f"{thread}{i}"
            counter = iter(range(100))

            def ops(n: int, kinds: list[str], name: str = name, counter: Any = counter) -> list[Op]:
                return [Op(k, f"{name}-{k}{next(counter)}") for k in rng.choices(kinds, k=n)]

            plan = TxPlan(name, thread, ops(rng.randint(1, 3), simple), ops(rng.randint(0, 2), simple))
            # Every draw is made whatever is left out, so that the rest of the program stays
            # the same when a feature is.
            if rng.random() < 0.3 and "shared" not in off:
                plan.before.append(Op("shared", f"{name}-shared"))
            rolled_back = ops(rng.randint(1, 2), nested)
            if rng.random() < 0.3 and "rollback" not in off:
                plan.rolled_back = rolled_back
            workers = [(ops(1, nested), ops(1, nested)) for _ in range(WORKERS)]
            failing = rng.randrange(WORKERS)
            if rng.random() < 0.3 and "concurrent" not in off:
                plan.workers, plan.failing_worker = workers, failing
            plan.app_abort = rng.random() < 0.12 and "abort" not in off
            plan.use_async = rng.random() < 0.25 and "async" not in off
            plans.append(plan)
    return plans


class Ledger:
    """An append-only ledger file: one JSON line per booking or cancellation.

    Guarantees: an append with a key lands at most once per (op, key) (the keys are rebuilt from
    the file at open); an append without a key always lands, so a compensation run twice without
    a key shows twice. One instance per file per process.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._keys: set[tuple[str, str]] = set()
        self._booked: set[str] = set()
        self.entries: list[dict[str, Any]] = []
        if path.exists():
            data = path.read_bytes()
            cut = data.rfind(b"\n") + 1
            if cut < len(data):  # a line torn by the kill was never acknowledged
                with open(path, "r+b") as fh:
                    fh.truncate(cut)
            for line in data[:cut].decode().splitlines():
                self._note(json.loads(line))

    def _note(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        if entry["key"] is not None:
            self._keys.add((entry["op"], entry["key"]))
        if entry["op"] == "book":
            self._booked.add(entry["id"])

    def booked(self, ident: str) -> bool:
        with self._lock:
            return ident in self._booked

    def append(self, op: str, ident: str, amount: int, key: str | None) -> bool:
        with self._lock:
            if key is not None and (op, key) in self._keys:
                return False
            entry = {"op": op, "id": ident, "amount": amount, "key": key}
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, sort_keys=True) + "\n")
            self._note(entry)
            return True


@dataclass
class Tools:
    """The program's tools over its stores (defined the same way by the child and recovery)."""

    fs: Any
    rows: Any
    mail: Any
    send_keyed: Any
    book: Any


def define_tools(rt: Runtime, base: Path) -> Tools:
    files = FileStore(base / "files", durable=False)  # SIGKILL does not need fsync
    db = SQLiteStore(base / "db.sqlite", durable=False)
    sink = MailboxSink(base / "outbox.jsonl")
    ledger = Ledger(base / "ledger.jsonl")

    def send_keyed(msg_id: str, to: str, body: str, idempotency_key: str) -> bool:
        return sink.send(to, "keyed", body, key=idempotency_key)

    def book(ident: str, amount: int, idempotency_key: str) -> str:
        ledger.append("book", ident, amount, idempotency_key)
        return ident

    def cancel(call: Call) -> None:
        ident = call.args["ident"]
        if not ledger.booked(ident):  # the call may have died before it booked anything
            return
        # Not idempotent by itself: a second run appends a second cancellation, unless the
        # runtime hands the compensation a key (`call.key`) the ledger can deduplicate on.
        ledger.append("cancel", ident, call.args["amount"], getattr(call, "key", None))

    return Tools(
        fs=file_tools(rt, files),
        rows=sqlite_tools(rt, db),
        mail=mail_tools(rt, sink),
        send_keyed=rt.tool(
            send_keyed,
            effect="irreversible",
            writes=lambda msg_id, to, body: sink.scope(to),
            key="{msg_id}",
            name="mail.send_keyed",
        ),
        book=rt.tool(
            book,
            effect="reversible",
            writes="kv:ledger:{ident}",
            compensate=cancel,
            name="ledger.book",
        ),
    )


def address(ident: str) -> str:
    return f"{ident.replace('-', '.')}@example.org"


def do(tools: Tools, op: Op) -> None:
    ident = op.ident
    if op.kind == "fs":
        tools.fs.write_text(f"f/{ident}.txt", ident)
    elif op.kind == "row":
        tools.rows.put("t", ident, {"id": ident})
    elif op.kind == "mail":
        tools.mail.send(address(ident), "note", ident)
    elif op.kind == "kmail":
        tools.send_keyed(f"k-{ident}", address(ident), ident)
    elif op.kind == "book":
        tools.book(ident, 7)
    elif op.kind == "seq":  # order inside one transaction: the last write and mail win
        tools.fs.write_text(f"f/{ident}.txt", "draft")
        tools.fs.write_text(f"f/{ident}.txt", ident)
        tools.mail.send(address(ident), "first", f"{ident}#1")
        tools.mail.send(address(ident), "second", f"{ident}#2")
    elif op.kind == "shared":  # order across the threads: one resource set, commit order
        tools.fs.write_text(f"{SHARED}.txt", ident)
        tools.rows.put("t", SHARED, {"id": ident})
        tools.mail.send(f"{SHARED}@example.org", "shared", ident)
    else:
        raise ValueError(f"unknown op kind {op.kind!r}")


class _Planned(Exception):
    """Raised by the program on purpose (a savepoint to roll back, a worker, an abort)."""


class Journal:
    """The program's own record of what it saw: one `write` per line on an O_APPEND file."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(self, *words: str) -> None:
        os.write(self._fd, (" ".join(words) + "\n").encode())


def _sync_body(rt: Runtime, tools: Tools, plan: TxPlan, journal: Journal) -> None:
    for op in plan.before:
        do(tools, op)
    if plan.rolled_back:
        try:
            with rt.transaction():
                for op in plan.rolled_back:
                    do(tools, op)
                raise _Planned("roll the savepoint back")
        except _Planned:
            pass
    if plan.workers:
        barrier = threading.Barrier(len(plan.workers), timeout=20)

        def worker(k: int) -> None:
            first, second = plan.workers[k]
            with rt.transaction():  # a savepoint of the submitting transaction
                try:
                    for op in first:
                        do(tools, op)
                except BaseException:
                    barrier.abort()  # do not leave the siblings waiting
                    raise
                barrier.wait()  # every sibling has staged its first effect
                if k == plan.failing_worker:
                    raise _Planned("worker fails")
                for op in second:
                    do(tools, op)

        with rt.executor(len(plan.workers)) as pool:
            futures = [pool.submit(worker, k) for k in range(len(plan.workers))]
            outcomes = [f.exception() for f in futures]
        for k, exc in enumerate(outcomes):
            journal.note("S", plan.name, str(k), "ok" if exc is None else f"fail {exc!r}"[:300])
            if exc is not None and not isinstance(exc, _Planned):
                raise exc
    for op in plan.after:
        do(tools, op)
    if plan.app_abort:
        raise _Planned("the program aborts")


async def _async_body(rt: Runtime, tools: Tools, plan: TxPlan, journal: Journal) -> None:
    for op in plan.before:
        do(tools, op)
    if plan.rolled_back:
        try:
            async with rt.atransaction():
                for op in plan.rolled_back:
                    do(tools, op)
                raise _Planned("roll the savepoint back")
        except _Planned:
            pass
    if plan.workers:
        staged = 0
        all_staged = asyncio.Event()

        async def worker(k: int) -> None:
            nonlocal staged
            first, second = plan.workers[k]
            async with rt.atransaction():  # a savepoint of the enclosing transaction
                for op in first:
                    do(tools, op)
                staged += 1
                if staged == len(plan.workers):
                    all_staged.set()
                await asyncio.wait_for(all_staged.wait(), 20)
                if k == plan.failing_worker:
                    raise _Planned("worker fails")
                for op in second:
                    do(tools, op)

        results = await asyncio.gather(
            *(worker(k) for k in range(len(plan.workers))), return_exceptions=True
        )
        for k, result in enumerate(results):
            failed = isinstance(result, BaseException)
            journal.note("S", plan.name, str(k), f"fail {result!r}"[:300] if failed else "ok")
            if isinstance(result, BaseException) and not isinstance(result, _Planned):
                raise result
    for op in plan.after:
        do(tools, op)
    if plan.app_abort:
        raise _Planned("the program aborts")


def _run_tx(rt: Runtime, tools: Tools, plan: TxPlan, journal: Journal) -> None:
    journal.note("B", plan.name)
    try:
        if plan.use_async:

            async def main() -> None:
                async with rt.atransaction():
                    await _async_body(rt, tools, plan, journal)

            asyncio.run(main())
        else:
            with rt.transaction():
                _sync_body(rt, tools, plan, journal)
    except _Planned:
        journal.note("A", plan.name)
    except Exception as exc:  # noqa: BLE001 - the program saw it abort: the judge checks that
        journal.note("X", plan.name, type(exc).__name__, repr(str(exc))[:200])
    else:
        journal.note("C", plan.name)


def run_program(base: Path, seed: int) -> None:
    """The program under test, in a forked child: both threads' transactions, then exit 0."""
    plans = make_program(seed)
    rt = Runtime(log=base / "log")
    tools = define_tools(rt, base)
    journal = Journal(base / "journal")
    errors: list[BaseException] = []

    def thread_main(thread: str) -> None:
        try:
            for plan in plans:
                if plan.thread == thread:
                    _run_tx(rt, tools, plan, journal)
        except BaseException as exc:  # noqa: BLE001 - reported by the exit code
            errors.append(exc)

    threads = [threading.Thread(target=thread_main, args=(t,)) for t in THREADS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        (base / "child-error").write_text(repr(errors))
        os._exit(3)
    journal.note("DONE")
    rt.close()


def run_recovery(base: Path) -> None:
    """Recovery, in a forked child: what a restarted program does. Exit 0 when clean."""
    try:
        rt = Runtime(log=base / "log")  # recovers what it can without the program's tools
        first = rt.recovery
        define_tools(rt, base)
        report = rt.recover()
        recovered = sum(len(r.finished) + len(r.aborted) for r in (first, report) if r is not None)
        with open(base / "recovered", "a", encoding="utf-8") as fh:
            fh.write(f"{recovered}\n")
        (base / "recovery-report").write_text(f"{first}\n--\n{report}")
        rt.close()
        code = 0 if report.clean else 1
    except BaseException as exc:  # noqa: BLE001 - reported by the exit code
        (base / "child-error").write_text(repr(exc))
        code = 3
    os._exit(code)


def _child(target: Callable[[Path, int], None], base: str, seed: int) -> None:
    try:
        target(Path(base), seed)
    except BaseException as exc:  # noqa: BLE001
        Path(base, "child-error").write_text(repr(exc))
        os._exit(3)
    os._exit(0)


# ------------------------------------------------------------------------------- the parent
@dataclass
class Timing:
    """Running estimates of how long an unkilled program and a recovery take (seconds)."""

    program: float = 1.0
    recovery: float = 0.3


@dataclass
class RunResult:
    seed: int
    killed: bool  # the program was SIGKILLed (not finished before the kill time)
    recovery_kills: int
    recovery_exit: int
    recovered: int  # transactions recovery finished or aborted
    verdict: Verdict
    error: str = ""
    progress: float = 1.0  # the share of the program's transactions it saw settle before the kill


def spawn_and_kill(target: Callable[..., None], args: tuple[Any, ...], delay: float | None) -> tuple[int, float]:
    """Fork `target(*args)`; SIGKILL it after `delay` seconds (None: never). Returns its exit
    code (-9 when killed) and how long it ran."""
    proc = _FORK.Process(target=target, args=args)
    started = time.perf_counter()
    proc.start()
    proc.join(delay)
    if proc.exitcode is None and delay is not None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(120)
    if proc.exitcode is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        raise AssertionError(f"child {target.__name__}{args} hung")
    return proc.exitcode, time.perf_counter() - started


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def run_one(base: Path, seed: int, timing: Timing, *, kill_at: float | None = None) -> RunResult:
    """One run: the program killed at a random time (a fraction of its expected duration,
    drawn from the seed, or `kill_at`), recovery (killed too in some runs), a final recovery,
    then the judge."""
    rng = random.Random(f"crash-kill:{seed}")
    fraction = rng.random() if kill_at is None else kill_at
    base.mkdir(parents=True, exist_ok=True)
    code, took = spawn_and_kill(_child, (run_program, str(base), seed), fraction * timing.program)
    killed = code == -signal.SIGKILL
    status, _, _ = _journal(base)
    progress = sum(1 for s in status.values() if s != "B") / (len(THREADS) * TXS_PER_THREAD)
    if not killed and code != 0:
        return RunResult(seed, False, 0, -1, Verdict(), f"program exit {code}: {_read(base / 'child-error')}")
    recovery_kills = 0
    while rng.random() < 0.3 and recovery_kills < 2:  # kill the recovery itself, at random
        rcode, _ = spawn_and_kill(_child, (_recovery_entry, str(base), seed), rng.random() * timing.recovery)
        if rcode == -signal.SIGKILL:
            recovery_kills += 1
        else:
            break
    started = time.perf_counter()
    rcode, _ = spawn_and_kill(_child, (_recovery_entry, str(base), seed), None)
    timing.recovery = 0.8 * timing.recovery + 0.2 * (time.perf_counter() - started)
    recovered = sum(int(x) for x in _read(base / "recovered").split())
    error = ""
    if rcode != 0:
        error = f"recovery exit {rcode}: {_read(base / 'child-error')}{_read(base / 'recovery-report')}"
    verdict = judge(base, seed)
    return RunResult(seed, killed, recovery_kills, rcode, recovered, verdict, error, progress)


def _recovery_entry(base: Path, seed: int) -> None:
    run_recovery(base)


# ------------------------------------------------------------------------------- the judge
@dataclass
class Verdict:
    """What the stores show for one run, per category (see the module docstring)."""

    transactions: int = 0
    seen_committed: int = 0
    seen_aborted: int = 0
    in_flight: int = 0  # begun, not seen to settle: recovery decided
    lost: int = 0  # effects
    duplicated: int = 0  # effects (compensations included)
    half_settled: int = 0  # transactions
    leaked: int = 0  # effects
    order: int = 0  # violations
    problems: list[str] = field(default_factory=list)
    by_tool: dict[str, int] = field(default_factory=dict)  # "category/tool" -> count

    def add(self, category: str, what: str, text: str, part: str = "body") -> None:
        """Count one finding under `category`, and under the tool `what` names and the part of
        its transaction it came from (`@concurrent`: a concurrent savepoint, `@rollback`: a
        rolled-back savepoint; the body is not named)."""
        setattr(self, category, getattr(self, category) + 1)
        tool = what.split()[0] if what else "-"
        name = f"{category}/{tool}" + ("" if part == "body" else f"@{part}")
        self.by_tool[name] = self.by_tool.get(name, 0) + 1
        self.problems.append(text if part == "body" else f"{text} (in a {part} savepoint)")

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.half_settled or self.leaked or self.order)


@dataclass
class Stores:
    """The ground truth, read from disk."""

    files: dict[str, str]
    file_writes: dict[str, int]  # FileStore journal lines per path
    rows: dict[str, Any]
    row_applies: dict[str, int]
    mails: list[dict[str, Any]]
    ledger: list[dict[str, Any]]

    @classmethod
    def read(cls, base: Path) -> Stores:
        root = base / "files"
        files: dict[str, str] = {}
        if root.exists():
            for path in root.rglob("*"):
                rel = path.relative_to(root).as_posix()
                if path.is_file() and not rel.startswith(".atomix") and not path.name.endswith(".atomix-tmp"):
                    files[rel] = path.read_text()
        file_writes: dict[str, int] = {}
        journal = root / ".atomix" / "applied"
        if journal.exists():
            for line in journal.read_text().splitlines():
                path_name = json.loads(line)["path"]
                file_writes[path_name] = file_writes.get(path_name, 0) + 1
        rows: dict[str, Any] = {}
        row_applies: dict[str, int] = {}
        if (base / "db.sqlite").exists():
            conn = sqlite3.connect(base / "db.sqlite")
            try:
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 't'").fetchone():
                    rows = {k: json.loads(v) for k, v in conn.execute("SELECT k, v FROM t")}
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name = '_atomix_applied'").fetchone():
                    for (k,) in conn.execute("SELECT k FROM _atomix_applied WHERE tbl = 't'"):
                        row_applies[k] = row_applies.get(k, 0) + 1
            finally:
                conn.close()
        mails = []
        if (base / "outbox.jsonl").exists():
            mails = [json.loads(x) for x in (base / "outbox.jsonl").read_text().splitlines() if x]
        ledger = []
        if (base / "ledger.jsonl").exists():
            ledger = [json.loads(x) for x in (base / "ledger.jsonl").read_text().splitlines() if x]
        return cls(files, file_writes, rows, row_applies, mails, ledger)


def _count(items: list[dict[str, Any]], key: str, value: str, **match: str) -> int:
    return sum(1 for x in items if x[key] == value and all(x[k] == v for k, v in match.items()))


def _effects(stores: Stores, op: Op) -> list[tuple[str, bool, int, int]]:
    """Per store item an op makes: (what, present, times applied, times it may apply)."""
    ident = op.ident
    mail_times = _count(stores.mails, "body", ident)
    if op.kind == "fs":
        path = f"f/{ident}.txt"
        return [(f"file {path}", stores.files.get(path) == ident, stores.file_writes.get(path, 0), 1)]
    if op.kind == "row":
        here = stores.rows.get(ident) == {"id": ident}
        return [(f"row t:{ident}", here, stores.row_applies.get(ident, 0), 1)]
    if op.kind in ("mail", "kmail"):
        return [(f"{op.kind} {ident}", mail_times > 0, mail_times, 1)]
    if op.kind == "book":
        booked = _count(stores.ledger, "id", ident, op="book")
        cancelled = _count(stores.ledger, "id", ident, op="cancel")
        # A booking counts as there when booked and not cancelled; a cancellation with no
        # booking, or two of either, is a duplicated effect.
        return [
            (f"booking {ident}", booked == 1 and cancelled == 0, booked, 1),
            (f"cancellation of {ident}", False, cancelled, booked),
        ]
    if op.kind == "seq":
        path = f"f/{ident}.txt"
        first = _count(stores.mails, "body", f"{ident}#1")
        second = _count(stores.mails, "body", f"{ident}#2")
        return [
            (f"file {path} (2 writes)", stores.files.get(path) == ident, stores.file_writes.get(path, 0), 2),
            (f"mail {ident}#1", first > 0, first, 1),
            (f"mail {ident}#2", second > 0, second, 1),
        ]
    if op.kind == "shared":
        return [(f"shared mail {ident}", mail_times > 0, mail_times, 1)]
    raise ValueError(op.kind)


def _journal(base: Path) -> tuple[dict[str, str], dict[str, dict[int, bool]], bool]:
    status: dict[str, str] = {}
    workers: dict[str, dict[int, bool]] = {}
    done = False
    for line in _read(base / "journal").splitlines():
        words = line.split(" ", 3)
        if words[0] == "DONE":
            done = True
        elif words[0] == "S":
            workers.setdefault(words[1], {})[int(words[2])] = words[3] == "ok"
        elif words[0] in ("B", "C", "A"):
            status[words[1]] = words[0]
        elif words[0] == "X":
            status[words[1]] = "X " + " ".join(words[2:])
    return status, workers, done


def judge(base: Path, seed: int) -> Verdict:
    """Judge one run from the stores and the program's journal (see the module docstring)."""
    v = Verdict()
    stores = Stores.read(base)
    status, workers, _ = _journal(base)
    plans = make_program(seed)
    committed_shared: dict[str, list[str]] = {t: [] for t in THREADS}
    for plan in plans:
        v.transactions += 1
        seen = status.get(plan.name, "")
        ok = workers.get(plan.name)
        kept = plan.kept(ok)
        undone = plan.undone(ok)
        if seen.startswith("X") and "CommitIncomplete" in seen:
            seen = "B"  # the commit began: recovery decides, like a transaction in flight
        must_commit = seen == "C"
        must_abort = plan.app_abort or seen == "A" or seen.startswith("X") or seen == ""
        v.seen_committed += must_commit
        v.seen_aborted += seen == "A" or seen.startswith("X")
        v.in_flight += seen == "B"
        if must_commit and plan.app_abort:
            v.add("leaked", "transaction", f"{plan.name}: the program saw a planned abort commit")
        present = 0
        missing: list[str] = []  # the part of the transaction each missing effect came from
        for op in kept:
            part = plan.part(op)
            for what, here, times, allowed in _effects(stores, op):
                if times > allowed:
                    v.add("duplicated", what, f"{plan.name}: {what} applied {times} times (at most {allowed})", part)
                if what.startswith("cancellation"):
                    # A committed transaction's booking that was compensated is lost, counted
                    # once, under the booking.
                    continue
                if here:
                    present += 1
                else:
                    missing.append(part)
                if must_commit and not here:
                    v.add("lost", what, f"{plan.name}: committed (seen by the program), {what} missing", part)
                if must_abort and here:
                    state = "aborted" if seen else "never begun"
                    v.add("leaked", what, f"{plan.name}: {state}, {what} present", part)
        if not must_commit and not must_abort and present and missing:
            v.add("half_settled", "transaction",
                  f"{plan.name}: half-settled after recovery, {present} of {present + len(missing)} "
                  "effects there", "concurrent" if set(missing) == {"concurrent"} else "body")
        for op in undone:
            part = plan.part(op)
            for what, here, times, allowed in _effects(stores, op):
                if times > allowed:
                    v.add("duplicated", what, f"{plan.name}: {what} applied {times} times (at most {allowed})", part)
                if here:
                    v.add("leaked", what, f"{plan.name}: {what} present, but it was rolled back", part)
        shared = [op for op in kept if op.kind == "shared"]
        if shared and (must_commit or (not must_abort and present)):
            committed_shared[plan.thread].append(shared[0].ident)
    _judge_order(stores, plans, committed_shared, v)
    return v


def _judge_order(stores: Stores, plans: list[TxPlan], committed: dict[str, list[str]], v: Verdict) -> None:
    for plan in plans:
        for op in plan.before + plan.after:
            if op.kind != "seq" or f"f/{op.ident}.txt" not in stores.files:
                continue
            bodies = [m["body"] for m in stores.mails]
            if stores.files[f"f/{op.ident}.txt"] != op.ident:
                v.add("order", "file", f"{plan.name}: f/{op.ident}.txt holds the earlier write")
            first, second = f"{op.ident}#1", f"{op.ident}#2"
            if first in bodies and second in bodies and bodies.index(first) > bodies.index(second):
                v.add("order", "mail", f"{plan.name}: mail {second} left before {first}")
    # The resource both threads write: its mails go out in commit order, which is each
    # thread's own order, and the file and row hold what the last of those mails carries.
    shared = [m["body"] for m in stores.mails if m["to"] == f"{SHARED}@example.org"]
    for thread, idents in committed.items():
        positions = [shared.index(i) for i in idents if i in shared]
        if positions != sorted(positions):
            v.add("order", "shared", f"thread {thread}: shared mails out of the thread's order: {shared}")
    last = shared[-1] if shared else None
    file_value = stores.files.get(f"{SHARED}.txt")
    row = stores.rows.get(SHARED)
    row_value = None if row is None else row.get("id")
    if file_value != last or row_value != last:
        v.add("order", "shared", f"shared resource: file {file_value!r}, row {row_value!r}, "
              f"last mail {last!r}: not one commit order")


# ------------------------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> int:
    """`python tests/crash_child.py --seed N [--repeat K] [--kill-at F] [--dir D]`: run one
    seed (K times: the kill time is a fraction of a measured duration, so a window that small
    may need a few tries) and print each verdict. Exit 1 if any run failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=1, help="run the seed this many times")
    parser.add_argument("--kill-at", type=float, default=None, help="fraction of the program's duration")
    parser.add_argument("--dir", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    try:
        without()  # a bad ATOMIX_CRASH_WITHOUT fails here, before any run
    except ValueError as exc:
        parser.error(str(exc))
    base = args.dir or Path(tempfile.mkdtemp(prefix="atomix-crash-"))
    timing = calibrate(base / "calibration")
    failed = 0
    for n in range(args.repeat):
        result = run_one(base / f"run-{args.seed}-{n}", args.seed, timing, kill_at=args.kill_at)
        bad = not result.verdict.clean or bool(result.error)
        failed += bad
        print(f"seed {result.seed} try {n}: killed={result.killed} recovery kills="
              f"{result.recovery_kills} recovered={result.recovered} {summary_of(result.verdict)}")
        for problem in result.verdict.problems:
            print("  " + problem)
        if result.error:
            print("  " + result.error)
    print(f"{failed} of {args.repeat} runs failed; runs kept in {base}")
    return 1 if failed else 0


def summary_of(v: Verdict) -> str:
    return (f"lost={v.lost} duplicated={v.duplicated} half-settled={v.half_settled} "
            f"leaked={v.leaked} order={v.order}")


def control_run(base: Path, seed: int, timing: Timing | None = None) -> tuple[Verdict, Timing]:
    """Run `seed`'s program to its end, unkilled, and judge it: a control (nothing to recover,
    so any finding is the runtime's, live). Its duration updates `timing` (the machine's load
    changes how long a program takes, and kill times are fractions of it)."""
    base.mkdir(parents=True, exist_ok=True)
    code, took = spawn_and_kill(_child, (run_program, str(base), seed), None)
    if code != 0:
        raise AssertionError(f"control run of seed {seed}: exit {code}: {_read(base / 'child-error')}")
    if timing is None:
        timing = Timing(program=took)
    else:
        timing.program = 0.5 * timing.program + 0.5 * took
    return judge(base, seed), timing


def calibrate(base: Path) -> Timing:
    """Run the program once unkilled (seed -1) to learn how long a run takes."""
    return control_run(base, -1)[1]


if __name__ == "__main__":
    sys.exit(main())

"""The random-kill crash harness's program: what the forked child runs, and what recovery runs.

The program (`run_program`) runs two threads, each a seeded sequence of transactions over
`Runtime(log=DIR)`: whole-file writes (`file_tools`), SQLite rows (`sqlite_tools`), unkeyed
mail (`mail_tools`), a keyed send (a user irreversible tool with `key="{msg_id}"`), and bookings
on an append-only `Ledger` (a user reversible tool whose compensation appends a cancellation:
run twice, it shows twice). Some transactions roll back a nested savepoint, some run three
concurrent savepoints (executor workers, or asyncio tasks under `gather`) of which one fails,
some are aborted by the program, some run in asyncio, and some write one resource both threads
share. Before a transaction begins the program appends `B <tx>` to an append-only journal, and
after the block returns `C <tx>` (or `A <tx>` / `X <tx> <error>` when it saw it abort): one
`write` each, which SIGKILL cannot undo.

`make_program(seed)` rebuilds the same plan for the child and for the judge
(tests/crash_judge.py); `run_recovery` is what a restarted program does. The parent that forks
and kills them is tests/crash_child.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
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

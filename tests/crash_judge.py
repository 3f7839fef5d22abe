"""The random-kill crash harness's judge: it reads one run's stores and journal and counts
what contradicts the program.

The judge (`judge`) rebuilds the program from its seed (tests/crash_program.py) and reads only
the stores (files and the FileStore's journal, SQLite rows and `_atomix_applied`, the outbox,
the ledger) and the program's journal:
- lost: an effect of a transaction the program saw commit is missing;
- duplicated: an effect (a compensation included) landed more often than it was made;
- half-settled: a transaction the program did not see settle left some of its effects, not all;
- leaked: an effect that must be absent (aborted transaction, rolled-back savepoint, failed
  concurrent savepoint) is there;
- order: a resource's final state or sequence contradicts commit order (two writes to one file
  in one transaction, two mails to one address, a file + row + mailbox both threads share).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crash_program import SHARED, THREADS, Op, TxPlan, make_program


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


def read_journal(base: Path) -> tuple[dict[str, str], dict[str, dict[int, bool]], bool]:
    """The program's journal: each transaction's last record, each concurrent savepoint's
    outcome, and whether the program finished."""
    status: dict[str, str] = {}
    workers: dict[str, dict[int, bool]] = {}
    done = False
    for line in read_or_empty(base / "journal").splitlines():
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
    status, workers, _ = read_journal(base)
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



def summary_of(v: Verdict) -> str:
    """One line: each category's count."""
    return (f"lost={v.lost} duplicated={v.duplicated} half-settled={v.half_settled} "
            f"leaked={v.leaked} order={v.order}")



def read_or_empty(path: Path) -> str:
    """The file's text, or "" when the run never wrote it."""
    return path.read_text() if path.exists() else ""

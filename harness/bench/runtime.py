"""Benchmarks of the runtime's own overhead (printed by `python -m harness.bench`).

Measures, on this machine and with the garbage collector left on:

(a) the added cost of a shimmed call of a BUFFERABLE tool inside an open transaction over a
    direct call of the same plain function;
(b) the commit of a transaction holding 4 bufferable effects;
(c) speculation with K branches (paper Table 17): setup (begin K branches, stage one effect in
    each through the shim) and resolve + commit of the winner (the K - 1 losers abort).
(d) the durable log's cost per commit (`Runtime(log=DIR)`), with and without fsync, next to
    no log, for in-memory effects and for real FileStore writes;
(e) the hot paths against their targets: a reversible call, the fixed cost of a
    commit, K = 16 speculation, each next to a bare call measured in the same run.

Every effect applies to an in-memory dict, so the figures are the runtime's own overhead, not
I/O. Each sample is one `time.perf_counter_ns` interval; results are checked after each phase so
that a broken runtime cannot report a good number.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from atomix.runtime import Runtime
from harness.bench.figures import Figure, Stats

_ns = time.perf_counter_ns

SHIM_TARGET_US = 10.0
PAPER_TABLE_17 = {
    2: (13, 85, 98, 295),
    4: (23, 142, 165, 273),
    8: (44, 321, 365, 1339),
    16: (86, 939, 1025, 23198),
}


def _bufferable_put(rt: Runtime, store: dict[Any, Any]) -> Callable[..., Any]:
    def put(k: int, v: int) -> None:
        store[k] = v

    return rt.tool(put, effect="bufferable", writes="mem:{k}", name="mem.put")


# ----------------------------------------------------------------------------------------- (a)
def bench_shim(rounds: int, per_tx: int, *, fresh: bool = False) -> tuple[Stats, Stats]:
    """Per-call cost of a direct call and of a shimmed bufferable call in an open transaction.

    Calls are grouped `per_tx` to a transaction; the commits between groups are not timed. The
    keys are k = 0..per_tx-1 in every round (an agent revisiting its resources), or with `fresh`
    a new key, hence a new scope text, for every call.
    """
    rt = Runtime()
    store: dict[Any, Any] = {}

    def plain(k: int, v: int) -> None:
        store[k] = v

    put = _bufferable_put(rt, store)
    direct: list[int] = []
    shimmed: list[int] = []
    for r in range(rounds):
        keys = range(r * per_tx, (r + 1) * per_tx) if fresh else range(per_tx)
        for k in keys:
            t0 = _ns()
            plain(k, r)
            direct.append(_ns() - t0)
        store.clear()
        with rt.transaction():
            for k in keys:
                t0 = _ns()
                put(k, r)
                shimmed.append(_ns() - t0)
            assert not store, "a bufferable effect was applied before commit"
        assert store == dict.fromkeys(keys, r), "commit did not apply every effect"
    return Stats.of(direct), Stats.of(shimmed)


# ----------------------------------------------------------------------------------------- (b)
def bench_commit(rounds: int, effects: int = 4) -> tuple[Stats, Stats]:
    """Commit of a transaction with `effects` bufferable effects; and its whole life
    (begin, the shimmed calls, commit)."""
    rt = Runtime()
    store: dict[Any, Any] = {}
    put = _bufferable_put(rt, store)
    commit: list[int] = []
    whole: list[int] = []
    for r in range(rounds):
        t_begin = _ns()
        with rt.transaction():
            for j in range(effects):
                put(j, r)
            t0 = _ns()
        t1 = _ns()
        commit.append(t1 - t0)
        whole.append(t1 - t_begin)
        if store.get(effects - 1) != r:
            raise AssertionError("commit did not apply the transaction's effects")
    return Stats.of(commit), Stats.of(whole)


# ----------------------------------------------------------------------------------------- (c)
def bench_speculation(k: int, rounds: int) -> tuple[Stats, Stats, Stats]:
    """K branches of one group, each staging one bufferable effect on the same scope; the last
    branch wins. Returns (setup, resolve + commit, total)."""
    rt = Runtime()
    store: dict[Any, Any] = {}
    put = _bufferable_put(rt, store)
    setup: list[int] = []
    settle: list[int] = []
    total: list[int] = []
    for r in range(rounds):
        group = f"g{r}"
        t0 = _ns()
        branches = []
        for i in range(k):
            branch = rt.branch(group, i)
            with branch:
                put(0, i)
            branches.append(branch)
        t1 = _ns()
        winner, losers = rt.resolve(group, branches[-1])
        t2 = _ns()
        setup.append(t1 - t0)
        settle.append(t2 - t1)
        total.append(t2 - t0)
        if not winner.committed or store.get(0) != k - 1 or len(losers) != k - 1:
            raise AssertionError("speculation did not commit exactly the winner")
    return Stats.of(setup), Stats.of(settle), Stats.of(total)


def speculation_table(
    runs: int = 200, repeats: int = 5, ks: Sequence[int] = (2, 4, 8, 16)
) -> dict[int, list[dict[str, float]]]:
    """Paper Table 17 as data: per K, `repeats` measurements of `runs` rounds each of (c),
    after a warm-up, as {"setup", "commit", "total": medians, "p99": the total's p99} in µs."""
    warm_until = time.perf_counter() + 0.5
    while time.perf_counter() < warm_until:
        bench_reference(100)
    out: dict[int, list[dict[str, float]]] = {}
    for k in ks:
        out[k] = []
        for _ in range(repeats):
            setup, settle, total = bench_speculation(k, runs)
            out[k].append({"setup": setup.median, "commit": settle.median,
                           "total": total.median, "p99": total.p99})
    return out


def bench_speculation_parts(k: int, rounds: int) -> tuple[float, float]:
    """Where setup time goes: the median setup with empty branch bodies (begin, enter,
    seal) and with the one shimmed call each, per branch, in µs."""
    medians = []
    for staged in (False, True):
        rt = Runtime()
        store: dict[Any, Any] = {}
        put = _bufferable_put(rt, store)
        samples: list[int] = []
        for r in range(rounds):
            group = f"g{r}"
            branches = []
            t0 = _ns()
            for i in range(k):
                branch = rt.branch(group, i)
                with branch:
                    if staged:
                        put(0, i)
                branches.append(branch)
            samples.append(_ns() - t0)
            rt.resolve(group, branches[-1])
        medians.append(Stats.of(samples).median / k)
    return medians[0], medians[1] - medians[0]


# ------------------------------------------------------------------------------- reference
class _Plain:
    """A stand-in branch: a slotted record that is its own context manager."""

    __slots__ = ("group", "index")

    def __init__(self, group: str, index: int) -> None:
        self.group = group
        self.index = index

    def __enter__(self) -> _Plain:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def bench_reference(rounds: int, k: int = 16) -> Stats:
    """The K-branch loop of (c) with plain stand-ins and no runtime: a record per branch, a
    with-block, one dict write. Its time follows this machine's speed at the moment, so a
    slow spell of a shared machine shows here too, and two runs compare by it."""
    store: dict[Any, Any] = {}
    samples: list[int] = []
    for r in range(rounds):
        group = f"g{r}"
        t0 = _ns()
        branches = []
        for i in range(k):
            branch = _Plain(group, i)
            with branch:
                store[0] = i
            branches.append(branch)
        samples.append(_ns() - t0)
    if store.get(0) != k - 1:
        raise AssertionError("the reference loop did not run")
    return Stats.of(samples)


# ------------------------------------------------------------------------------- (d) the log
LOG_MODES = ("no log", "log, no fsync", "log, fsync (WAL)", "log, fsync (rollback journal)")


def bench_log_commit(mode: str, rounds: int, *, files: bool = False, effects: int = 4) -> Stats:
    """The commit (seal to settled) of a transaction with `effects` bufferable effects, to an
    in-memory dict, or with `files` to a real (durable) FileStore, under one of LOG_MODES.
    The log's cost: the intent, the committed mark (fsynced when durable), one settlement
    mark per step and the done mark."""
    import tempfile

    from atomix.adapters.filesystem import FileStore
    from atomix.adapters.tools import file_tools
    from atomix.log import TxLog

    with tempfile.TemporaryDirectory(prefix="atomix-bench-") as tmp:
        log = None
        if mode != "no log":
            journal = "delete" if "rollback" in mode else "wal"
            log = TxLog(os.path.join(tmp, "log"), durable="no fsync" not in mode, journal=journal)
        rt = Runtime(log=log)
        store: dict[Any, Any] = {}
        if files:
            fs = file_tools(rt, FileStore(os.path.join(tmp, "root")))
            put: Callable[..., Any] = lambda k, v: fs.write_text(f"f{k}.txt", str(v))  # noqa: E731
        else:
            put = _bufferable_put(rt, store)
        samples: list[int] = []
        for r in range(rounds):
            with rt.transaction():
                for j in range(effects):
                    put(j, r)
                t0 = _ns()
            samples.append(_ns() - t0)
        rt.close()
        if files:
            if open(os.path.join(tmp, "root", f"f{effects - 1}.txt")).read() != str(rounds - 1):
                raise AssertionError("commit did not write the files")
        elif store.get(effects - 1) != rounds - 1:
            raise AssertionError("commit did not apply the transaction's effects")
    return Stats.of(samples)


def print_log_section(quick: bool) -> None:
    print("(d) the durable log's cost per commit: 4 bufferable effects, to an in-memory dict or")
    print("    to a real FileStore (4 fsynced file writes); Runtime(log=DIR) vs no log")
    print("                                    in-memory med     p99   FileStore med     p99")
    for mode in LOG_MODES:
        fast = mode in ("no log", "log, no fsync")
        n = (200 if quick else 2000) if fast else (20 if quick else 200)
        mem = bench_log_commit(mode, n)
        disk = bench_log_commit(mode, max(10, n // 10), files=True)
        print(
            f"    {mode:30s} {mem.median:13.1f} {mem.p99:8.1f} {disk.median:15.1f} {disk.p99:8.1f}"
        )
    print("    (fsync: the committed mark is fsynced before the first apply; the other records")
    print("    ride on the next fsync. Without fsync the log survives a killed process, not a")
    print("    power cut.)\n")


# ---------------------------------------------------------------------- (e) hot paths, with targets
REVERSIBLE_TARGET_US = 5.0
COMMIT_TARGET_US = 8.0
SPEC16_TARGETS_US = (100.0, 1000.0)  # median, p99 of the K = 16 total


def bench_reversible(rounds: int, per_tx: int) -> tuple[Stats, Stats]:
    """A direct call of a plain function and a shimmed call of the same function as a
    REVERSIBLE tool (executed at once, compensated at abort) in an open transaction; `per_tx`
    calls on distinct scopes per transaction, each timed alone."""
    rt = Runtime()
    store: dict[Any, Any] = {}

    def book(k: int, v: int) -> None:
        store[k] = v

    def unbook(call: Any) -> None:
        store.pop(call.args["k"], None)

    tool = rt.tool(book, effect="reversible", writes="mem:{k}", compensate=unbook, name="mem.book")
    direct: list[int] = []
    shimmed: list[int] = []
    for r in range(rounds):
        for k in range(per_tx):
            t0 = _ns()
            book(k, r)
            direct.append(_ns() - t0)
        store.clear()
        with rt.transaction():
            for k in range(per_tx):
                t0 = _ns()
                tool(k, r)
                shimmed.append(_ns() - t0)
            if len(store) != per_tx:
                raise AssertionError("a reversible call did not run at once")
        if rt.settlements[-1].accepted.__len__() != per_tx:
            raise AssertionError("commit did not accept every reversible effect")
        rt.settlements.clear()
    return Stats.of(direct), Stats.of(shimmed)


def bench_commit_sizes(rounds: int) -> tuple[Stats, Stats]:
    """The commit of a transaction with one bufferable effect and with four, interleaved so
    that both see the same machine."""
    rt = Runtime(keep_settlements=False)
    store: dict[Any, Any] = {}
    put = _bufferable_put(rt, store)
    samples: dict[int, list[int]] = {1: [], 4: []}
    for r in range(rounds):
        for effects in (1, 4):
            with rt.transaction():
                for j in range(effects):
                    put(j, r)
                t0 = _ns()
            samples[effects].append(_ns() - t0)
            if store.get(effects - 1) != r:
                raise AssertionError("commit did not apply the transaction's effects")
    return Stats.of(samples[1]), Stats.of(samples[4])


def hot_path_figures(quick: bool = False, *, tiny: bool = False) -> list[Figure]:
    """The hot paths: a reversible call, the fixed cost of a commit, K = 16 speculation,
    each next to a bare call measured in the same run and against its target."""
    scale = 0.01 if tiny else 0.2 if quick else 1.0
    # Each first runs once unmeasured: a process's first pass through a loop that allocates
    # grows its heap (page faults, fresh arenas), which makes that pass slower.
    bench_reversible(max(2, int(40 * scale)), 50)
    bare, reversible = bench_reversible(max(5, int(400 * scale)), 50)
    bench_commit_sizes(max(20, int(2000 * scale)))
    one, four = bench_commit_sizes(max(50, int(20000 * scale)))
    bench_speculation(16, max(20, int(1000 * scale)))
    _, _, k16 = bench_speculation(16, max(50, int(3000 * scale)))
    times = reversible.median / bare.median if bare.median else float("nan")
    per_effect = (four.median - one.median) / 3
    return [
        Figure("bare call (a plain function, for scale)", round(bare.median, 3), "µs", "-", None),
        Figure(
            f"reversible call ({times:.0f}x the bare call)",
            round(reversible.median, 2), "µs", f"<= {REVERSIBLE_TARGET_US:g}",
            reversible.median <= REVERSIBLE_TARGET_US,
        ),
        Figure(
            "fixed commit cost (commit of a one-effect transaction)",
            round(one.median, 2), "µs", f"<= {COMMIT_TARGET_US:g}", one.median <= COMMIT_TARGET_US,
        ),
        Figure(
            f"  commit of a four-effect transaction ({per_effect:.2f} µs per further effect)",
            round(four.median, 2), "µs", "-", None,
        ),
        Figure(
            "K = 16 speculation, total, median", round(k16.median, 1), "µs",
            f"<= {SPEC16_TARGETS_US[0]:g}", k16.median <= SPEC16_TARGETS_US[0],
        ),
        Figure(
            "K = 16 speculation, total, p99", round(k16.p99, 1), "µs",
            f"<= {SPEC16_TARGETS_US[1]:g} (quiet machine)", k16.p99 <= SPEC16_TARGETS_US[1],
        ),
    ]

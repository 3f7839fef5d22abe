"""The random-kill crash harness: SIGKILL a two-thread program at a random time, recover
(sometimes killing the recovery too), and judge every run from the stores alone.

The program is in tests/crash_program.py, the kill schedule in tests/crash_child.py and the
judge in tests/crash_judge.py. Each run's seed fixes the program and the kill time as a fraction
of the program's measured duration (uniform, not at named points), so a kill lands anywhere:
opening the log, a reversible call, staging, concurrent savepoints, the intent, the committed
mark, mid-apply, a compensation, the done mark.

    pytest -q tests/test_random_kills.py                           # the default count (50 runs)
    ATOMIX_CRASH_RUNS=600 pytest -q tests/test_random_kills.py     # the full count (>= 500 program kills)
    ATOMIX_CRASH_SEED=1000 ...                                     # another range of seeds
    ATOMIX_CRASH_WITHOUT=concurrent,async ...                      # leave parts of the program out
    python tests/crash_child.py --seed N --repeat 20               # one seed, run and judged 20 times

The summary line (printed even when the test passes) gives runs, kills (of the program and of
recovery), the transactions recovery settled, and each category's count, then the counts per
category and tool (`@concurrent`: in a concurrent savepoint, `@rollback`: in a rolled-back one).
A run killed after the program finished is judged too (its transactions all settled live).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from crash_child import Timing, calibrate, control_run, run_one
from crash_judge import Stores, Verdict, judge
from crash_program import Ledger, make_program

RUNS = int(os.environ.get("ATOMIX_CRASH_RUNS", "50"))
FIRST_SEED = int(os.environ.get("ATOMIX_CRASH_SEED", "0"))
CATEGORIES = ("lost", "duplicated", "half_settled", "leaked", "order")
CONTROL_EVERY = 10  # every 10th seed also runs unkilled first: a control, and the timing


def test_random_sigkills_then_recovery(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.perf_counter()
    timing: Timing | None = None  # set by the first control run
    totals = dict.fromkeys(CATEGORIES, 0)
    by_tool: dict[str, int] = {}
    kills = recovery_kills = recovered = txs = in_flight = committed = 0
    failing: list[str] = []
    progress: list[float] = []  # how far each killed program had got
    errors: list[str] = []
    controls = 0
    for seed in range(FIRST_SEED, FIRST_SEED + RUNS):
        base = tmp_path / f"run-{seed}"
        if (seed - FIRST_SEED) % CONTROL_EVERY == 0:
            verdict, timing = control_run(tmp_path / f"control-{seed}", seed, timing)
            controls += 1
            if not verdict.clean:
                failing.append(f"seed {seed} unkilled (a control): " + "; ".join(verdict.problems[:6]))
        assert timing is not None
        result = run_one(base, seed, timing)
        v = result.verdict
        kills += result.killed
        if result.killed:
            progress.append(result.progress)
        recovery_kills += result.recovery_kills
        recovered += result.recovered
        txs += v.transactions
        in_flight += v.in_flight
        committed += v.seen_committed
        for category in CATEGORIES:
            totals[category] += getattr(v, category)
        for name, n in v.by_tool.items():
            by_tool[name] = by_tool.get(name, 0) + n
        if result.error:
            errors.append(f"seed {seed}: {result.error}")
        if not v.clean:
            failing.append(
                f"seed {seed} (killed={result.killed}, recovery kills={result.recovery_kills}): "
                + "; ".join(v.problems[:6])
                + f"\n    reproduce: python tests/crash_child.py --seed {seed}"
            )
        elif not result.error:
            shutil.rmtree(base)  # keep only the runs that failed, for a look
    elapsed = time.perf_counter() - started
    summary = (
        f"random kills: {RUNS} runs (seeds {FIRST_SEED}..{FIRST_SEED + RUNS - 1}) and {controls} "
        "unkilled controls, "
        f"{kills} programs killed, {recovery_kills} recoveries killed, {txs} transactions "
        f"({committed} seen committed, {in_flight} in flight at the kill), {recovered} recovered; "
        f"lost {totals['lost']}, duplicated {totals['duplicated']}, half-settled "
        f"{totals['half_settled']}, leaked {totals['leaked']}, order {totals['order']}; "
        f"{elapsed:.1f} s"
    )
    if progress:
        progress.sort()
        q = [progress[int(f * (len(progress) - 1))] for f in (0.1, 0.5, 0.9)]
        summary += (f"\n  kills landed with {q[0]:.0%} / {q[1]:.0%} / {q[2]:.0%} of the program's "
                    "transactions settled (10th / 50th / 90th percentile)")
    detail = ", ".join(f"{k} {n}" for k, n in sorted(by_tool.items())) or "none"
    with capsys.disabled():
        print(f"\n{summary}\n  by category/tool: {detail}")
        sys.stdout.flush()
    assert not errors, "\n".join([summary, *errors[:10]])
    assert kills > RUNS // 2, f"too few runs were killed mid-program: {summary}"
    assert not failing, "\n".join(
        [summary, f"by category/tool: {detail}", *failing[:15]]
        + ([f"... and {len(failing) - 15} more failing seeds"] if len(failing) > 15 else [])
    )


# ------------------------------------------------------------------ the judge can fail
def _clean_run(tmp_path: Path) -> tuple[Path, int, Verdict]:
    """A seed's program run to completion (no kill), and its verdict."""
    seed = 3
    timing = calibrate(tmp_path / "calibration")
    result = run_one(tmp_path / "run", seed, timing, kill_at=10.0)  # never killed
    assert not result.killed and not result.error, result.error
    return tmp_path / "run", seed, result.verdict


def test_the_judge_sees_a_doubled_compensation_a_lost_effect_and_a_leak(tmp_path: Path) -> None:
    base, seed, before = _clean_run(tmp_path)
    plans = make_program(seed)
    stores = Stores.read(base)
    # A booking of an aborted or rolled-back part, compensated once: compensate it again.
    cancelled = [e for e in stores.ledger if e["op"] == "cancel"]
    committed_file = next(
        f"f/{op.ident}.txt" for p in plans if not p.app_abort for op in p.before if op.kind == "fs"
    )
    assert cancelled, "seed 3 compensates at least one booking"
    ledger = Ledger(base / "ledger.jsonl")
    ledger.append("cancel", cancelled[0]["id"], cancelled[0]["amount"], None)
    (base / "files" / committed_file).unlink()  # a committed effect disappears
    ledger.append("book", "a0-ghost", 7, None)  # harmless: not an effect of the program
    after = judge(base, seed)
    assert after.duplicated == before.duplicated + 1, after.problems
    assert after.lost == before.lost + 1, after.problems
    assert any("cancellation of" in p and "2 times" in p for p in after.problems)


def test_the_judge_sees_half_settled_and_order(tmp_path: Path) -> None:
    base, seed, before = _clean_run(tmp_path)
    # Make the last committed transaction of thread b look in flight (its C record gone),
    # then remove one of its effects: some there, some not.
    journal = (base / "journal").read_text().splitlines()
    plans = {p.name: p for p in make_program(seed)}
    name = next(
        line.split()[1] for line in reversed(journal)
        if line.startswith("C ") and len(plans[line.split()[1]].kept()) > 1
        and any(op.kind == "fs" for op in plans[line.split()[1]].kept())
    )
    (base / "journal").write_text("\n".join(x for x in journal if x != f"C {name}") + "\n")
    victim = next(op for op in plans[name].kept() if op.kind == "fs")
    (base / "files" / f"f/{victim.ident}.txt").unlink()
    (base / "files" / "shared.txt").write_text("someone-else")
    after = judge(base, seed)
    assert after.half_settled == before.half_settled + 1, after.problems
    assert after.order > before.order, after.problems

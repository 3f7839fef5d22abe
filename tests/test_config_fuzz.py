"""Config fuzzing: seeded mutations of the shipped configs through `atomix validate`.

Every case must end with exit 0 (accepted) or 2 (refused with a message), never a traceback
or an uncaught exception, within a few seconds; every accepted case must then run one trial
per sampled cell (one mode, `trials` overridden to 1) without an exception, and a few of them
the whole `atomix run` command (records, tables and plots).

The generator is seeded, so a failure names a case that can be replayed:
ATOMIX_FUZZ_SEED=<seed> ATOMIX_FUZZ_CASES=<n> pytest tests/test_config_fuzz.py -s
(more cases: ATOMIX_FUZZ_CASES=5000). Counts are printed at the end (`-s` shows them).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from support import CONFIGS, HANG_S, Stopwatch
from typer.testing import CliRunner

import harness.analysis.runs  # noqa: F401 - imported up front so that timings exclude it
from cli import app
from harness.experiment.cells import cell_id, expand_cells
from harness.experiment.config import load_config
from harness.experiment.runner import plan
from harness.experiment.trial import run_trial
from harness.experiment.yamlload import load_yaml

SHIPPED = sorted(CONFIGS.glob("*.yaml"))
SEED = int(os.environ.get("ATOMIX_FUZZ_SEED", "20261201"))
CASES = int(os.environ.get("ATOMIX_FUZZ_CASES", "320"))
LIMIT_S = 5.0  # per validate call (less any wait for a busy CPU); the alarm stops a hang
CELLS_RUN = 4  # cells run per accepted case (first, last and two drawn ones)
FULL_RUNS = 4  # accepted cases that also go through `atomix run` (report and plots)

runner = CliRunner()

PARAMS = {
    "synthetic": ["agents", "step_retries", "veto_rate"],
    "leakage": ["source"],
    "tau_retail": ["split", "sample", "task_seed", "step_retries", "notify", "data_dir"],
    "tau_contention": [
        "agents", "contended", "disjoint", "plan_delay_ms", "step_retries", "max_attempts",
        "notify", "data_dir",
    ],
}
NASTY: list[Any] = [
    None, "", "x", "all", "mixed", "F9", "../../etc", "/tmp", "a/b", "..", ".", " ", "\t",
    [], {}, [1, 2], [0], [-1, 5], {"a": 1}, True, False, 0, 1, -1, 2, 3, 7, 0.5, 1.5, -0.5,
    2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308, 5e-324,
    math.nan, math.inf, -math.inf, "NaN", "1e400", "0x10", "4", "yes", "null",
]
NAMES = ["..", ".", "../escape", "/tmp/abs", "a/b", "a\\b", "", " ", "x" * 300, "ok-name", "é", "a\nb"]


def nasty(rng: random.Random) -> Any:
    return rng.choice(NASTY)


# --------------------------------------------------------------------------- structure


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value in a loaded config (mapping keys and list indexes)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


def _set(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


def _delete(data: Any, path: tuple[Any, ...]) -> None:
    for p in path[:-1]:
        data = data[p]
    del data[path[-1]]


def m_wrong_type(rng: random.Random, data: dict[str, Any]) -> None:
    _set(data, rng.choice(list(_paths(data))), nasty(rng))


def m_param(rng: random.Random, data: dict[str, Any]) -> None:
    keys = PARAMS.get(str(data.get("workload")), ["agents"])
    params = data.setdefault("params", {})
    if not isinstance(params, dict):
        data["params"] = params = {}
    key = rng.choice([*keys, "bogus"])
    params[key] = _plausible(rng, key) if rng.random() < 0.5 else nasty(rng)


def m_grid_param(rng: random.Random, data: dict[str, Any]) -> None:
    keys = PARAMS.get(str(data.get("workload")), ["agents"])
    key = rng.choice(keys)
    grid = data.get("grid") if isinstance(data.get("grid"), dict) else {}
    values = [_plausible(rng, key) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        values[rng.randrange(len(values))] = nasty(rng)
    data["grid"] = {**grid, f"params.{key}": values}


def _plausible(rng: random.Random, key: str) -> Any:
    """A value the workload may well accept, so that accepted cases reach the trial."""
    choices: dict[str, list[Any]] = {
        "agents": [1, 2, 3, 8, 64, 128, 129, 500, 0],
        "contended": [1, 2, 5, 423, 424],
        "step_retries": [0, 1, 5, 20, 21],
        "max_attempts": [1, 2, 100, 101],
        "veto_rate": [0.0, 0.3, 1, 1.0, 1.01],
        "source": ["tool_failure", "losing_speculation", "stale_read", "pre_commit_veto", "timeout", "nope"],
        "split": ["test", "train", "base", "dev"],
        "sample": [1, 5, 40, 41, "all", 0],
        "task_seed": [0, 1, -5, 2**62, 2**64],
        "notify": [True, False],
        "disjoint": [True, False],
        "plan_delay_ms": [[0, 0], [20, 120], [120, 20], [0, 1e9], [1, 2, 3]],
        "data_dir": [None, "/nonexistent", "/tmp", "\x00"],
    }
    return rng.choice(choices.get(key, [1]))


def m_delete(rng: random.Random, data: dict[str, Any]) -> None:
    _delete(data, rng.choice(list(_paths(data))))


def m_unknown_key(rng: random.Random, data: dict[str, Any]) -> None:
    targets = [(), *[p for p in _paths(data) if isinstance(_get(data, p), dict)]]
    node = _get(data, rng.choice(targets))
    node[rng.choice(["bogus", "Name", "trails", "params.x", "", "1", "a b"])] = nasty(rng)


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        data = data[p]
    return data


def m_empty(rng: random.Random, data: dict[str, Any]) -> None:
    key = rng.choice(list(data))
    data[key] = rng.choice([None, "", [], {}])


def m_name(rng: random.Random, data: dict[str, Any]) -> None:
    where = rng.random()
    if where < 0.6 or not data.get("report"):
        data["name"] = rng.choice(NAMES)
    elif where < 0.8:
        data["labels"] = {"faults.rate": rng.choice(NAMES)}
    else:
        data["report"] = {"tables": [{"name": rng.choice(NAMES), "metric": "clean"}]}


def m_numbers(rng: random.Random, data: dict[str, Any]) -> None:
    key = rng.choice([
        "trials", "seed", "faults.rate", "faults.stall_ms", "faults.burst_length",
        "tool.latency_ms", "tool.jitter_ms", "settings.timeout_ms", "settings.backoff_ms",
        "settings.apply_attempts", "agent.max_steps", "agent.retry", "agent.replan_depth",
    ])
    value = rng.choice([0, -1, 1, 2, 10**9, 10**30, 1e308, math.nan, math.inf, -math.inf, 0.3, 1e9, 1e10])
    head, _, tail = key.partition(".")
    if tail:
        section = data.get(head) if isinstance(data.get(head), dict) else {}
        data[head] = {**section, tail: value}
    else:
        data[head] = value


def m_huge_grid(rng: random.Random, data: dict[str, Any]) -> None:
    width, keys = rng.choice([(10, 10), (100, 3), (10, 4), (2, 14), (100, 2), (1000, 1)])
    data["grid"] = {f"tool.latency_ms_{i}" if rng.random() < 0.1 else f"params.k{i}": list(range(width)) for i in range(keys)}
    if rng.random() < 0.5:  # valid values, so that only the size cap can refuse them
        data["grid"] = {"seed": list(range(rng.choice([999, 1000, 1001, 5000, 30000])))}


def m_duplicate_cells(rng: random.Random, data: dict[str, Any]) -> None:
    if isinstance(data.get("cells"), list) and data["cells"]:
        data["cells"].append(dict(rng.choice(data["cells"])))
    else:
        data["grid"] = {"faults.rate": [0.1, 0.1] if rng.random() < 0.5 else [0.1, 0.10, 0.3]}


def m_modes(rng: random.Random, data: dict[str, Any]) -> None:
    modes = data.get("modes") if isinstance(data.get("modes"), list) else ["tx-full"]
    data["modes"] = rng.choice([[], ["nope"], modes + modes[:1], modes[:1], "tx-full", [None], [["tx-full"]]])


def m_valid_tweak(rng: random.Random, data: dict[str, Any]) -> None:
    """A change that keeps the config valid (mostly): accepted cases must run."""
    choice = rng.randrange(5)
    if choice == 0:
        data["trials"] = rng.choice([1, 2, 50])
    elif choice == 1:
        data["seed"] = rng.randrange(-(10**6), 10**6)
    elif choice == 2:
        faults = data.get("faults") if isinstance(data.get("faults"), dict) else {}
        data["faults"] = {**faults, "classes": rng.choice(["mixed", "F3", ["F1", "F5"], {"F2": 2, "F4": 1}])}
    elif choice == 3:
        data["tool"] = {"latency_ms": rng.choice([0, 1, 1e6]), "jitter_ms": rng.choice([0, 3])}
    else:
        data["agent"] = rng.choice([
            {"kind": "gold"}, {"kind": "llm-like", "max_steps": rng.choice([1, 30, 300])},
            {"kind": "llm-like", "max_steps": 30, "retry": 0, "alter": 0, "carry_on": 0, "replan": 1, "give_up": 0},
        ])


STRUCTURAL: dict[str, Callable[[random.Random, dict[str, Any]], None]] = {
    "wrong-type": m_wrong_type,
    "param": m_param,
    "grid-param": m_grid_param,
    "delete": m_delete,
    "unknown-key": m_unknown_key,
    "empty": m_empty,
    "name": m_name,
    "number": m_numbers,
    "huge-grid": m_huge_grid,
    "duplicate-cell": m_duplicate_cells,
    "modes": m_modes,
    "valid-tweak": m_valid_tweak,
}

# --------------------------------------------------------------------------- text


def _bomb(rng: random.Random) -> str:
    levels = rng.randint(5, 9)
    lines = ["bomb0: &b0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"bomb{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def t_byte_flip(rng: random.Random, text: bytes) -> bytes:
    data = bytearray(text)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def t_non_utf8(rng: random.Random, text: bytes) -> bytes:
    decoded = text.decode("utf-8")
    kind = rng.randrange(4)
    if kind == 0:
        return decoded.replace("description:", "description: café", 1).encode("latin-1", "replace")
    if kind == 1:
        return decoded.encode("utf-16")
    if kind == 2:
        cut = rng.randrange(len(text))
        return text[:cut] + b"\xc3" + text[cut:]  # a lone lead byte
    return text + b"\n# \xff\xfe\x80\n"


def t_truncate(rng: random.Random, text: bytes) -> bytes:
    return text[: rng.randrange(len(text))]


def t_alias_bomb(rng: random.Random, text: bytes) -> bytes:
    return _bomb(rng).encode() + text


def t_self_reference(rng: random.Random, text: bytes) -> bytes:
    decoded = text.decode()
    snippet = rng.choice([
        "params: &p {agents: *p}\n", "selfref: &r [1, *r]\n", "grid: &g {faults.rate: [*g]}\n",
        "agent: &a\n  kind: *a\n", "labels: &l {x: {y: *l}}\n",
    ])
    head = snippet.split(":", 1)[0]
    lines = [ln for ln in decoded.splitlines(keepends=True) if not ln.startswith(f"{head}:")]
    return ("".join(lines) + snippet).encode()


def t_deep_nesting(rng: random.Random, text: bytes) -> bytes:
    depth = rng.choice([20, 31, 33, 100, 1000, 20000])
    flow = rng.random() < 0.7
    if flow:
        value = "[" * depth + "1" + "]" * depth
        return text + f"\ndeep: {value}\n".encode()
    block = "".join(" " * i + f"k{i}:\n" for i in range(min(depth, 2000)))
    return text + f"\ndeep:\n{block}".encode()


def t_duplicate_key(rng: random.Random, text: bytes) -> bytes:
    lines = text.decode().splitlines(keepends=True)
    top = [i for i, ln in enumerate(lines) if ln[:1].isalpha() and ":" in ln]
    i = rng.choice(top)
    return "".join([*lines, lines[i] if lines[i].endswith("\n") else "\n" + lines[i]]).encode()


def t_junk(rng: random.Random, text: bytes) -> bytes:
    junk = rng.choice(["\x00", "\t", "\x1b[31m", "\ufeff", "- - -", "{{", "? [a]\n: 1", "!!python/object:os.system x", "!!binary aGk=", "2024-01-01", "*undefined", "\u200b", "\ufeff", "\u202e"])
    decoded = text.decode()
    cut = rng.randrange(len(decoded))
    return (decoded[:cut] + junk + decoded[cut:]).encode()


TEXTUAL: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "byte-flip": t_byte_flip,
    "non-utf8": t_non_utf8,
    "truncate": t_truncate,
    "alias-bomb": t_alias_bomb,
    "self-reference": t_self_reference,
    "deep-nesting": t_deep_nesting,
    "duplicate-key": t_duplicate_key,
    "junk": t_junk,
}


def make_case(rng: random.Random) -> tuple[str, str, bytes]:
    """(mutation, source config, mutated bytes)."""
    source = rng.choice(SHIPPED)
    text = source.read_bytes()
    if rng.random() < 0.4:
        kind = rng.choice(list(TEXTUAL))
        return kind, source.name, TEXTUAL[kind](rng, text)
    data = yaml.safe_load(text)
    kinds = rng.sample(list(STRUCTURAL), k=rng.choice([1, 1, 1, 2]))
    if rng.random() < 0.25:  # more configs that pass, so that more trials run
        kinds = ["valid-tweak", *[k for k in kinds if k in ("param", "grid-param", "modes")]]
    for kind in kinds:
        STRUCTURAL[kind](rng, data)
    try:
        out = yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()
    except yaml.YAMLError:
        out = repr(data).encode()
    return "+".join(kinds), source.name, out


# --------------------------------------------------------------------------- checks


class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise CaseTimeout in this thread after `seconds` of this process's CPU time (a loop
    that hangs; CPU time, which a loaded machine does not stretch), or after HANG_S seconds
    of wall time (a wait that hangs): a hang must fail the case, not CI."""

    def on_alarm(signum: int, frame: Any) -> None:
        what = "of CPU time" if signum == signal.SIGPROF else "of wall time"
        raise CaseTimeout(f"no answer within {seconds if signum == signal.SIGPROF else HANG_S} s {what}")

    previous = {s: signal.signal(s, on_alarm) for s in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in previous.items():
            signal.signal(s, handler)


REASONS = [  # how a refusal is counted in the summary: the first pattern found
    ("not UTF-8", "non-utf8"),
    ("alias bomb", "alias-bomb"),
    ("self-referencing", "self-reference"),
    ("nested more than", "deep-nesting"),
    ("nesting depth", "deep-nesting"),
    ("duplicate key", "duplicate-key"),
    ("not valid YAML", "yaml-syntax"),
    ("is not allowed in", "yaml-syntax"),
    ("exceed the limit", "size-cap"),
    ("occurs twice", "duplicate-cell-id"),
    ("A-Z a-z 0-9", "name"),
    ("params", "workload-params"),
    ("mapping of keys", "not-a-mapping"),
]


def reason(output: str) -> str:
    for needle, label in REASONS:
        if needle in output:
            return label
    return "schema"


def run_one_trial_per_cell(path: Path, rng: random.Random) -> int:
    """Run trial 0 of a few cells in one mode, as `atomix run --trials 1 --modes M` would."""
    config = load_config(path)
    if config.agent.kind == "llm":
        return 0  # its trials need a model server (tests/test_llm_agent.py runs them)
    mode = rng.choice(config.modes)
    small = load_config(path, overrides={"trials": 1, "modes": [mode]})
    specs = plan(small)
    assert len({s.key for s in specs}) == len(specs), "duplicate trial keys"
    chosen = {0, len(specs) - 1, *rng.sample(range(len(specs)), min(2, len(specs)))}
    for i in sorted(chosen)[:CELLS_RUN]:
        record = run_trial(specs[i])
        assert record["key"] == specs[i].key
    assert [cell_id(small, c) for c in expand_cells(small)]
    return len(chosen)


def test_fuzzed_configs_are_refused_or_run(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    counts: collections.Counter[str] = collections.Counter()
    rejected: collections.Counter[str] = collections.Counter()
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    failures: list[str] = []
    slowest = (0.0, "")
    runner.invoke(app, ["validate", str(SHIPPED[0])])  # imports and data loads are not timed
    started = time.perf_counter()
    full_runs = 0
    for n in range(CASES):
        kind, source, blob = make_case(rng)
        path = tmp_path / f"case{n}.yaml"
        path.write_bytes(blob)
        label = f"case {n} ({kind} of {source}, seed {SEED})"
        try:
            with alarm(2 * LIMIT_S), Stopwatch() as stopwatch:
                result = runner.invoke(app, ["validate", str(path)])
        except CaseTimeout:
            failures.append(f"{label}: validate hung")
            continue
        took = stopwatch.seconds  # (time spent waiting for a busy CPU aside)
        slowest = max(slowest, (took, label))
        counts["cases"] += 1
        exc = result.exception
        if isinstance(exc, CaseTimeout) or took > LIMIT_S:
            failures.append(f"{label}: validate took {took:.1f} s")
            continue
        if "Traceback" in result.output or (exc is not None and not isinstance(exc, SystemExit)):
            failures.append(f"{label}: exit {result.exit_code}, {exc!r}\n{result.output[-600:]}")
            continue
        if result.exit_code == 2:
            counts["rejected"] += 1
            rejected[reason(result.output)] += 1
            by_kind[kind.split("+")[0]]["rejected"] += 1
            lines = result.output.strip().splitlines()
            if not lines or not lines[0].startswith(str(path)):
                failures.append(f"{label}: the refusal does not name the file: {result.output[:300]!r}")
            continue
        if result.exit_code != 0:
            failures.append(f"{label}: exit {result.exit_code}\n{result.output[-600:]}")
            continue
        counts["accepted"] += 1
        by_kind[kind.split("+")[0]]["accepted"] += 1
        try:
            with alarm(30):
                counts["trials run"] += run_one_trial_per_cell(path, random.Random(n))
            counts["ran"] += 1
        except Exception as exc:  # noqa: BLE001 - every accepted case must run
            failures.append(f"{label}: accepted but the trial failed: {exc!r}")
            continue
        if full_runs < FULL_RUNS:
            full_runs += 1
            mode = load_yaml(blob)["modes"][0]
            args = ["run", str(path), "--trials", "1", "--modes", mode, "--jobs", "1", "--out", str(tmp_path / "runs")]
            with alarm(60):
                full = runner.invoke(app, args)
            counts["full runs"] += 1
            if "Traceback" in full.output or full.exit_code not in (0, 2) or (
                full.exception is not None and not isinstance(full.exception, SystemExit)
            ):
                failures.append(f"{label}: `atomix run` failed: {full.exception!r}\n{full.output[-600:]}")
    wall = time.perf_counter() - started
    print(f"\nconfig fuzz: seed {SEED}, {wall:.1f} s; " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print("  rejected by reason: " + ", ".join(f"{k} {v}" for k, v in rejected.most_common()))
    print("  by mutation: " + "; ".join(
        f"{k}: {c['rejected']} rejected / {c['accepted']} accepted" for k, c in sorted(by_kind.items())
    ))
    print(f"  slowest validate: {slowest[0]:.2f} s ({slowest[1]})")
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n\n".join(failures[:10])
    assert counts["cases"] >= min(CASES, 300)
    # Both outcomes must be exercised, or the generator has stopped testing one of them.
    assert counts["rejected"] > CASES // 4 and counts["accepted"] > CASES // 10

"""Helpers of the coordinator tests: a throwaway PostgreSQL server, running child processes,
and an Elle-style checker of list-append histories.

The server: Debian's `initdb` and `pg_ctl` (package ``postgresql``), a data directory and a
unix socket in a fresh temporary directory, trust authentication, fsync off; run as the
``postgres`` user when the tests run as root (PostgreSQL refuses root). Stopped (immediate)
and deleted at the end. Without `initdb` the PostgreSQL cases are skipped, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHILD = Path(__file__).with_name("coordinator_child.py")
ROOT = Path(__file__).resolve().parent.parent
PG_BIN_DIRS = [Path("/usr/lib/postgresql") / v / "bin" for v in ("17", "16", "15", "14", "13")]


def find_pg_bin() -> Path | None:
    for d in PG_BIN_DIRS:
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


@dataclass
class PgServer:
    """A running throwaway server; `url(db)` connects over its unix socket."""

    base: Path
    bin: Path
    user: str | None
    dbs: list[str] = field(default_factory=list)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    def url(self, db: str) -> str:
        return f"postgresql://atomix@/{db}?host={self.base}"

    def create_db(self, name: str) -> str:
        """A fresh, empty database: every test gets its own coordinator."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        self.dbs.append(name)
        return self.url(name)

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.base / "data"), "-m", "immediate", "stop")
        shutil.rmtree(self.base, ignore_errors=True)


def start_pg() -> PgServer:
    """Start a server, or raise RuntimeError saying why it could not."""
    pg_bin = find_pg_bin()
    if pg_bin is None:
        raise RuntimeError("PostgreSQL's initdb is not installed (Debian package 'postgresql')")
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("psycopg is not installed (pip install 'atomix-tx[coordinator]')") from exc
    base = Path(tempfile.mkdtemp(prefix="atomix-pg-"))
    user = None
    if os.geteuid() == 0:
        user = "postgres"
        shutil.chown(base, user)
    server = PgServer(base, pg_bin, user)
    init = server._run(
        str(pg_bin / "initdb"), "-D", str(base / "data"), "-A", "trust", "-U", "atomix", "--no-sync"
    )
    if init.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
    opts = f"-k {base} -c listen_addresses='' -F -c max_connections=200"
    started = server._run(
        str(pg_bin / "pg_ctl"), "-D", str(base / "data"), "-o", opts, "-l", str(base / "log"), "-w", "start"
    )
    if started.returncode != 0:
        log = (base / "log").read_text() if (base / "log").exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()} {log[-500:]}")
    return server


# -- fixtures (imported by the test modules) ---------------------------------------------------------
_counter = iter(range(1_000_000))


@pytest.fixture(scope="module", name="pg")
def pg_fixture() -> Iterator[PgServer | str]:
    """A throwaway server for the module, or why there is none."""
    try:
        server = start_pg()
    except RuntimeError as exc:
        yield str(exc)
        return
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"], name="url")
def url_fixture(request: pytest.FixtureRequest, tmp_path: Path, pg: PgServer | str) -> str:
    """A fresh coordinator of each kind (PostgreSQL: skipped, saying why, without a server)."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/coordinator.db"
    if isinstance(pg, str):
        pytest.skip(f"no PostgreSQL server: {pg}")
    return pg.create_db(f"atomix_{os.getpid()}_{next(_counter)}")


@pytest.fixture(name="pg_url")
def pg_url_fixture(pg: PgServer | str) -> str:
    """A fresh database on the module's throwaway server (skipped, saying why, without one)."""
    if isinstance(pg, str):
        pytest.skip(f"no PostgreSQL server: {pg}")
    return pg.create_db(f"atomix_{os.getpid()}_{next(_counter)}")


def configs(url: str, tmp: Path, n: int, **extra: object) -> list[dict[str, object]]:
    """One child configuration per process, sharing one data directory."""
    data = tmp / "data"
    (data / "files").mkdir(parents=True, exist_ok=True)
    # Made here, once: processes that all switch a new SQLite file to WAL at once can clash.
    from atomix.adapters.sqlite import SQLiteStore

    SQLiteStore(data / "rows.db").close()
    return [
        {"url": url, "data": str(data), "name": f"p{i}", "seed": i, **extra} for i in range(n)
    ]


# -- children ------------------------------------------------------------------------------------
@dataclass
class Child:
    proc: subprocess.Popen[str]
    name: str

    def result(self, timeout: float = 120.0) -> dict[str, Any] | None:
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            if self.proc.returncode < 0:  # killed on purpose
                return None
            raise AssertionError(f"child {self.name} exited {self.proc.returncode}: {err[-3000:]}")
        last = [line for line in out.splitlines() if line.startswith("{")]
        assert last, f"child {self.name} printed no result: {out[-500:]} {err[-2000:]}"
        result: dict[str, Any] = json.loads(last[-1])
        return result


def spawn(configs: list[dict[str, Any]], go: Path) -> list[Child]:
    """Start children and wait until each has joined its coordinator (they then wait for
    `go` to exist)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = []
    for cfg in configs:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps({**cfg, "go": str(go)})],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        children.append(Child(proc, cfg["name"]))
    for child in children:
        assert child.proc.stdout is not None
        line = child.proc.stdout.readline()
        if line.strip() != "READY":
            _, err = child.proc.communicate(timeout=30)
            for other in children:  # the rest would wait for `go` for ever
                if other.proc.poll() is None:
                    other.proc.kill()
                    other.proc.wait(30)
            raise AssertionError(f"child {child.name} did not start: {line!r} {err[-3000:]}")
    return children


# -- the history checker ----------------------------------------------------------------------------
@dataclass
class Verdict:
    """What the checker found. Every list empty: no anomaly."""

    committed: int
    indeterminate: int
    lost: list[str] = field(default_factory=list)  # acknowledged appends missing at the end
    duplicated: list[str] = field(default_factory=list)
    half: list[str] = field(default_factory=list)  # transactions partly in the final state
    aborted_visible: list[str] = field(default_factory=list)  # a failed tx's append landed
    bad_reads: list[str] = field(default_factory=list)  # a read that is no prefix of the end
    cycles: list[list[str]] = field(default_factory=list)
    edges: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicated or self.half or self.aborted_visible or self.bad_reads
            or self.cycles
        )


def load_history(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """tid -> its last record (ok > fail > attempt)."""
    rank = {"attempt": 0, "fail": 1, "ok": 2}
    txs: dict[str, dict[str, Any]] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by SIGKILL
            old = txs.get(rec["tid"])
            if old is None or rank[rec["status"]] >= rank[old["status"]]:
                txs[rec["tid"]] = rec
    return txs


def check(txs: dict[str, dict[str, Any]], final: dict[str, list[str]]) -> Verdict:
    """Elle's list-append check: every acknowledged append is in the final list once, no
    failed one is, each transaction is all in or all out, every read is a prefix of the final
    list, and the graph of write-write, write-read and read-write dependencies (version order
    from the final lists) has no cycle."""
    ok = {t for t, r in txs.items() if r["status"] == "ok"}
    verdict = Verdict(len(ok), sum(1 for r in txs.values() if r["status"] == "attempt"))
    writer: dict[str, str] = {}
    for t, rec in txs.items():
        for op in rec["ops"]:
            if op[0] == "a":
                writer[op[2]] = t
    position: dict[str, tuple[str, int]] = {}
    for k, lst in final.items():
        seen: set[str] = set()
        for i, element in enumerate(lst):
            if element in seen:
                verdict.duplicated.append(element)
            seen.add(element)
            position[element] = (k, i)
    for t, rec in txs.items():
        appended = [op[2] for op in rec["ops"] if op[0] == "a"]
        present = [e for e in appended if e in position]
        if rec["status"] == "ok":
            verdict.lost += [e for e in appended if e not in position]
        if rec["status"] == "fail":
            verdict.aborted_visible += present
        if present and len(present) != len(appended) and rec["status"] != "ok":
            verdict.half.append(t)
    # Transactions that took effect: acknowledged, or indeterminate whose appends landed.
    effective = {t for t, r in txs.items() if r["status"] == "ok"} | {
        t for t, r in txs.items()
        if r["status"] == "attempt" and any(op[0] == "a" and op[2] in position for op in r["ops"])
    }
    graph: dict[str, set[str]] = defaultdict(set)
    counts = {"ww": 0, "wr": 0, "rw": 0}

    def edge(a: str, b: str, kind: str) -> None:
        if a != b and a in effective and b in effective:
            if b not in graph[a]:
                counts[kind] += 1
            graph[a].add(b)

    for lst in final.values():
        for x, y in zip(lst, lst[1:], strict=False):
            if x in writer and y in writer:
                edge(writer[x], writer[y], "ww")
    for t in effective:
        for op in txs[t]["ops"]:
            if op[0] != "r":
                continue
            k, seen_list = str(op[1]), op[2]
            end = final.get(k, [])
            if seen_list != end[: len(seen_list)]:
                verdict.bad_reads.append(f"{t} read {k}={seen_list}, final {end}")
                continue
            if seen_list and seen_list[-1] in writer:
                edge(writer[seen_list[-1]], t, "wr")
            if len(end) > len(seen_list) and end[len(seen_list)] in writer:
                edge(t, writer[end[len(seen_list)]], "rw")
    verdict.edges = counts
    verdict.cycles = _cycles(graph)
    return verdict


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    nodes = set(graph) | {b for bs in graph.values() for b in bs}
    for root in sorted(nodes):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def final_lists(db_path: Path, keys: int) -> dict[str, list[str]]:
    from atomix.adapters.sqlite import SQLiteStore

    store = SQLiteStore(db_path)
    try:
        return {str(k): list(store.get("t", k) or []) for k in range(keys)}
    finally:
        store.close()


def wait_all(children: list[Child], timeout: float) -> list[dict[str, Any] | None]:
    end = time.monotonic() + timeout
    return [c.result(max(1.0, end - time.monotonic())) for c in children]

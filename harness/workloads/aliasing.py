"""The aliasing and canonicalisation stress (paper Table 20).

Each trial is one case of a fixed catalogue: two agents, each with a one-transaction
plan, touch a resource of one substrate (files, SQLite, URLs, mailbox). In an `alias` case
they name one real resource in two spellings (a relative and an absolute path, `..`, a
symlink, a table name's letter case, a default port, a plus-tagged address in another case,
a directory and a file below it, ...); in a `distinct` case they name two real resources
that look alike (`docs/a` and `docs/ab`, `Report.txt` and `report.txt` on a case-sensitive
file system, a table and a table whose name extends it, `bob+billing@` and `bob@`, ...).

Agent a0 begins first (the earlier epoch), makes its call and then deliberates for a while
(read-only `review` calls) before it commits; agent a1 begins 30 ms later, after a0's call,
makes its own and commits at once, while a0 is still open. Whether the mode saw a conflict
is read from what it did: a1 waited (blocked time > 0), or one of them was aborted as stale
(and retried). Whether it should have is read
from the substrates (aliasing_substrates.py): did the two agents touch one real resource,
at least one of them writing it. A missed conflict is a case that should conflict where a1
did not wait; a false conflict is a case that should not where it did.

Scopes are what a shim's template renders from the arguments as the agent spelt them
(`fs:` + the path joined onto the workspace root, `sqlite:<db path>:<table>:<key>`, the URL,
`mail:` + the address), exactly as `@rt.tool(writes=...)` renders them; the mode's scope
policy does the rest (canonical, naive string, one global scope, or flat canonical).

Parameters (`params.*`): `substrate` (files, sqlite, url or mailbox) and `pair` (alias or
distinct) choose the catalogue part; trial i runs case i modulo its size (7 each).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from atomix.effects import AbortSource, EffectClass
from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.workloads.aliasing_substrates import (
    AuditedSQLite,
    Identity,
    OsFiles,
    TouchLog,
    WebStore,
)
from harness.workloads.base import Scenario, WorkloadParams
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef

Substrate = Literal["files", "sqlite", "url", "mailbox"]
Pair = Literal["alias", "distinct"]
WORLD = "alias"  # the key of the trial's AliasWorld in TrialEnv.extra
REVIEWS = 4  # a0's deliberation calls after its own call: it stays open while a1 commits
# a1 begins after a0 has made its call (even one preceded by a workspace_root look-up) and
# commits well before a0 does (10 ms of thought and 5-7 ms of latency per call).
SECOND_START_MS = 30.0


@dataclass
class AliasWorld:
    """The trial's aliasing substrates and the log of what each call really touched."""

    files: OsFiles
    sql: AuditedSQLite
    web: WebStore
    touches: TouchLog


def world(env: TrialEnv) -> AliasWorld:
    return env.extra[WORLD]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- catalogue


@dataclass(frozen=True, slots=True)
class Op:
    """One agent's call in a case; `absolute` makes its `path` absolute at run time (the
    agent first asks the workspace for its root, as an agent learns an absolute path)."""

    tool: str
    args: Mapping[str, Any]
    absolute: bool = False


@dataclass(frozen=True, slots=True)
class Case:
    """Two agents' calls on one substrate: a0's (earlier, long-running) and a1's."""

    name: str
    what: str
    a: Op
    b: Op


def _w(path: str, absolute: bool = False) -> Op:
    return Op("fs_write", {"path": path, "text": "edited"}, absolute)


def _row(db: str, table: str, key: Any, by: str = "key", tool: str = "db_update") -> Op:
    args: dict[str, Any] = {"db": db, "table": table, "key": key, "by": by}
    if tool == "db_update":
        args["note"] = "edited"
    return Op(tool, args)


def _put(url: str) -> Op:
    return Op("http_put", {"url": url, "body": "edited"})


def _mail(to: str) -> Op:
    return Op("send_mail", {"to": to, "subject": "notice", "body": "edited"})


API = "https://api.shop.example"

CATALOGUE: dict[str, dict[str, tuple[Case, ...]]] = {
    "files": {
        "alias": (
            Case("f-abs", "absolute path read vs relative path write",
                 Op("fs_read", {"path": "docs/report.txt"}, absolute=True), _w("docs/report.txt")),
            Case("f-dotdot", "'..' segment", _w("docs/../docs/report.txt"), _w("docs/report.txt")),
            Case("f-dot", "'.' segment and '//'", _w("./docs//report.txt"), _w("docs/report.txt")),
            Case("f-link-file", "symlink to the file", _w("latest.txt"), _w("docs/report.txt")),
            Case("f-link-dir", "path through a symlinked directory", _w("current/report.txt"),
                 _w("docs/report.txt")),
            Case("f-tree", "a directory and a file two levels below it",
                 Op("fs_write_tree", {"dir": "docs", "text": "archived"}), _w("docs/sub/notes.txt")),
            Case("f-link-dotdot", "'..' after a symlinked directory (physical parent)",
                 _w("deep/../x.txt"), _w("docs/x.txt")),
        ),
        "distinct": (
            Case("f-prefix-name", "names sharing a prefix", _w("docs/a"), _w("docs/ab")),
            Case("f-case", "letter case on a case-sensitive file system", _w("docs/Report.txt"),
                 _w("docs/report.txt")),
            Case("f-prefix-dir", "a directory and a file in a directory extending its name",
                 Op("fs_write_tree", {"dir": "docs", "text": "archived"}), _w("docs2/report.txt")),
            Case("f-suffix", "a file and its backup", _w("docs/report.txt"), _w("docs/report.txt.bak")),
            Case("f-dotdot-lookalike", "'a/../b.txt' and 'a/b.txt'", _w("a/../b.txt"), _w("a/b.txt")),
            Case("f-link-dotdot-lexical", "'..' after a symlink vs its lexical reading",
                 _w("deep/../x.txt"), _w("x.txt")),
            Case("f-basename", "one name in two directories", _w("docs/report.txt"),
                 _w("archive/report.txt")),
        ),
    },
    "sqlite": {
        "alias": (
            Case("s-table-case", "table name case (read vs write)",
                 _row("shop.db", "Orders", 7, tool="db_read"), _row("shop.db", "orders", 7)),
            Case("s-db-dot", "database path with './'", _row("./shop.db", "orders", 7),
                 _row("shop.db", "orders", 7)),
            Case("s-db-dotdot", "database path with '..'", _row("data/../shop.db", "orders", 7),
                 _row("shop.db", "orders", 7)),
            Case("s-db-link", "database through a symlink", _row("live.db", "orders", 7),
                 _row("shop.db", "orders", 7)),
            Case("s-rowid-key", "rowid vs INTEGER PRIMARY KEY given as a string",
                 _row("shop.db", "orders", 7, by="rowid"), _row("shop.db", "orders", "7")),
            Case("s-table-row", "a whole table and one of its rows",
                 Op("db_update_table", {"db": "shop.db", "table": "orders", "note": "closed"}),
                 _row("shop.db", "orders", 7)),
            Case("s-db-row", "a whole database (via its symlink) and one row",
                 Op("db_update_database", {"db": "live.db", "note": "migrated"}),
                 _row("shop.db", "customers", 3)),
        ),
        "distinct": (
            Case("s-prefix-table", "tables sharing a name prefix", _row("shop.db", "items", 7),
                 _row("shop.db", "items_archive", 7)),
            Case("s-prefix-key", "keys sharing a prefix", _row("shop.db", "orders", 1),
                 _row("shop.db", "orders", 12)),
            Case("s-prefix-db", "database files sharing a prefix", _row("shop.db", "orders", 7),
                 _row("shop2.db", "orders", 7)),
            Case("s-other-row", "two rows of one table", _row("shop.db", "orders", 7),
                 _row("shop.db", "orders", 8)),
            Case("s-table-prefix-row", "a table and a row of a table extending its name",
                 Op("db_update_table", {"db": "shop.db", "table": "orders", "note": "closed"}),
                 _row("shop.db", "orders_eu", 7)),
            Case("s-key-case", "TEXT keys differing in case", _row("shop.db", "tags", "Red"),
                 _row("shop.db", "tags", "red")),
            Case("s-same-rowid", "one rowid in two tables", _row("shop.db", "orders", 7),
                 _row("shop.db", "refunds", 7)),
        ),
    },
    "url": {
        "alias": (
            Case("u-host-case", "host case (read vs write)",
                 Op("http_get", {"url": "https://API.Shop.Example/v1/items/7"}), _put(f"{API}/v1/items/7")),
            Case("u-default-port", "explicit default port", _put("https://api.shop.example:443/v1/items/7"),
                 _put(f"{API}/v1/items/7")),
            Case("u-trailing-slash", "trailing slash", _put(f"{API}/v1/items/7/"), _put(f"{API}/v1/items/7")),
            Case("u-percent", "percent-encoded unreserved character", _put(f"{API}/v1/users/%7Ealice"),
                 _put(f"{API}/v1/users/~alice")),
            Case("u-query-order", "query parameter order", _put(f"{API}/v1/prices?sku=7&store=3"),
                 _put(f"{API}/v1/prices?store=3&sku=7")),
            Case("u-dot-segments", "dot segments", _put(f"{API}/v1/./items/../items/7"),
                 _put(f"{API}/v1/items/7")),
            Case("u-collection", "a collection and an item in it",
                 Op("http_put_collection", {"url": f"{API}/v1/items", "body": "repriced"}),
                 _put(f"{API}/v1/items/7")),
        ),
        "distinct": (
            Case("u-prefix-id", "ids sharing a prefix", _put(f"{API}/v1/items/7"), _put(f"{API}/v1/items/77")),
            Case("u-path-case", "path case (paths are case-sensitive)", _put(f"{API}/v1/Items/7"),
                 _put(f"{API}/v1/items/7")),
            Case("u-host-prefix", "hosts sharing a prefix", _put("https://shop.example/v1/items/7"),
                 _put("https://shop.example.net/v1/items/7")),
            Case("u-port", "another port", _put("https://api.shop.example:8443/v1/items/7"),
                 _put(f"{API}/v1/items/7")),
            Case("u-query-value", "another query value", _put(f"{API}/v1/prices?sku=7&store=3"),
                 _put(f"{API}/v1/prices?sku=7&store=4")),
            Case("u-collection-prefix", "a collection and an item of a collection extending its name",
                 Op("http_put_collection", {"url": f"{API}/v1/items", "body": "repriced"}),
                 _put(f"{API}/v1/items-archive/7")),
            Case("u-scheme", "http and https", _put("http://api.shop.example/v1/items/7"),
                 _put(f"{API}/v1/items/7")),
        ),
    },
    "mailbox": {
        "alias": (
            Case("m-case", "address case", _mail("Alice@Example.com"), _mail("alice@example.com")),
            Case("m-domain-case", "domain case", _mail("alice@EXAMPLE.COM"), _mail("alice@example.com")),
            Case("m-local-case", "local-part case", _mail("ALICE@example.com"), _mail("alice@example.com")),
            Case("m-lead-space", "leading blank", _mail(" alice@example.com"), _mail("alice@example.com")),
            Case("m-trail-space", "trailing blank", _mail("alice@example.com "), _mail("alice@example.com")),
            Case("m-plus-case", "plus-tagged address in another case", _mail("Bob+Billing@Example.com"),
                 _mail("bob+billing@example.com")),
            Case("m-mixed", "two non-canonical spellings", _mail("aLiCe@ExAmPlE.cOm"),
                 _mail("ALICE@EXAMPLE.COM")),
        ),
        "distinct": (
            Case("m-plus-tag", "plus tag vs the bare address (distinct mailboxes)",
                 _mail("bob+billing@example.com"), _mail("bob@example.com")),
            Case("m-plus-other", "two plus tags", _mail("bob+a@example.com"), _mail("bob+b@example.com")),
            Case("m-prefix-local", "local parts sharing a prefix", _mail("al@example.com"),
                 _mail("alice@example.com")),
            Case("m-prefix-domain", "domains sharing a prefix", _mail("alice@example.co"),
                 _mail("alice@example.com")),
            Case("m-subdomain", "a subdomain", _mail("alice@mail.example.com"), _mail("alice@example.com")),
            Case("m-dots", "dots in the local part", _mail("alice.smith@example.com"),
                 _mail("alicesmith@example.com")),
            Case("m-digit", "a digit more", _mail("alice2@example.com"), _mail("alice@example.com")),
        ),
    },
}


# --------------------------------------------------------------------------- setup

_FILES = ("docs/report.txt", "docs/Report.txt", "docs/report.txt.bak", "docs/a", "docs/ab",
          "docs/x.txt", "docs/sub/notes.txt", "docs2/report.txt", "archive/report.txt",
          "a/b.txt", "b.txt", "x.txt")
_LINKS = {"latest.txt": "docs/report.txt", "current": "docs", "deep": "docs/sub"}
_INT_TABLES = ("orders", "orders_eu", "items", "items_archive", "refunds", "customers")
_WEB = (f"{API}/v1/items/7", f"{API}/v1/items/77", f"{API}/v1/items/8", f"{API}/v1/Items/7",
        f"{API}/v1/items-archive/7", f"{API}/v1/users/~alice", f"{API}/v1/prices?sku=7&store=3",
        f"{API}/v1/prices?sku=7&store=4", "https://shop.example/v1/items/7",
        "https://shop.example.net/v1/items/7", "https://api.shop.example:8443/v1/items/7",
        "http://api.shop.example/v1/items/7")


def setup(env: TrialEnv) -> None:
    """Make the trial's files, databases and web resources (no agent: not in the op log)."""
    base = env.workdir / "alias"
    touches = TouchLog()
    files = OsFiles(base / "site", touches, env.oplog)
    for rel in _FILES:
        path = files.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rel}\n")
    for link, target in _LINKS.items():
        os.symlink(target, files.root / link)
    sql_dir = base / "sql"
    (sql_dir / "data").mkdir(parents=True)
    sql = AuditedSQLite(sql_dir, touches, env.oplog)
    tables: dict[str, tuple[str, Any]] = {t: ("INTEGER", range(1, 13)) for t in _INT_TABLES}
    tables["tags"] = ("TEXT", ("Red", "red", "blue"))
    sql.create("shop.db", tables)
    sql.create("shop2.db", {"orders": ("INTEGER", range(1, 13))})
    os.symlink("shop.db", sql.directory / "live.db")
    web = WebStore(touches, env.oplog)
    web.seed(_WEB)
    env.extra[WORLD] = AliasWorld(files, sql, web, touches)


# --------------------------------------------------------------------------- tools


def _none(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return []


def _fs_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return ["fs:" + world(env).files.full(a["path"])]


def _tree_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return ["fs:" + world(env).files.full(a["dir"])]


def _db_path(env: TrialEnv, a: dict[str, Any]) -> str:
    return world(env).sql.full(a["db"])


def _row_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [f"sqlite:{_db_path(env, a)}:{a['table']}:{a['key']}"]


def _table_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [f"sqlite:{_db_path(env, a)}:{a['table']}"]


def _database_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [f"sqlite:{_db_path(env, a)}"]


def _url_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [a["url"]]


def _mail_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return ["mail:" + a["to"]]


def _fs_before(env: TrialEnv, a: dict[str, Any]) -> dict[str, bytes]:
    files = world(env).files
    return files.image([files.full(a["path"])])


def _tree_before(env: TrialEnv, a: dict[str, Any]) -> dict[str, bytes]:
    files = world(env).files
    return files.image(files.files_below(a["dir"]))


def _fs_undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    world(env).files.restore(before, d.meta)


def _db_undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    world(env).sql.restore(a["db"], before, d.meta)


def _web_before(env: TrialEnv, a: dict[str, Any]) -> dict[Identity, str | None]:
    web = world(env).web
    return {i: web.resources.get(i) for i in web.below(a["url"])}


def _web_undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    world(env).web.restore(before, d.meta)


def _tool(name: str, effect: EffectClass | None, reads: Any, writes: Any,
          run: Callable[[TrialEnv, dict[str, Any], Delivery], Any],
          before: Any = None, undo: Any = None) -> ToolDef:
    # Every write here is a blind overwrite: applying it twice leaves the same state.
    return ToolDef(name, effect, reads, writes, run, before, undo, idempotent=effect is B)


B = EffectClass.BUFFERABLE
TOOLS: dict[str, ToolDef] = {
    t.name: t
    for t in (
        _tool("workspace_root", None, _none, _none, lambda env, a, d: str(world(env).files.root)),
        _tool("review", None, _none, _none, lambda env, a, d: None),
        _tool("fs_read", None, _fs_scope, _none, lambda env, a, d: world(env).files.read(a["path"], d.meta)),
        _tool("fs_write", B, _none, _fs_scope,
              lambda env, a, d: world(env).files.write(a["path"], a["text"], d.meta), _fs_before, _fs_undo),
        _tool("fs_write_tree", B, _none, _tree_scope,
              lambda env, a, d: world(env).files.write_tree(a["dir"], a["text"], d.meta), _tree_before, _fs_undo),
        _tool("db_read", None, _row_scope, _none,
              lambda env, a, d: world(env).sql.read_row(a["db"], a["table"], a["key"], a["by"], d.meta)),
        _tool("db_update", B, _none, _row_scope,
              lambda env, a, d: world(env).sql.update_row(a["db"], a["table"], a["key"], a["note"], a["by"], d.meta),
              lambda env, a: world(env).sql.notes(a["db"], a["table"]), _db_undo),
        _tool("db_update_table", B, _none, _table_scope,
              lambda env, a, d: world(env).sql.update_table(a["db"], a["table"], a["note"], d.meta),
              lambda env, a: world(env).sql.notes(a["db"], a["table"]), _db_undo),
        _tool("db_update_database", B, _none, _database_scope,
              lambda env, a, d: world(env).sql.update_database(a["db"], a["note"], d.meta),
              lambda env, a: world(env).sql.notes(a["db"]), _db_undo),
        _tool("http_get", None, _url_scope, _none, lambda env, a, d: world(env).web.get(a["url"], d.meta)),
        _tool("http_put", B, _none, _url_scope,
              lambda env, a, d: world(env).web.put(a["url"], a["body"], d.meta), _web_before, _web_undo),
        _tool("http_put_collection", B, _none, _url_scope,
              lambda env, a, d: world(env).web.put_collection(a["url"], a["body"], d.meta),
              _web_before, _web_undo),
        _tool("send_mail", EffectClass.IRREVERSIBLE, _none, _mail_scope,
              lambda env, a, d: env.mailbox.send(a["to"], a["subject"], a["body"], key=d.key, meta=d.meta)),
    )
}


# --------------------------------------------------------------------------- judging


def touched(env: TrialEnv) -> dict[str, set[tuple[str, Identity]]]:
    """Per agent: (read|write, identity) of every real resource its calls touched, from the
    substrates' own records (the touch log; the mailbox sink's file for mail)."""
    out: dict[str, set[tuple[str, Identity]]] = {}
    for t in world(env).touches.touches:
        out.setdefault(t.agent, set()).add((t.kind, t.identity))
    for message in env.messages():
        agent = str((message.get("meta") or {}).get("agent", "?"))
        out.setdefault(agent, set()).add(("write", ("mailbox", message["to"])))
    return out


def should_conflict(touches: Mapping[str, set[tuple[str, Identity]]], a: str = "a0", b: str = "a1") -> bool:
    """The ground truth: both agents touched one real resource, at least one writing it."""
    mine, theirs = touches.get(a, set()), touches.get(b, set())
    return any(
        ident == other and "write" in (kind, other_kind)
        for kind, ident in mine
        for other_kind, other in theirs
    )


def alias_metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
    """Table 20's per-trial measures (see the module docstring)."""
    by = {o.agent: o for o in outcomes}
    first, second = by["a0"], by["a1"]
    truth = should_conflict(touched(env))
    waited = second.blocked_ms > 0
    # A mode may also order the two by aborting one as stale (a late access) and retrying it.
    stale = any(AbortSource.STALE_READ.value in o.aborts for o in outcomes)
    detected = waited or stale
    return {
        "should_conflict": truth,
        "conflict_detected": detected,
        "waited": waited,
        "stale_abort": stale,
        "serialised": second.finished_at_ms >= first.finished_at_ms,
        "missed_conflict": truth and not detected,
        "false_conflict": detected and not truth,
        "both_committed": first.committed and second.committed,
    }


def _steps(op: Op, agent: str) -> list[Step]:
    if not op.absolute:
        return [Step(op.tool, dict(op.args))]
    args = dict(op.args)
    root_key = f"{agent}_root"
    return [
        Step("workspace_root", {}, save_as=root_key),
        Step(op.tool, lambda m, args=args, k=root_key: {**args, "path": os.path.join(m[k], args["path"])}),
    ]


class AliasingParams(WorkloadParams):
    """`params` of the aliasing workload: which part of the catalogue a cell runs."""

    substrate: Substrate = "files"
    pair: Pair = "alias"


class AliasingWorkload:
    """Paper Table 20: two agents on one substrate, one resource in two spellings (or two
    look-alike resources); did the mode order them, and should it have."""

    name = "aliasing"
    probes_mechanism = True  # its verdict does not depend on the agent's task
    description = "two agents touch one resource in two spellings (or two look-alikes) on files, SQLite, URLs or mail"
    tools = TOOLS
    Params = AliasingParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = AliasingParams.model_validate(params)
        cases = CATALOGUE[p.substrate][p.pair]
        case = cases[trial % len(cases)]
        first = Task(f"{case.name}-a", (*_steps(case.a, "a0"), *[Step("review", {})] * REVIEWS))
        second = Task(f"{case.name}-b", tuple(_steps(case.b, "a1")))
        return Scenario(
            tasks=[first, second],
            setup=setup,
            policy=AgentPolicy(step_retries=0, plan_delay_ms=(10.0, 10.0)),
            start_offsets_ms=[0.0, SECOND_START_MS],
            metrics=alias_metrics,
            final=lambda env: {"case": case.name, "what": case.what},
            info={"case": case.name},
        )

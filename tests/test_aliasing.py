"""Paper Table 20: the aliasing workload's ground truth, and what each scope strategy does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from atomix.adapters import OpLog
from atomix.scope_parsing import CANONICAL, NAIVE
from harness.experiment.trial import TrialSpec, run_trial
from harness.modes.registry import get_mode
from harness.modes.tx_flat_scopes import FLAT_CANONICAL
from harness.workloads.aliasing import CATALOGUE, TOOLS, Case, setup, world
from harness.workloads.aliasing_substrates import AuditedSQLite, OsFiles, TouchLog, route
from harness.world.substrates import TrialEnv

SUBSTRATES = ("files", "sqlite", "url", "mailbox")
PAIRS = ("alias", "distinct")
MODES = ("tx-full", "tx-naive-string-scopes", "tx-global-frontier", "tx-fine-no-overlap")
# The alias cases where one side names a container of the other.
CONTAINERS = {"f-tree", "s-table-row", "s-db-row", "u-collection"}


def _run(mode: str, substrate: str, pair: str, trial: int) -> dict[str, Any]:
    params = {"substrate": substrate, "pair": pair}
    spec = TrialSpec("t20", "aliasing", mode, f"{substrate}-{pair}", params, trial, 20, params=params)
    return run_trial(spec)


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], dict[str, Any]]:
    """(mode, case name) -> metrics, every case of the catalogue under every strategy."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for mode in MODES:
        for substrate in SUBSTRATES:
            for pair in PAIRS:
                for i in range(len(CATALOGUE[substrate][pair])):
                    record = _run(mode, substrate, pair, i)
                    out[(mode, record["final"]["case"])] = record["metrics"]
    return out


def _cases(pair: str) -> list[Case]:
    return [c for s in SUBSTRATES for c in CATALOGUE[s][pair]]


def test_catalogue_has_seven_cases_per_substrate_and_pair() -> None:
    assert all(len(CATALOGUE[s][p]) == 7 for s in SUBSTRATES for p in PAIRS)
    names = [c.name for p in PAIRS for c in _cases(p)]
    assert len(names) == len(set(names)) == 56


def test_ground_truth_matches_the_design_in_every_mode(results: dict[tuple[str, str], Any]) -> None:
    # The substrates say alias cases touch one resource and distinct ones do not, whatever
    # the mode did; and both agents always commit, so each case was fully exercised.
    for pair, expected in (("alias", True), ("distinct", False)):
        for case in _cases(pair):
            for mode in MODES:
                m = results[(mode, case.name)]
                assert m["should_conflict"] is expected, (mode, case.name)
                assert m["both_committed"], (mode, case.name)


def test_waiting_and_settling_order_agree(results: dict[tuple[str, str], Any]) -> None:
    # The second agent waited exactly when it settled after the first.
    for (mode, name), m in results.items():
        assert m["waited"] == m["serialised"], (mode, name)


def _missed(results: dict[tuple[str, str], Any], mode: str) -> set[str]:
    return {c.name for c in _cases("alias") if results[(mode, c.name)]["missed_conflict"]}


def _false(results: dict[tuple[str, str], Any], mode: str) -> set[str]:
    return {c.name for c in _cases("distinct") if results[(mode, c.name)]["false_conflict"]}


def test_canonical_scopes_miss_nothing_and_invent_nothing(results: dict[tuple[str, str], Any]) -> None:
    assert _missed(results, "tx-full") == set()
    assert _false(results, "tx-full") == set()


def test_coarse_global_orders_every_pair(results: dict[tuple[str, str], Any]) -> None:
    assert _missed(results, "tx-global-frontier") == set()
    assert _false(results, "tx-global-frontier") == {c.name for c in _cases("distinct")}


def test_fine_without_overlap_misses_exactly_the_container_cases(results: dict[tuple[str, str], Any]) -> None:
    assert _missed(results, "tx-fine-no-overlap") == CONTAINERS
    assert _false(results, "tx-fine-no-overlap") == set()


def _texts(case: Case) -> tuple[list[str], list[str]]:
    """The scope texts the shims render for the two sides of a case, in a fresh trial env."""
    env = TrialEnv.create()
    try:
        setup(env)
        out = []
        for op in (case.a, case.b):
            args = dict(op.args)
            if op.absolute:
                args["path"] = os.path.join(world(env).files.root, args["path"])
            tool = TOOLS[op.tool]
            out.append(tool.reads(env, args) + tool.writes(env, args))
        return out[0], out[1]
    finally:
        env.close()


def test_naive_strings_miss_exactly_the_cases_spelt_differently(results: dict[tuple[str, str], Any]) -> None:
    differently = {c.name for c in _cases("alias") if len(set(map(tuple, _texts(c)))) == 2}
    assert _missed(results, "tx-naive-string-scopes") == differently
    assert len(differently) == 26  # all but relative-vs-absolute path and rowid-vs-key
    assert _false(results, "tx-naive-string-scopes") == set()


def test_trials_are_reproducible() -> None:
    assert _run("tx-full", "url", "alias", 6)["metrics"] == _run("tx-full", "url", "alias", 6)["metrics"]


# --------------------------------------------------------------------------- the policies


def test_flat_policy_canonicalises_but_has_no_hierarchy() -> None:
    flat = FLAT_CANONICAL
    assert flat.resolve("https://API.example:443/a/./b/") == flat.resolve("https://api.example/a/b")
    assert flat.resolve("mail: Bob@Example.COM") == flat.resolve("mail:bob@example.com")
    directory, file = flat.resolve("fs:/srv/docs"), flat.resolve("fs:/srv/docs/a.txt")
    assert not directory.overlaps(file)
    assert CANONICAL.resolve("fs:/srv/docs").overlaps(CANONICAL.resolve("fs:/srv/docs/a.txt"))
    assert flat.resolve(file) == file  # resolving a resolved scope is a no-op
    assert NAIVE.resolve("mail:Bob@x.org") != NAIVE.resolve("mail:bob@x.org")


def test_fine_no_overlap_is_a_registered_ablation() -> None:
    info = get_mode("tx-fine-no-overlap")
    assert info.family == "ablation"


# --------------------------------------------------------------------------- ground truth


def test_the_kernel_resolves_aliases_to_one_inode(tmp_path: Path) -> None:
    touches = TouchLog()
    files = OsFiles(tmp_path / "site", touches, OpLog())
    (files.root / "docs").mkdir(parents=True)
    (files.root / "docs" / "report.txt").write_text("x")
    (files.root / "docs" / "Report.txt").write_text("y")
    os.symlink("docs", files.root / "current")
    meta = {"agent": "a0", "attempt": 1}
    for path in ("docs/report.txt", "current/../docs/./report.txt", "current/report.txt", "docs/Report.txt"):
        files.write(path, "z", meta)
    ids = [t.identity for t in touches.touches]
    assert ids[0] == ids[1] == ids[2] != ids[3]  # case-sensitive file system: two files


def test_sqlite_itself_folds_table_names_but_not_text_keys(tmp_path: Path) -> None:
    touches = TouchLog()
    sql = AuditedSQLite(tmp_path, touches, OpLog())
    sql.create("shop.db", {"orders": ("INTEGER", range(1, 9)), "tags": ("TEXT", ("Red", "red"))})
    meta = {"agent": "a0", "attempt": 1}
    sql.update_row("shop.db", "ORDERS", 7, "n", "key", meta)
    sql.update_row("shop.db", "orders", "7", "n", "key", meta)  # INTEGER affinity: row 7
    sql.update_row("shop.db", "orders", 7, "n", "rowid", meta)
    sql.update_row("shop.db", "tags", "Red", "n", "key", meta)
    sql.update_row("shop.db", "tags", "red", "n", "key", meta)
    ids = [t.identity for t in touches.touches]
    assert ids[0] == ids[1] == ids[2]
    assert ids[3] != ids[4]
    assert sql.read_row("shop.db", "Orders", 7, "key", meta) == "n"
    assert touches.touches[-1].identity == ids[0]  # the authorizer names the stored table


def test_web_router() -> None:
    item = route("https://api.shop.example/v1/items/7")
    for alias in ("HTTPS://API.Shop.Example:443/v1/items/7/", "https://api.shop.example/v1/./x/../items/7",
                  "https://api.shop.example/v1/%69tems/7"):
        assert route(alias) == item
    for other in ("https://api.shop.example/v1/Items/7", "http://api.shop.example/v1/items/7",
                  "https://api.shop.example:8443/v1/items/7", "https://api.shop.example/v1/items/77"):
        assert route(other) != item
    assert route("https://h.example/p?b=2&a=1") == route("https://h.example/p?a=1&b=2")

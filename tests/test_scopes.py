"""Tests of atomix.scopes: canonicalisation on real files and URLs, and the overlap order."""

from __future__ import annotations

import os
import pickle
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import atomix
from atomix.errors import ScopeError
from atomix.scope_kinds import fs_scope, naive_scope, named_scope, sqlite_scope, url_scope
from atomix.scope_parsing import CANONICAL, NAIVE, ScopePolicy, parse_scope
from atomix.scopes import Scope

_PACKAGE_ROOT = str(Path(atomix.__file__).resolve().parents[1])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # tmp_path may itself sit below a symlink (macOS /tmp); compare against its real path.
    return Path(os.path.realpath(tmp_path))


def make_db(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("INSERT INTO orders VALUES (42, 9.5)")
    conn.close()
    return path


# --------------------------------------------------------------------------- fs


def test_fs_dots_double_and_trailing_slashes(root: Path) -> None:
    (root / "repo" / "src").mkdir(parents=True)
    (root / "repo" / "src" / "app.py").write_text("x")
    want = fs_scope(root / "repo" / "src" / "app.py")
    assert str(want) == f"fs:{root}/repo/src/app.py"
    for alias in (
        f"{root}/repo/./src/../src/app.py",
        f"{root}//repo///src/app.py",
        f"{root}/repo/src/app.py/",
        f"{root}/repo/src/./app.py//",
    ):
        assert fs_scope(alias) == want, alias
        assert parse_scope(alias) == want
        assert parse_scope("fs:" + alias) == want


def test_fs_root_and_parts() -> None:
    assert str(fs_scope("/")) == "fs:/"
    assert fs_scope("//").parts == ()
    assert fs_scope("/..") == fs_scope("/")
    assert fs_scope("/").parent() is None
    assert fs_scope("/a/b", resolve_symlinks=False).parts == ("a", "b")


def test_fs_directory_covers_its_files(root: Path) -> None:
    repo = fs_scope(root / "repo")
    app = fs_scope(root / "repo" / "src" / "app.py")
    assert repo.covers(app) and not app.covers(repo)
    assert repo.overlaps(app) and app.overlaps(repo)
    assert app.parent() == fs_scope(root / "repo" / "src")
    sibling = fs_scope(root / "repository")
    assert not repo.overlaps(sibling)  # component-wise, not a string prefix


def test_fs_symlink_to_file_is_the_file(root: Path) -> None:
    target = root / "app.py"
    target.write_text("x")
    link = root / "link.py"
    link.symlink_to(target)
    assert fs_scope(link) == fs_scope(target)
    assert parse_scope(str(link)) == fs_scope(target)
    # Without resolution the link is its own name.
    assert fs_scope(link, resolve_symlinks=False) != fs_scope(target)


def test_fs_symlinked_directory(root: Path) -> None:
    real = root / "real"
    real.mkdir()
    (real / "a.txt").write_text("x")
    (root / "alias").symlink_to(real, target_is_directory=True)
    assert fs_scope(root / "alias" / "a.txt") == fs_scope(real / "a.txt")
    # A file that does not exist yet still resolves through the linked directory.
    assert fs_scope(root / "alias" / "new.txt") == fs_scope(real / "new.txt")
    assert fs_scope(root / "alias").covers(fs_scope(real / "new.txt"))
    # '..' is applied after the link is followed, unlike a lexical normpath.
    (real / "sub").mkdir()
    (root / "deep").symlink_to(real / "sub", target_is_directory=True)
    assert fs_scope(f"{root}/deep/../a.txt") == fs_scope(real / "a.txt")


def test_fs_casefold(root: Path) -> None:
    upper = f"{root}/REPO/Src/App.py"
    lower = f"{root}/repo/src/app.py"
    assert fs_scope(upper) != fs_scope(lower)
    assert fs_scope(upper, casefold=True) == fs_scope(lower, casefold=True)
    assert parse_scope(upper, casefold=True) == parse_scope(lower, casefold=True)
    assert parse_scope(upper) != parse_scope(lower)
    assert ScopePolicy(casefold=True).resolve(upper) == ScopePolicy(casefold=True).resolve(lower)


@pytest.mark.parametrize("bad", ["repo/src", "./x", "~/x", "", Path("rel"), 3])
def test_fs_relative_rejected(bad: object) -> None:
    with pytest.raises(ScopeError) as info:
        fs_scope(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert repr(bad) in str(info.value)
    with pytest.raises(ScopeError, match="'fs:rel/x'"):
        parse_scope("fs:rel/x")


# --------------------------------------------------------------------------- sqlite


def test_sqlite_key_forms(root: Path) -> None:
    db = make_db(root / "shop.db")
    row = sqlite_scope(db, "orders", 42)
    assert str(row) == f"sqlite:{db}:orders:42"
    assert sqlite_scope(db, "orders", "42") == row
    assert sqlite_scope(db, "orders", 42.0) == row
    assert sqlite_scope(str(db), "orders", "042") != row  # leading zeros: a string key
    assert sqlite_scope(db, "orders", " 42 ") != row  # strings are taken as-is
    assert sqlite_scope(db, "orders", -0.0) == sqlite_scope(db, "orders", "-0")
    assert sqlite_scope(db, "orders", "-0") == sqlite_scope(db, "orders", 0)
    assert parse_scope(f"sqlite:{db}:orders:42") == row


def test_sqlite_table_covers_row_and_disjointness(root: Path) -> None:
    db = make_db(root / "shop.db")
    other_db = make_db(root / "other.db")
    table = sqlite_scope(db, "orders")
    row = sqlite_scope(db, "orders", 42)
    assert table.covers(row) and not row.covers(table)
    assert row.parent() == table
    assert not table.overlaps(sqlite_scope(db, "customers"))
    assert not sqlite_scope(db, "customers", 42).overlaps(row)
    assert not sqlite_scope(other_db, "orders", 42).overlaps(row)
    assert not sqlite_scope(db, "orders", 43).overlaps(row)
    whole = parse_scope(f"sqlite:{db}")
    assert table.parent() == whole and whole.covers(row) and whole.parent() is None


def test_sqlite_db_is_canonicalised(root: Path) -> None:
    db = make_db(root / "shop.db")
    (root / "link.db").symlink_to(db)
    row = sqlite_scope(db, "orders", 42)
    assert sqlite_scope(root / "link.db", "orders", 42) == row
    assert sqlite_scope(f"{root}/./x/../shop.db", "orders", "42") == row
    assert sqlite_scope(f"{root}/SHOP.db", "orders", casefold=True) == sqlite_scope(
        f"{root}/shop.db", "orders", casefold=True
    )


@pytest.mark.parametrize(
    ("table", "key", "named"),
    [
        ("orders", True, True),
        ("orders", False, False),
        ("orders", 1.5, 1.5),
        ("orders", float("nan"), "nan"),
        ("orders", float("inf"), "inf"),
        ("orders", "", "''"),
        ("orders", [1], "[1]"),
        ("", None, "''"),
        ("a:b", None, "'a:b'"),
        (" orders", None, "' orders'"),
    ],
)
def test_sqlite_rejects(root: Path, table: str, key: object, named: object) -> None:
    with pytest.raises(ScopeError) as info:
        sqlite_scope(root / "shop.db", table, key)
    assert isinstance(info.value, ValueError)
    assert str(named) in str(info.value)


def test_sqlite_rejects_relative_and_colon_db(root: Path) -> None:
    for db in ("shop.db", f"{root}/a:b.db"):
        with pytest.raises(ScopeError, match="shop.db|a:b.db"):
            sqlite_scope(db, "orders")


def test_sqlite_named_handles_are_not_files() -> None:
    handle = parse_scope("sqlite:orders:42")
    assert handle == Scope("sqlite", ("orders", "42"))
    assert parse_scope("sqlite:orders").covers(handle)
    with pytest.raises(ScopeError):
        named_scope("sqlite:/abs/shop.db:orders")


# --------------------------------------------------------------------------- URLs


def test_url_scheme_host_port_and_slash() -> None:
    want = url_scope("https://shop.example.com/cart")
    assert str(want) == "https://shop.example.com/cart"
    assert want.parts == ("https://shop.example.com", "cart")
    for alias in (
        "https://Shop.example.com:443/cart/",
        "HTTPS://SHOP.EXAMPLE.COM/cart",
        "https://shop.example.com//cart//",
        "https://shop.example.com/cart#top",
        "https://user:secret@shop.example.com/cart",
        "url:https://shop.example.com/cart",
    ):
        assert parse_scope(alias) == want, alias
    assert url_scope("http://x.org:80/") == url_scope("http://x.org")
    assert str(url_scope("http://x.org")) == "http://x.org/"
    assert url_scope("http://x.org:8080/a") != url_scope("http://x.org/a")
    assert url_scope("https://x.org:80/a") != url_scope("https://x.org/a")
    assert url_scope("http://x.org/a") != url_scope("https://x.org/a")
    assert url_scope("https://x.org/Cart") != url_scope("https://x.org/cart")  # paths keep case


def test_url_hierarchy() -> None:
    cart = url_scope("https://shop.example.com/cart")
    item = url_scope("https://shop.example.com/cart/42")
    assert cart.covers(item) and not item.covers(cart)
    assert item.parent() == cart
    assert url_scope("https://shop.example.com/").covers(item)
    assert url_scope("https://shop.example.com/").parent() is None
    assert not url_scope("https://shop.example.com/car").overlaps(item)
    assert not url_scope("https://other.example.com/cart").overlaps(item)


def test_url_query_fragment_and_dots() -> None:
    a = url_scope("https://x.org/s?b=2&a=1")
    assert str(a) == "https://x.org/s?a=1&b=2"
    assert a == url_scope("https://x.org/s/?a=1&b=2#frag")
    assert url_scope("https://x.org/s").covers(a)
    # Repeated names keep their relative order: a=1&a=2 is not a=2&a=1.
    assert str(url_scope("https://x.org/?z=0&a=2&a=1")) == "https://x.org/?a=2&a=1&z=0"
    assert url_scope("https://x.org/?a=2&a=1") != url_scope("https://x.org/?a=1&a=2")
    assert url_scope("https://x.org/s?") == url_scope("https://x.org/s")
    assert url_scope("https://x.org/a/./b/../c") == url_scope("https://x.org/a/c")
    assert url_scope("https://x.org/../../a") == url_scope("https://x.org/a")
    assert url_scope("https://x.org/a/%2E%2E/c") == url_scope("https://x.org/c")


def test_url_percent_encoding() -> None:
    # Unreserved escapes decode; reserved ones stay, with upper-case hex.
    assert url_scope("https://x.org/%7Euser/%61") == url_scope("https://x.org/~user/a")
    assert str(url_scope("https://x.org/a%2fb")) == "https://x.org/a%2Fb"
    assert url_scope("https://x.org/a%2Fb") != url_scope("https://x.org/a/b")
    assert url_scope("https://x.org/caf\u00e9") == url_scope("https://x.org/caf%C3%A9")
    assert url_scope("https://x.org/?q=a b") == url_scope("https://x.org/?q=a%20b")


@pytest.mark.parametrize(
    "bad",
    [
        "shop.example.com/cart",
        "https:///cart",
        "//shop.example.com/cart",
        "http://:80/x",
        "http://x.org:99999/",
        "http://[::1/",
    ],
)
def test_url_errors(bad: str) -> None:
    with pytest.raises(ScopeError) as info:
        url_scope(bad)
    assert isinstance(info.value, ValueError)
    assert repr(bad) in str(info.value)


# --------------------------------------------------------------------------- names


def test_named_hierarchy() -> None:
    order = named_scope("retail:order")
    w1 = named_scope("retail:order:#W1")
    assert str(parse_scope("retail:order:#W2378156")) == "retail:order:#W2378156"
    assert order.covers(w1) and w1.parent() == order and order.parent() is None
    assert not named_scope("retail:order:#W2").overlaps(w1)
    assert not named_scope("retail:orders").overlaps(w1)
    assert not named_scope("shop:order:#W1").overlaps(w1)
    assert named_scope(" Retail : order : #W1 ") == w1
    assert named_scope("mail:alice@example.com") == parse_scope("mail:alice@example.com")
    assert named_scope("retail:order:-0") == named_scope("retail:order:0")
    assert named_scope("retail:order:042") != named_scope("retail:order:42")


@pytest.mark.parametrize(
    "bad",
    ["retail:", "retail::x", ":x", "retail: :x", "fs:x", "raw:x", "url:x", "/a:b", "http://x.org"],
)
def test_named_errors(bad: str) -> None:
    with pytest.raises(ScopeError) as info:
        named_scope(bad)
    assert repr(bad) in str(info.value)


# --------------------------------------------------------------------------- naive and policy


def test_naive_scopes_do_not_merge_aliases() -> None:
    assert naive_scope("/repo/./a") != naive_scope("/repo/a")
    assert not naive_scope("/repo/./a").overlaps(naive_scope("/repo/a"))
    assert not naive_scope("/repo").overlaps(naive_scope("/repo/a"))  # no hierarchy either
    assert naive_scope("/repo/a").overlaps(naive_scope("/repo/a"))
    assert naive_scope(" x ").parts == (" x ",)
    assert str(naive_scope("/repo/./a")) == "/repo/./a"
    assert naive_scope("/repo/a").parent() is None


def test_policies() -> None:
    assert CANONICAL.resolve("/repo/./a") == CANONICAL.resolve("/repo/a") == fs_scope("/repo/a")
    assert NAIVE.resolve("/repo/./a") != NAIVE.resolve("/repo/a")
    assert NAIVE.resolve(fs_scope("/repo/a")) == naive_scope("fs:/repo/a")
    assert NAIVE.resolve(NAIVE.resolve("x:y")) == NAIVE.resolve("x:y")
    s = named_scope("retail:order:1")
    assert CANONICAL.resolve(s) is s
    assert parse_scope(s) is s
    with pytest.raises(AttributeError):
        CANONICAL.canonical = False  # type: ignore[misc]


def test_parse_dispatch(root: Path) -> None:
    assert parse_scope("/x/y").kind == "fs"
    assert parse_scope("FS:/x/y") == fs_scope("/x/y")
    assert parse_scope("fs: /x/y") == fs_scope("/x/y")
    assert parse_scope("http://x.org/a").kind == "url"
    assert parse_scope("ftp://x.org/a").kind == "url"
    assert parse_scope(" https://x.org/a ") == url_scope("https://x.org/a")
    assert parse_scope(f"sqlite:{root}/s.db:t:7") == sqlite_scope(root / "s.db", "t", 7)
    assert parse_scope(f"sqlite:{root}/s.db:t:a:b").parts[-1] == "a:b"  # keys may hold ':'
    assert parse_scope("mail:bob@x.org").kind == "mail"


@pytest.mark.parametrize(
    "bad", ["", "   ", "plain", 42, None, b"/x", "sqlite:/x.db:", "retail:a::b"]
)
def test_parse_errors_name_the_input(bad: object) -> None:
    with pytest.raises(ScopeError) as info:
        parse_scope(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert repr(bad) in str(info.value)


def test_scope_constructor_validates() -> None:
    for kind, parts in [
        ("Retail", ("a",)),
        ("", ("a",)),
        ("retail", ()),
        ("retail", ("a:b",)),
        ("retail", (" a",)),
        ("retail", ("",)),
        ("fs", ("a/b",)),
        ("fs", ("..",)),
        ("raw", ("a", "b")),
        ("url", ("x.org",)),
        ("retail", "ab"),
    ]:
        with pytest.raises(ScopeError):
            Scope(kind, parts)  # type: ignore[arg-type]
    assert Scope("retail", ["a", "b"]).parts == ("a", "b")  # type: ignore[arg-type]


def test_pickle_rehashes_in_another_process() -> None:
    # str hashes differ between processes; a cached hash must not travel with the pickle.
    s = named_scope("retail:order:1")
    code = (
        "import pickle, sys\n"
        "from atomix.scope_kinds import named_scope\n"
        "s = pickle.loads(sys.stdin.buffer.read())\n"
        "assert {named_scope('retail:order:1'): 1}[s] == 1\n"
        "assert hash(s) == hash(named_scope('retail:order:1'))\n"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": _PACKAGE_ROOT}
        done = subprocess.run(
            [sys.executable, "-c", code], input=pickle.dumps(s), env=env, capture_output=True
        )
        assert done.returncode == 0, done.stderr.decode()


def test_scope_value_semantics() -> None:
    s = named_scope("retail:order:1")
    assert s.key == ("retail", "order", "1")
    assert {s, named_scope("retail:order:1")} == {s}
    assert pickle.loads(pickle.dumps(s)) == s
    assert str(pickle.loads(pickle.dumps(s))) == str(s)
    assert sorted([named_scope("b:x"), named_scope("a:y")])[0] == named_scope("a:y")
    with pytest.raises(AttributeError):
        s.kind = "mail"  # type: ignore[misc]


# --------------------------------------------------------------------------- properties

_KINDS = st.sampled_from(["fs", "retail", "mail"])
_SMALL_PARTS = st.lists(st.sampled_from(["a", "b", "c"]), max_size=4).map(tuple)


@st.composite
def small_scopes(draw: st.DrawFn) -> Scope:
    kind = draw(_KINDS)
    parts = draw(_SMALL_PARTS)
    if kind != "fs" and not parts:
        parts = ("a",)
    return Scope(kind, parts)


@given(small_scopes(), small_scopes(), small_scopes())
def test_covers_is_a_partial_order_and_overlap_symmetric(a: Scope, b: Scope, c: Scope) -> None:
    assert a.covers(a)
    if a.covers(b) and b.covers(a):
        assert a == b
    if a.covers(b) and b.covers(c):
        assert a.covers(c)
    assert a.overlaps(b) == b.overlaps(a)
    assert a.overlaps(b) == (a.covers(b) or b.covers(a))
    prefix = a.kind == b.kind and b.parts[: len(a.parts)] == a.parts
    assert a.covers(b) == prefix
    assert a.key == (a.kind, *a.parts)
    parent = a.parent()
    if parent is not None:
        assert parent.covers(a) and not a.covers(parent)


_SEGMENT = st.text(min_size=1, max_size=8).filter(lambda s: "/" not in s and "\x00" not in s)
_NAME_PART = st.text(min_size=1, max_size=8).filter(lambda s: ":" not in s and s.strip() == s)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.lists(_SEGMENT, max_size=5), casefold=st.booleans())
def test_fs_round_trip(root: Path, segments: list[str], casefold: bool) -> None:
    # Below a real, empty directory no generated component can be a symlink.
    s = fs_scope(os.path.join(root, *segments), casefold=casefold)
    assert parse_scope(str(s)) == s
    assert str(parse_scope(str(s))) == str(s)


@given(
    kind=st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True),
    parts=st.lists(_NAME_PART, min_size=1, max_size=4),
)
def test_named_round_trip(kind: str, parts: list[str]) -> None:
    if kind in {"fs", "url", "raw"}:
        kind = "k" + kind
    if kind == "sqlite" and parts[0].startswith("/"):
        parts[0] = "t" + parts[0]
    s = named_scope(kind + ":" + ":".join(parts))
    assert parse_scope(str(s)) == s


@given(
    scheme=st.sampled_from(["http", "https", "HTTP", "ftp"]),
    host=st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,8}(\.[a-z]{2,3})?", fullmatch=True),
    port=st.none() | st.integers(1, 65535),
    path=st.lists(st.text(max_size=6), max_size=4),
    query=st.lists(st.tuples(st.text(max_size=4), st.text(max_size=4)), max_size=3),
)
def test_url_round_trip(
    scheme: str, host: str, port: int | None, path: list[str], query: list[tuple[str, str]]
) -> None:
    text = (
        f"{scheme}://{host}"
        + (f":{port}" if port else "")
        + "/"
        + "/".join(p.replace("/", "").replace("?", "").replace("#", "") for p in path)
    )
    pairs = [
        (k.translate(str.maketrans("", "", "&=#")), v.translate(str.maketrans("", "", "&#")))
        for k, v in query
    ]
    if pairs:
        text += "?" + "&".join(f"{k}={v}" for k, v in pairs)
    s = url_scope(text)
    assert parse_scope(str(s)) == s
    assert url_scope(str(s)) == s
    assert s.parts[0] == s.parts[0].lower()


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    table=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
    key=st.none()
    | st.integers()
    | st.text(min_size=1, max_size=8).filter(lambda s: "\x00" not in s),
)
def test_sqlite_round_trip(root: Path, table: str, key: int | str | None) -> None:
    s = sqlite_scope(root / "shop.db", table, key)
    assert parse_scope(str(s)) == s
    if isinstance(key, int):
        assert sqlite_scope(root / "shop.db", table, str(key)) == s

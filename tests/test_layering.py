"""The import rules of docs/design.md ("Wings"), read from the source with `ast`.

Every import counts, including those inside functions (a lazy import is still a dependency)
and those only for type checking. A string naming a module (a registry row such as
"baselines.saga:SagaTrial") is not an import: that is how the one registry of each kind
reaches up to the modules it lists without them importing it back.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Harness wings from the bottom up; a module may import its own wing and the ones below.
WINGS: tuple[tuple[str, ...], ...] = (
    ("harness.errors", "harness.registry", "harness.collector"),
    ("harness.world",),
    ("harness.modes", "baselines"),
    ("harness.agents",),
    ("harness.workloads",),
    ("harness.experiment",),
    ("harness.analysis",),
    ("harness.view",),
    ("harness.paper", "harness.bench"),
    ("harness.cli", "cli"),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found = {_module_name(p): p for pkg in ("atomix", "harness", "baselines") for p in (ROOT / pkg).rglob("*.py")}
    found["cli"] = ROOT / "cli.py"
    return found


SOURCES = _sources()


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, resolved to a project module
    where the name is one (`from harness.world import faults` imports harness.world.faults)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in SOURCES else target), node.lineno


def _project(name: str) -> str | None:
    """The project module `name` is, or is inside (a package's parent for `a.b.c` of a.b)."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in SOURCES}
    for module, path in SOURCES.items():
        for target, _ in _imports(module, path):
            dep = _project(target)
            if dep is not None and dep != module and not module.startswith(dep + "."):
                graph[module].add(dep)
    return graph


def _wing(module: str) -> int | None:
    for level, prefixes in enumerate(WINGS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None


def test_every_harness_module_belongs_to_a_wing() -> None:
    loose = [m for m in SOURCES if m.startswith(("harness.", "baselines")) and _wing(m) is None]
    assert not loose, f"modules outside every wing (add them to a wing in docs/design.md): {loose}"


def test_no_import_runs_up_between_wings() -> None:
    upward = []
    for module, path in SOURCES.items():
        here = _wing(module)
        if here is None:
            continue
        for target, line in _imports(module, path):
            dep = _project(target)
            there = _wing(dep) if dep else None
            if there is not None and there > here:
                upward.append(f"{path.relative_to(ROOT)}:{line} {module} -> {dep}")
    assert not upward, "imports running up a wing:\n" + "\n".join(upward)


def test_the_runtime_never_imports_the_harness() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for module, path in SOURCES.items()
        if module.startswith("atomix")
        for target, line in _imports(module, path)
        if target.split(".")[0] in ("harness", "baselines", "cli")
    ]
    assert not bad, bad


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, f"import circles: {cycles}"


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ],
)
def test_the_circle_finder_finds_circles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert _cycles(graph) == expected


def test_a_lazy_upward_import_is_caught(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"  # read as if it were harness/world/probe.py
    probe.write_text("def f():\n    from harness.experiment import runner\n", encoding="utf-8")
    assert ("harness.experiment.runner", 2) in list(_imports("harness.world.probe", probe))
    assert _wing("harness.experiment.runner") == 5 and _wing("harness.world.probe") == 1

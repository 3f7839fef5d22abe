"""Mechanisms see only what a real system sees (docs/design.md, "What a mode may see").

Written from the design, not from the code: no settlement mechanism and no agent may read
the fault injector, its records or the class of an injected fault. Only the oracle and the
tables do. A mode that branched on F1 vs F2 would know whether a failed call landed, an
advantage no real mechanism has.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from harness.modes.registry import MODES

FORBIDDEN_NAMES = {"FaultClass", "FaultInjector", "InjectedFault", "FAULTS", "FaultSpec"}
FORBIDDEN_ATTRS = {"injector", "_injector", "injected", "fault"}
AGENT_MODULES = ("harness.agents.task", "harness.agents.policies")
# Every module the mode table names, plus the lock manager the locking baselines share.
MODE_MODULES = sorted({e.module for e in MODES.entries()} | {"harness.modes.locks", "harness.modes.base"})


def _source(module: str) -> tuple[Path, ast.AST]:
    path = Path(importlib.import_module(module).__file__ or "")
    return path, ast.parse(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("module", [*MODE_MODULES, *AGENT_MODULES])
def test_no_mechanism_or_agent_reads_the_fault_class(module: str) -> None:
    try:
        path, tree = _source(module)
    except ModuleNotFoundError:
        pytest.skip(f"{module} does not exist")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{path.name}:{node.lineno} name {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS | FORBIDDEN_NAMES:
            found.append(f"{path.name}:{node.lineno} attribute .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "harness.world.faults":
            names = {alias.name for alias in node.names} & FORBIDDEN_NAMES
            if names:
                found.append(f"{path.name}:{node.lineno} imports {sorted(names)}")
    assert not found, "a mechanism reads what only the oracle may know: " + "; ".join(found)

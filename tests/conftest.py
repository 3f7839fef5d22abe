"""Fixtures shared by the test files; the plain helpers they use are in tests/support.py
(imported by test files as `from support import ...`, like langgraph_world.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from runtime_world import World
from support import ROOT, start_cli, stop

# Property tests judge properties, not speed: Hypothesis's per-example deadline (200 ms by
# default) and its too-slow health check measure wall time, which a loaded machine stretches.
# (A test's own @settings still apply; they replace these where they name the same option.)
settings.register_profile("atomix", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("atomix")


@pytest.fixture()
def repo_root() -> Path:
    """The repository's root (where `python -m cli` runs and configs/ lives)."""
    return ROOT


@pytest.fixture()
def results_dir(tmp_path: Path) -> Path:
    """A fresh results directory (`--out`) for this test; not created, so a test can check
    that a command wrote nothing."""
    return tmp_path / "results"


@pytest.fixture()
def atomix_cli() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `python -m cli ARGS` as a child process (SIGINT/SIGTERM at their default action
    whatever this process inherited, stdout/stderr piped, text): `atomix_cli(*args,
    new_session=False)`. Whatever a test leaves running (a failed assertion between start and
    wait, a process left frozen) is killed, with its process group if it has its own session,
    when the test ends."""
    started: list[tuple[subprocess.Popen[str], bool]] = []

    def start(*args: Any, new_session: bool = False) -> subprocess.Popen[str]:
        proc = start_cli(*args, new_session=new_session)
        started.append((proc, new_session))
        return proc

    yield start
    for proc, group in started:
        stop(proc, group=group)


@pytest.fixture
def w() -> World:
    """A fresh runtime with one tool of each effect class over in-memory state (World, in
    tests/runtime_world.py), for the test_runtime_*.py files."""
    return World()


@pytest.fixture
def rig() -> Iterator[Any]:
    """`rig(mode, task_id, injector=None, *, agent, behaviour, policy, steps, validate)`: run one
    tau2 retail task through `run_agent` on a hand-made rig and return its `Run` (outcome,
    environment, injector, the calls that reached the DB), for the test_policies_*.py files;
    the trial environments are closed when the test ends. See tests/policy_rig.py."""
    from policy_rig import rig_runs  # imported here: it loads the retail data, which few tests need

    yield from rig_runs()

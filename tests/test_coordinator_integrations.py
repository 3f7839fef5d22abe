"""The integrations take a runtime built on a coordinator, unchanged: two processes, each its
own `Runtime(coordinator=...)` driving LangGraph's ToolNode or the OpenAI integration, bump
one counter file; they conflict on its scope and no update is lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from coordinator_support import configs, pg_fixture, spawn, url_fixture, wait_all  # noqa: F401


@pytest.mark.parametrize("workload", ["langgraph", "openai"])
def test_two_processes_through_an_integration_lose_no_update(
    url: str, tmp_path: Path, workload: str
) -> None:
    pytest.importorskip("langgraph" if workload == "langgraph" else "openai")
    per = 12
    children = spawn(configs(url, tmp_path, 2, workload=workload, commits=per), tmp_path / "go")
    (tmp_path / "go").touch()
    results = wait_all(children, 600)
    assert all(r is not None and r["committed"] == per for r in results), results
    counter = tmp_path / "data" / "files" / "counter.txt"
    assert int(counter.read_text()) == 2 * per  # every committed bump once, none lost

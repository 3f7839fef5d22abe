"""`atomix --version` and `--help` stay fast because they import nothing heavy. Checked by
what is imported, not by timing: the time itself is measured by hand (about 0.15-0.2 s)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# (typer itself imports pydantic to render a command's help, so it is not on the list.)
HEAVY = ("scipy", "matplotlib", "pandas", "numpy", "harness.experiment.config", "harness.analysis.runs", "atomix.runtime")

_PROBE = """
import sys
sys.argv = ["atomix", *{args!r}]
import cli
try:
    cli.app()
except SystemExit:
    pass
heavy = {heavy!r}
print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy)))
"""


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["run", "--help"]])
def test_start_up_imports_no_heavy_module(args: list[str]) -> None:
    probe = _PROBE.format(args=args, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout

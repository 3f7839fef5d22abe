"""The README's example and set-up commands stay true."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_readme_examples_run() -> None:
    """Every python block is self-contained and runs as written."""
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 3, "the README lost its examples"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102


def test_the_readme_has_exactly_two_setup_commands() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert len(commands) == 2
    assert "atomix run configs/tau_retail.yaml" in commands[0]
    assert "pytest" in commands[1] and "'.[test]'" in commands[1]


def _command_lines() -> list[str]:
    block = README.split("## The command line", 1)[1]
    (commands,) = re.findall(r"```bash\n(.*?)```", block.split("\n## ", 1)[0], re.S)
    return [line.split("  #", 1)[0].strip() for line in commands.splitlines() if line.strip()]


def test_every_command_line_of_the_readme_runs_as_written(tmp_path: Path) -> None:
    """The command-line block, line by line, in a fresh directory holding the configs (so
    `results/` starts empty): each exits 0."""
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "configs", tmp_path / "configs")
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    lines = _command_lines()
    assert len(lines) >= 8 and all(line.split()[0] in ("atomix", "python") for line in lines)
    for line in lines:
        argv = line.split()
        if argv[0] == "python":
            argv[0] = sys.executable
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"

"""Bad input to the harness, the cases chosen from what a user may write (not from the code):
every case exits with a clear one-line error naming the file, never a traceback, and loses
nothing."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import HANG_S, ROOT

TINY = {
    "name": "tiny",
    "description": "bad-input checks",
    "workload": "synthetic",
    "seed": 3,
    "trials": 2,
    "modes": ["tx-full", "no-tx"],
    "faults": {"classes": ["F1"]},
    "grid": {"faults.rate": [0.0, 0.2]},
}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def atomix(*args: object, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`atomix ARGS` as a process; it must be done within `timeout` seconds of CPU time (its
    own work, which a loaded machine does not stretch, unlike wall time; a wait that hangs
    is stopped after HANG_S seconds of wall time)."""
    cpu = _children_cpu_s()
    done = subprocess.run(
        [sys.executable, "-c", "import cli; cli.app()", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=max(timeout, HANG_S),
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    cpu = _children_cpu_s() - cpu
    assert cpu < timeout, f"atomix {' '.join(map(str, args))}: {cpu:.1f} s of CPU time"
    return done


def _tiny_text(**changes: object) -> str:
    return yaml.safe_dump({**TINY, **changes}, sort_keys=False)


ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]" for i in range(8)]
    + ["name: bomb", "workload: synthetic", "modes: [tx-full]"]
)

BAD = {
    "not utf-8": b"name: caf\xe9\nworkload: synthetic\nmodes: [tx-full]\n",
    "alias bomb": ALIAS_BOMB.encode(),
    "self reference": b"name: loop\nworkload: synthetic\nmodes: &m [tx-full, *m]\n",
    "deep nesting": ("name: deep\nworkload: synthetic\nmodes: [tx-full]\nparams: " + "[" * 5000 + "]" * 5000 + "\n").encode(),
    "duplicate key": (_tiny_text() + "seed: 4\n").encode(),
    "name leaves --out": _tiny_text(name="..").encode(),
    "name with a slash": _tiny_text(name="a/../../b").encode(),
    "huge grid": _tiny_text(grid={"faults.rate": [i / 1e6 for i in range(3000)], "seed": list(range(5000))}).encode(),
    "wrong type in a workload param": _tiny_text(params={"agents": "many"}).encode(),
    "overflowing number": _tiny_text(params={"veto_rate": 10**400}).encode(),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_configs_are_refused_with_exit_2_and_the_file_named(tmp_path: Path, case: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(BAD[case])
    done = atomix("validate", path, timeout=30)
    output = done.stdout + done.stderr
    assert done.returncode == 2, (case, output[-2000:])
    assert "Traceback" not in output, (case, output[-2000:])
    assert "bad.yaml" in output, (case, output[-500:])


def test_a_name_can_never_write_outside_out(tmp_path: Path) -> None:
    path = tmp_path / "escape.yaml"
    path.write_text(_tiny_text(name=".."), encoding="utf-8")
    out = tmp_path / "deep" / "out"
    done = atomix("run", path, "--out", out, "--jobs", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["escape.yaml"]  # nothing written


def test_a_broken_file_in_configs_does_not_break_list(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "good.yaml").write_text(_tiny_text(), encoding="utf-8")
    (configs / "broken.yaml").write_bytes(BAD["not utf-8"])
    done = atomix("list", "configs", "--configs", configs)
    assert "Traceback" not in done.stdout + done.stderr
    assert "good" in done.stdout and "broken" in done.stdout

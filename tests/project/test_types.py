"""The type checker of `make lint` (mypy, [tool.mypy] in pyproject.toml): the packages that carry
the pipeline's events type-check, and an event built wrong in a copy of the tree fails them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rollstream", "stages", "trainer_bridge", "schemas")
MYPY = Path(sys.executable).parent / "mypy"


def mypy(root: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    # MYPYPATH first, so the tree under `root` is read, not the installed (editable) one.
    env = {**os.environ, "MYPYPATH": str(root)}
    return subprocess.run([str(MYPY), "--cache-dir", str(cache)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=240)


def test_the_event_packages_type_check(tmp_path: Path) -> None:
    result = mypy(ROOT, tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


@pytest.mark.parametrize(("module", "right", "wrong", "error"), [
    # An ending outside the closed set of terminations.
    ("stages/run.py", '"termination": "RUNNING",', '"termination": "FINISHED",',
     '"termination"'),
    # An episode with a key its record does not have.
    ("stages/init.py", '"sample_index": i,', '"sample": i,', 'Extra key "sample"'),
    # The bridge's sample read as something other than a ScoredTrajectory.
    ("trainer_bridge/groups.py", 'return self.scored["trajectory"]["episode_id"]',
     'return self.scored["episode_id"]', "ScoredTrajectory"),
])
def test_an_event_built_wrong_fails_the_check(tmp_path: Path, module: str, right: str,
                                              wrong: str, error: str) -> None:
    tree = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree)
    path = tree / module
    source = path.read_text()
    assert right in source
    path.write_text(source.replace(right, wrong, 1))
    result = mypy(tree, tmp_path / "cache")
    assert result.returncode != 0
    assert f"{module}:" in result.stdout and error in result.stdout, result.stdout

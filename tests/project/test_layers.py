"""The layer rules of pyproject.toml ([tool.importlinter]), checked by import-linter as `make lint`
runs it: they hold on this tree, and a forbidden import added to a copy of it breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rollstream", "stages", "producers", "trainer_bridge", "schemas")
LINT = Path(sys.executable).parent / "lint-imports"
ONLY_WIRING = "Only the CLI and the dev harness"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first, so the tree under `root` is analysed, not an installed copy.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_layer_rule() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "forbidden", "contract"), [
    ("rollstream/contracts/codec.py", "import stages.eval", ONLY_WIRING),
    ("rollstream/runtime.py", "from trainer_bridge import groups", ONLY_WIRING),
    ("rollstream/inference/routing.py", "import rollstream.dev.simulated", ONLY_WIRING),
    ("rollstream/dev/loop.py", "import stages.init", "never import stages"),
    ("stages/eval.py", "from stages.init import episode_id", "No stage imports another stage"),
    ("trainer_bridge/groups.py", "import stages.run", "never import stages"),
    ("producers/replay.py", "import stages.init", "never import stages"),
])
def test_a_forbidden_import_breaks_the_lint(tmp_path: Path, module: str, forbidden: str,
                                            contract: str) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{forbidden}  # the deliberate violation\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    # One forbidden edge may break several contracts through the chains it closes.
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout
    source = module.removesuffix(".py").replace("/", ".")
    target = forbidden.split()[1]
    assert f"{source} -> {target}" in result.stdout

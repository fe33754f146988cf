"""The layer rules of pyproject.toml ([tool.importlinter]), checked by import-linter as `make lint`
runs it: they hold on this tree, a forbidden import added to a copy of it breaks them, and so
does a new top-level module given no layer. And no package inside rollstream has an import
circle among its modules and subpackages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rollstream", "stages", "producers", "trainer_bridge", "schemas")
LINT = Path(sys.executable).parent / "lint-imports"
ONLY_WIRING = "Only the CLI and the dev harness"
LAYERS = "rollstream's packages in layers"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first, so the tree under `root` is analysed, not an installed copy.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_layer_rule() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


def copy_tree(to: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, to / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", to)


@pytest.mark.parametrize(("module", "forbidden", "contract"), [
    ("rollstream/contracts/codec.py", "import stages.eval", ONLY_WIRING),
    ("rollstream/runtime.py", "from trainer_bridge import groups", ONLY_WIRING),
    ("rollstream/inference/routing.py", "import rollstream.dev.simulated", ONLY_WIRING),
    ("rollstream/dev/loop.py", "import stages.init", "never import stages"),
    ("stages/eval.py", "from stages.init import episode_id", "No stage imports another stage"),
    ("trainer_bridge/groups.py", "import stages.run", "never import stages"),
    ("producers/replay.py", "import stages.init", "never import stages"),
    # A lower layer importing a higher one: the contracts the service, the sandboxes their
    # users' quotas (the circle there was), the settings the Kafka clients.
    ("rollstream/contracts/codec.py", "import rollstream.service.jobs", LAYERS),
    ("rollstream/sandbox/backends.py", "from rollstream.service import quotas", LAYERS),
    ("rollstream/config.py", "import rollstream.cluster.kafka", LAYERS),
    # Siblings of one layer that import neither each other.
    ("rollstream/ops/status.py", "import rollstream.envs.registry", LAYERS),
    # A new module inside a package is covered by its package's layer.
    ("rollstream/telemetry/new_module.py", "import rollstream.runtime", LAYERS),
])
def test_a_forbidden_import_breaks_the_lint(tmp_path: Path, module: str, forbidden: str,
                                            contract: str) -> None:
    copy_tree(tmp_path)
    path = tmp_path / module
    before = path.read_text() if path.exists() else ""
    path.write_text(before + f"\n{forbidden}  # the deliberate violation\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    # One forbidden edge may break several contracts through the chains it closes.
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout
    source = module.removesuffix(".py").replace("/", ".")
    target = forbidden.split()[1]
    assert f"{source} -> {target}" in result.stdout


def test_a_new_top_level_module_breaks_the_lint_until_given_a_layer(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    (tmp_path / "rollstream" / "stray.py").write_text('"""A module nobody placed."""\n')
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "rollstream.stray" in result.stdout, result.stdout
    assert f"{LAYERS} BROKEN" in result.stdout, result.stdout


def test_no_package_has_an_import_circle() -> None:
    """Within every package of rollstream (rollstream itself too), its modules and subpackages
    taken as wholes import each other in no circle: grimp names the imports that would have to
    go to break the circles, and there are none."""
    graph = grimp.build_graph("rollstream", cache_dir=None)
    packages = [m for m in sorted(graph.modules) if graph.find_children(m)]
    assert "rollstream.sandbox" in packages and "rollstream.envs.swe" in packages
    circles = {p: breakers for p in packages if (breakers := graph.nominate_cycle_breakers(p))}
    assert circles == {}


def test_the_circle_check_finds_a_circle() -> None:
    graph = grimp.build_graph("rollstream", cache_dir=None)
    graph.add_import(importer="rollstream.sandbox.backends", imported="rollstream.service.quotas")
    assert graph.nominate_cycle_breakers("rollstream") == {
        ("rollstream.sandbox.backends", "rollstream.service.quotas")}

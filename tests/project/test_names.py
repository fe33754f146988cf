"""Names say what they hold: the bridge package exports what its docs tell users to import, each
built-in environment lives in the module named for it, and docs/environments.md lists them all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import trainer_bridge
from rollstream.envs.registry import BUILTINS
from trainer_bridge.bridge import TrainerBridge
from trainer_bridge.groups import GroupPolicy
from trainer_bridge.tensors import to_tensors

ROOT = Path(__file__).resolve().parents[2]


def test_the_bridge_package_exports_its_api() -> None:
    assert trainer_bridge.TrainerBridge is TrainerBridge
    assert trainer_bridge.GroupPolicy is GroupPolicy
    assert trainer_bridge.to_tensors is to_tensors
    for name in trainer_bridge.__all__:
        assert getattr(trainer_bridge, name).__name__ == name


def test_importing_the_bridge_package_does_not_load_torch() -> None:
    # The `rollstream` command imports it for its subcommands; its help must stay quick.
    code = "import sys, trainer_bridge, rollstream.cli.train; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=120).stdout
    assert out.strip() == "False"


def test_each_builtin_environment_lives_in_its_own_module() -> None:
    for name, cls in BUILTINS.items():
        assert cls.__module__.split(".")[-1] in (name, "env"), (name, cls.__module__)
        assert cls.__module__.startswith(f"rollstream.envs.{name}")


def test_the_docs_list_every_builtin_environment() -> None:
    text = (ROOT / "docs" / "environments.md").read_text()
    section = text.split("## Environments\n", 1)[1].split("\n## ", 1)[0]
    listed = section.split("Built-ins:", 1)[1].split("`rollstream envs`", 1)[0]
    assert set(re.findall(r"`(\w+)`", listed)) == set(BUILTINS)

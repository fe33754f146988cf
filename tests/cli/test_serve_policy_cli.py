"""`rollstream serve-policy --save-base`: the demo's version 0, for the by-hand recipe
(docs/operations.md, Training by hand, runs it and checks that the policy learns)."""

from __future__ import annotations

from pathlib import Path

import torch

from rollstream.cli import main
from rollstream.contracts.inference import END
from rollstream.envs.copy_letter import LETTERS
from rollstream.policy_server.model import load


def test_save_base_writes_version_0_answering_with_a_letter(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "policy-v0.safetensors"
    assert main(["serve-policy", "--save-base", str(path)]) == 0
    model, version = load(path)
    assert version == 0
    # Its output layer favours the letters and the end token over every other byte.
    bias = model.head.bias.detach()
    favoured = {ord(ch) for ch in LETTERS} | {END}
    others = torch.tensor([i for i in range(bias.numel()) if i not in favoured])
    assert bias[sorted(favoured)].min() > bias[others].max()

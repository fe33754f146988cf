"""The trainer bridge: scored trajectories in, batches of complete groups out, offsets committed
when the trainer acknowledges a batch.

    from trainer_bridge import GroupPolicy, TrainerBridge, to_tensors
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_bridge.bridge import Batch, TrainerBridge
    from trainer_bridge.groups import Group, GroupPolicy, Sample
    from trainer_bridge.tensors import TensorBatch, to_tensors

__all__ = ["Batch", "Group", "GroupPolicy", "Sample", "TensorBatch", "TrainerBridge", "to_tensors"]

# Each name's module, imported on first use: the `rollstream` command imports this package for
# its CLI and must not pay for torch (tensors) to print its help.
_MODULES = {"Batch": "bridge", "TrainerBridge": "bridge", "Group": "groups",
            "GroupPolicy": "groups", "Sample": "groups", "TensorBatch": "tensors",
            "to_tensors": "tensors"}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)

"""A TRL trainer process fed by Rollstream (trainer_bridge.adapters.trl_adapter.train), for the
test that kills it: prints each committed version as it goes."""

from __future__ import annotations

import sys
from pathlib import Path

from rollstream.config import load
from trainer_bridge.adapters import trl_adapter


def main(bootstrap: str, prefix: str, model_dir: str, checkpoint_dir: str, steps: str) -> None:
    settings = load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)
    rollouts = trl_adapter.train(settings, Path(model_dir), Path(checkpoint_dir),
                                 max_steps=int(steps), use_cpu=True)
    print("versions", [e["version"] for e in rollouts.published], flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

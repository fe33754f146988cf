"""A trainer process for the checkpoint tests (`python -c "...; work(bootstrap, prefix)"`), and
what every trainer there commits for a batch."""

from __future__ import annotations

from rollstream.config import Settings
from rollstream.runtime import Output
from trainer_bridge.bridge import Batch, TrainerBridge


def trained(settings: Settings, batch: Batch, step: int) -> Output:
    """What the 'trainer' commits for a batch: the episodes it learned from."""
    ids = ",".join(sorted(s.episode_id for s in batch.samples))
    return Output(settings.topics.policy, "policy", "PolicyVersion",
                  {"version": step, "uri": ids, "created_at_ms": 0})


def work(bootstrap: str, prefix: str) -> None:
    """A trainer process that commits one tiny batch after another, as fast as it can."""
    settings = Settings().override(bootstrap_servers=bootstrap, prefix=prefix,
                                   instance_id="trainer-k")
    with TrainerBridge(settings, groups_per_batch=1) as bridge:
        for step, batch in enumerate(bridge.batches(idle_timeout_s=600)):
            batch.ack([trained(settings, batch, step)])
            print(step, flush=True)  # the test kills it once it has committed

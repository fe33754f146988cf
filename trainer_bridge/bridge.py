"""The trainer bridge: scored trajectories in, batches of complete, scored groups out.

Offsets are committed only when the trainer acknowledges a batch. Samples of one group arrive
on different partitions and out of order, so each partition's commit is its lowest unacknowledged
offset, and acknowledged offsets above it travel in the commit metadata
(rollstream/cluster/offsets.py). `Batch.ack(outputs)` commits the offsets and the trainer's outputs
(its PolicyVersion event) in one Kafka transaction. The bridge runs on the stage runtime's consume
loop (rollstream/consume/loop.py): the same assignment, loss, rebuild of a failed consumer, group
served while a commit waits on the cluster, and exactly-once transaction (retriable errors
retried, bounded; abortable ones aborted; a fenced or failed producer dropped and rebuilt). A
trainer restarted from the last committed PolicyVersion sees exactly the batches that version
was not trained on, so none is lost and none is trained twice.

When an ack could not commit (aborted, fenced), or the partitions of the batch it acknowledges
were revoked or lost since it was handed out, it raises `rollstream.cluster.transaction.Rewind`: the
trainer's state now includes batches that are not committed, so the trainer must go back to the
last committed PolicyVersion and open a new bridge (trainer_bridge/train_loop.py does this).
Between batches, the bridge rides out lost partitions and failed consumers by itself.
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import Message

from rollstream.cluster.offsets import PartitionProgress
from rollstream.cluster.transaction import Rewind
from rollstream.config import Settings
from rollstream.consume.deadletters import Encoder, dead_letter
from rollstream.consume.loop import ConsumeLoop
from rollstream.consume.records import Output
from rollstream.contracts.codec import DecodeError, codec
from rollstream.contracts.events import POLICY_VERSION, SCORED_TRAJECTORY
from rollstream.contracts.graph import BRIDGE
from trainer_bridge.groups import Group, GroupAssembler, GroupPolicy, Sample

log = logging.getLogger("rollstream.bridge")

# How long holding no partitions counts as still joining (not idle): a join waits out a dead
# member's session (10 s), longer on a busy machine.
JOIN_GRACE_S = 60.0
# How often an idle bridge says which groups it is waiting on (a sample that never comes holds
# a group, and with it a batch, until the group's timeout).
WAITING_REPORT_S = 30.0


@dataclass
class Batch:
    groups: list[Group]
    _bridge: TrainerBridge = field(repr=False)
    acked: bool = False
    # Each partition's hold (see TrainerBridge._holds) when the batch was handed out.
    _holds: dict[int, int] = field(default_factory=dict, repr=False)

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]

    @property
    def trainable(self) -> list[Sample]:
        return [s for g in self.groups for s in g.trainable]

    @property
    def step_id(self) -> str:
        """Names the batch by its episodes, so a step can be recognized if it comes back."""
        ids = "\n".join(sorted(s.episode_id for s in self.samples))
        return hashlib.sha1(ids.encode()).hexdigest()[:16]

    def ack(self, outputs: list[Output] | None = None) -> None:
        """The trainer has taken this batch: commit its offsets (and outputs, atomically)."""
        if not self.acked:
            self._bridge._ack(self, outputs or [])
            self.acked = True


class TrainerBridge:
    """Iterator API: `for batch in bridge.batches(): trainer.step(batch); batch.ack()`; every
    ack commits in a Kafka transaction."""

    def __init__(self, settings: Settings, groups_per_batch: int = 4,
                 policy: GroupPolicy | None = None, group: str | None = None) -> None:
        if not settings.bootstrap_servers:
            # The CLI's words (imported only here: the CLI package is heavy to import).
            from rollstream.cli.common import NO_BROKER

            raise ValueError(NO_BROKER)
        self.settings = settings
        self.topic = settings.topics.scored
        self.groups_per_batch = groups_per_batch
        self.current_version = 0  # the trainer's policy version, for the staleness bound
        self.assembler = GroupAssembler(policy)
        self.dead_lettered = 0
        self.encoder = Encoder(settings, codec())
        self._dead_letters: list[Output] = []
        self._ready: list[Group] = []
        # Bumped whenever a partition's samples are dropped (revoked, lost, rewound): a batch
        # handed out before holds samples that are no longer this bridge's to acknowledge.
        self._holds: Counter[int] = Counter()
        self.loop = ConsumeLoop(settings, self.topic, group or settings.topics.group(BRIDGE),
                                BRIDGE, self)
        # A bridge never closed (opened without `with`, then an exception) is closed at
        # interpreter exit, while Python still runs: left to the Kafka clients' own teardown,
        # such a process spun at exit and never ended.
        self._closer = weakref.finalize(self, ConsumeLoop.close, self.loop)
        self.loop.open()

    @property
    def progress(self) -> dict[int, PartitionProgress]:
        return self.loop.held.progress

    @property
    def stats(self) -> dict[str, int]:
        return {**self.assembler.stats, "dead_lettered": self.dead_lettered}

    # -- what the loop drops (Work) ----------------------------------------------------------

    def release(self, partitions: set[int]) -> None:
        """Unacknowledged samples of these partitions will be redelivered to their next owner."""
        for p in partitions:
            self._holds[p] += 1
        for group in [*self.assembler.pending.values(), *self._ready]:
            group.samples = [s for s in group.samples if s.partition not in partitions]

    def forget(self) -> None:
        """Back to the committed offsets: every sample not acknowledged comes again."""
        for p in self.progress:
            self._holds[p] += 1
        self.assembler.pending.clear()
        self.assembler.take_dropped()
        self.assembler.take_set_aside()
        self._ready.clear()
        self._dead_letters.clear()

    # -- batches -----------------------------------------------------------------------------

    def batches(self, max_batches: int | None = None,
                idle_timeout_s: float | None = None) -> Iterator[Batch]:
        """Yield batches of complete groups; stop after max_batches or idle_timeout_s idle.
        Holding no partitions in the first JOIN_GRACE_S is joining, not idleness: a join can
        wait out a dead member's session."""
        produced = 0
        last_event = reported = time.monotonic()
        joining_until = last_event + JOIN_GRACE_S
        while max_batches is None or produced < max_batches:
            while len(self._ready) >= self.groups_per_batch:
                groups = self._ready[: self.groups_per_batch]
                del self._ready[: self.groups_per_batch]
                holds = {s.partition: self._holds[s.partition] for g in groups for s in g.samples}
                yield Batch(groups, self, _holds=holds)
                produced += 1
                if max_batches is not None and produced >= max_batches:
                    return
            # No bound of its own: this resumes what a served commit paused.
            msgs = self.loop.take(None, 0.2)
            if msgs is None:  # rewound or rebuilt: every unacknowledged sample comes again
                continue
            now = time.monotonic()
            if msgs or (not self.loop.held.progress and now < joining_until):
                last_event = now
            else:
                # Nothing new: commit what was dropped or dead-lettered since the last ack, so
                # a restart does not see it again when no batch follows.
                if self._dead_letters or any(p.dirty for p in self.progress.values()):
                    self._commit([])
                if now - max(last_event, reported) >= WAITING_REPORT_S:
                    reported = now
                    self._report_waiting()
                if idle_timeout_s is not None and time.monotonic() - last_event > idle_timeout_s:
                    return
            for msg in msgs:
                self._accept(msg)
            self._ready.extend(self.assembler.expire(self.current_version))
            for group in self.assembler.take_dropped():
                self._finished(group.samples)  # nothing to train on: acknowledged as handled
            self._finished(self.assembler.take_set_aside())

    def _report_waiting(self) -> None:
        pending = sorted(self.assembler.pending.values(), key=lambda g: g.first_seen)
        if not pending and not self._ready:
            return
        shown = "; ".join(f"{g.task_id} {len(g.samples)}/{g.size} at "
                          f"{sorted((s.partition, s.offset) for s in g.samples)}"
                          for g in pending[:5])
        log.info("%d complete groups wait for a batch of %d; %d groups wait for samples%s; "
                 "unacknowledged from offsets %s; partitions paused: %s", len(self._ready),
                 self.groups_per_batch, len(pending), f" ({shown})" if shown else "",
                 {p: prog.watermark for p, prog in sorted(self.progress.items())},
                 sorted(self.loop.held.paused) or "none")

    def _accept(self, msg: Message) -> None:
        progress = self.progress[msg.partition()]
        progress.started(msg.offset())
        if progress.should_skip(msg.offset()):
            progress.finished(msg.offset())  # in a batch a previous bridge already handed out
            return
        try:
            scored = self.encoder.codec.decode_as(SCORED_TRAJECTORY, msg.value())
        except DecodeError as exc:
            # Sent with the next ack, before or with the offset commit that passes it.
            self._dead_letters.append(
                dead_letter(self.settings.topics, BRIDGE, msg, f"undecodable: {exc}"))
            self.dead_lettered += 1
            progress.finished(msg.offset())
            return
        sample = Sample(scored, msg.partition(), msg.offset())
        group = self.assembler.add(sample, self.current_version)
        if group is not None:
            self._ready.append(group)

    def _finished(self, samples: list[Sample]) -> None:
        for s in samples:
            progress = self.progress.get(s.partition)
            if progress is not None:
                progress.finished(s.offset)

    # -- committing --------------------------------------------------------------------------

    def _ack(self, batch: Batch, outputs: list[Output]) -> None:
        lost = sorted(p for p, hold in batch._holds.items() if self._holds[p] != hold)
        if lost:
            raise Rewind(f"partitions {lost} of the batch were revoked or lost since it was "
                         "handed out: their samples go to the next owner")
        self._finished(batch.samples)
        self._commit(outputs)
        # The trainer's version is what it committed last (the staleness bound's reference).
        versions = [o.value["version"] for o in outputs
                    if o.record == POLICY_VERSION and isinstance(o.value, dict)]
        self.current_version = max([self.current_version, *versions])

    def _commit(self, outputs: list[Output]) -> None:
        """Commit finished offsets with the outputs (and pending dead letters), atomically."""
        outputs = [*self._dead_letters, *outputs]
        self._dead_letters.clear()
        try:
            for out in outputs:
                self.loop.transaction.produce(out.topic, self.encoder.encode(out), out.key,
                                             out.partition)
            self.loop.commit()
        except Rewind as exc:
            self.loop.interrupt(str(exc))  # the next poll rewinds what this bridge holds
            raise

    def close(self) -> None:
        """Leave the group and let the producer go (bounded: a cluster that does not answer
        cannot keep the trainer from stopping). Only the first call does anything."""
        self._closer()

    def __enter__(self) -> TrainerBridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

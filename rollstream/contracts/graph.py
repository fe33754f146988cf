"""The topic graph, declared once: every topic with its record type, key, partitions, config,
who writes it and which consumer groups read it.

Everything else derives from this table: topic names (`Topics`), consumer-group names
(`Topics.group`), `rollstream topics create`, each stage's input (`input_of`), and the tests that
check every stage's outputs and the README's diagram against it.

Not in it: the changelog topics of `rollstream stats`'s faust tables, which faust names,
creates and sizes itself.

Configs are set explicitly per topic instead of relying on broker defaults, so the same
`topics create` gives the same topics on the bundled broker, a container or a production cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from rollstream.contracts import events
from rollstream.contracts.wire import MAX_MESSAGE_BYTES

MIB = 1024 * 1024
DAY_MS = 24 * 3600 * 1000
# The one compression codec of every topic and of the producer (rollstream.cluster.kafka): a
# topic whose codec differs from the batch's makes the broker decompress and recompress every
# batch. zstd, measured (make bench, checkpoint.json) on 50-turn episodes' turn checkpoints and
# trajectories: 0.56 and 0.51 of the raw bytes against lz4's 0.71 and 0.67, for about 2 ms more
# CPU to compress a MiB (4.7-5.2 against 2.7-2.8; about 13 us more per 6 KB turn): the bytes are
# paid again on every replica, every reader and the disk.
COMPRESSION = "zstd"

# Consumer groups (each named <prefix>.<group>, see Topics.group).
INIT, RUN, EVAL, BRIDGE, STATS = "init", "run", "eval", "bridge", "stats"
PRINTER = "batch-printer"  # `rollstream bridge`, which prints batches instead of training
STAGES = (INIT, RUN, EVAL)
# Writers that are not consumer groups; `redrive` (`rollstream dlq redrive`) sends dead letters
# back to the topic they came from (and records them on <p>.dlq-redriven).
PRODUCERS, TRAINER, REDRIVE = "producers", "trainer", "redrive"
# `rollstream jobs` writes the jobs topic; a shared fleet (`rollstream fleet`) follows it.
JOBS, FLEET = "jobs", "fleet"


@dataclass(frozen=True)
class Topic:
    """One topic: `attr` is its name's property on Topics, `<prefix>.<suffix>` its name."""

    attr: str
    suffix: str
    record: str  # the Avro record of its values ("": not Avro, see `values`)
    key: str  # what the key is
    doc: str
    writers: tuple[str, ...]
    values: str = ""  # what the values are when they are not Avro records
    groups: tuple[str, ...] = ()  # consumer groups that read it (committed offsets)
    # Readers without a group: they assign partitions and read from an offset.
    followers: tuple[str, ...] = ()
    config: dict[str, str] = field(default_factory=dict)
    # None: the `partitions` setting of `topics create`; a number: always that many.
    partitions: int | None = None

    def name(self, topics: Topics) -> str:
        return f"{topics.prefix}.{self.suffix}"


def _config(*, retention_ms: int, max_bytes: int, **extra: str) -> dict[str, str]:
    return {
        "retention.ms": str(retention_ms),
        "compression.type": COMPRESSION,
        "max.message.bytes": str(max_bytes),
        "min.insync.replicas": "1",
        **extra,
    }


GRAPH: tuple[Topic, ...] = (
    Topic(
        "tasks", "tasks", events.TASK, "task id",
        "tasks to roll out, keyed by task id (producers -> INIT)",
        writers=(PRODUCERS, REDRIVE), groups=(INIT,),
        # Problem statements are text: a few KiB, rarely more.
        config=_config(retention_ms=7 * DAY_MS, max_bytes=4 * MIB),
    ),
    Topic(
        "episodes", "episodes", events.EPISODE, "episode id",
        "one event per sample of a task's group, keyed by episode id (INIT -> RUN); RUN writes "
        "an infra failure back as its next attempt",
        writers=(INIT, RUN, REDRIVE), groups=(RUN,),
        config=_config(retention_ms=7 * DAY_MS, max_bytes=4 * MIB),
    ),
    Topic(
        "episode_state", "episode-state", events.TURN_CHECKPOINT, "`<episode id>/<turn index>`",
        "per-turn checkpoints of running episodes, one record per turn keyed by "
        "<episode id>/<turn index>; compacted, and every turn key tombstoned when its episode "
        "ends (RUN's resume state; co-partitioned with episodes)",
        writers=(RUN,), followers=(RUN,),
        # A turn per record, not the trajectory so far: a turn's checkpoint costs that turn.
        # Compaction keeps one record per key, so each turn has its own key and a finished
        # episode deletes them all; a delete-retention topic would instead keep finished
        # episodes' turns for the whole retention and drop a live episode older than it.
        config=_config(
            retention_ms=7 * DAY_MS,
            max_bytes=MAX_MESSAGE_BYTES,  # a new_sample turn holds the whole re-rendered context
            **{
                "cleanup.policy": "compact",
                # Compaction works only on closed segments: roll hourly so old turns go away.
                "segment.ms": str(3600 * 1000),
                "min.cleanable.dirty.ratio": "0.1",
                # How long a tombstone (a finished episode's turn) stays readable: a restore
                # reads a partition to its end in seconds to minutes, and every finished turn
                # leaves one, so an hour, not a day, of them is what a restore reads through.
                "delete.retention.ms": str(3600 * 1000),
            },
        ),
    ),
    Topic(
        "trajectories", "trajectories", events.TRAJECTORY, "episode id",
        "finished episodes: every turn's token ids, logprobs and observations (RUN -> EVAL)",
        writers=(RUN, REDRIVE), groups=(EVAL, STATS),
        config=_config(retention_ms=7 * DAY_MS, max_bytes=MAX_MESSAGE_BYTES),
    ),
    Topic(
        "scored", "scored", events.SCORED_TRAJECTORY, "episode id",
        "trajectories with their reward and outcome class (EVAL -> trainer bridge)",
        writers=(EVAL, REDRIVE), groups=(BRIDGE, STATS, PRINTER), followers=("demo", "status"),
        config=_config(retention_ms=7 * DAY_MS, max_bytes=MAX_MESSAGE_BYTES),
    ),
    Topic(
        "policy", "policy", events.POLICY_VERSION, "`policy`",
        "policy versions published by the trainer, in order (trainer -> inference controller)",
        writers=(TRAINER,), groups=(STATS,),
        followers=("controller", "admission", TRAINER, "demo", "status"),
        # Kept forever: tiny, and the whole history says which weights produced which rollouts.
        config=_config(
            retention_ms=-1,
            max_bytes=1 * MIB,
            **{"retention.bytes": "-1"},
        ),
        partitions=1,  # one partition: a total order of versions
    ),
    Topic(
        "seen", "seen", "", "<stage>/<id>",
        "ids INIT and EVAL have handled, on their input's partition; compacted (their "
        "deduplication memory, rollstream.dedup)",
        writers=(INIT, EVAL), followers=(INIT, EVAL),
        values="(empty marker; EVAL's: the newest attempt scored, where above 0)",
        config=_config(retention_ms=7 * DAY_MS, max_bytes=1 * MIB,
                       **{"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.1"}),
    ),
    Topic(
        "dlq", "dlq", events.DEAD_LETTER, "the source event's key",
        "events a stage could not decode or validate, with reason and source coordinates",
        writers=(*STAGES, BRIDGE), groups=(STATS,), followers=("dlq", "status"),
        # Wraps the original event, which may itself be as large as MAX_MESSAGE_BYTES; kept longer
        # because someone has to look at it.
        config=_config(retention_ms=30 * DAY_MS, max_bytes=MAX_MESSAGE_BYTES + MIB),
    ),
    Topic(
        "dlq_redriven", "dlq-redriven", "", "<p>.dlq coordinates (partition:offset)",
        "the dead letters `rollstream dlq redrive` sent back, written in the transaction that "
        "sends them: a dead letter is redriven once",
        writers=(REDRIVE,), followers=("dlq",), values="JSON source coordinates",
        # Compacted and kept forever: a forgotten entry could be redriven a second time.
        config=_config(retention_ms=-1, max_bytes=1 * MIB,
                       **{"cleanup.policy": "compact"}),
        partitions=1,
    ),
    Topic(
        "jobs", "jobs", events.JOB, "job name",
        "the training jobs a shared fleet serves, keyed by job name; compacted to each job's "
        "latest record (a tombstone deletes the job). Read under the cluster's prefix",
        writers=(JOBS,), followers=(FLEET, JOBS, TRAINER, "status"),
        # Kept forever and compacted: the current set of jobs is the topic read to its end.
        config=_config(retention_ms=-1, max_bytes=1 * MIB,
                       **{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}),
        partitions=1,  # one partition: every reader sees the jobs' changes in one order
    ),
    Topic(
        "stats", "stats", "", "`summary`",
        "`rollstream stats`'s latest summary (all-time, 10 s and 1 min windows), for dashboards",
        writers=(STATS,), values="JSON summary",
        config=_config(retention_ms=-1, max_bytes=1 * MIB,
                       **{"cleanup.policy": "compact"}),
        partitions=1,
    ),
)

BY_ATTR: dict[str, Topic] = {t.attr: t for t in GRAPH}


def input_of(group: str) -> Topic:
    """The topic a stage's (or the bridge's) consumer group reads: exactly one."""
    [topic] = [t for t in GRAPH if group in t.groups]
    return topic


def outputs_of(writer: str) -> list[Topic]:
    """The topics a writer produces to."""
    return [t for t in GRAPH if writer in t.writers]


def partition_count(topic: Topic, default: int) -> int:
    """How many partitions the topic has when created with the `partitions` setting `default`."""
    return topic.partitions or default


@dataclass(frozen=True)
class Topics:
    """The graph's topic and consumer-group names under one prefix."""

    prefix: str = "rollstream"

    def group(self, name: str) -> str:
        """The consumer group id of a stage or the bridge."""
        return f"{self.prefix}.{name}"

    def _name(self, attr: str) -> str:
        return BY_ATTR[attr].name(self)

    @cached_property
    def tasks(self) -> str:
        return self._name("tasks")

    @cached_property
    def episodes(self) -> str:
        return self._name("episodes")

    @cached_property
    def episode_state(self) -> str:
        return self._name("episode_state")

    @cached_property
    def trajectories(self) -> str:
        return self._name("trajectories")

    @cached_property
    def scored(self) -> str:
        return self._name("scored")

    @cached_property
    def policy(self) -> str:
        return self._name("policy")

    @cached_property
    def seen(self) -> str:
        return self._name("seen")

    @cached_property
    def dlq(self) -> str:
        return self._name("dlq")

    @cached_property
    def dlq_redriven(self) -> str:
        return self._name("dlq_redriven")

    @cached_property
    def jobs(self) -> str:
        return self._name("jobs")

    @cached_property
    def stats(self) -> str:
        return self._name("stats")


def table() -> str:
    """The graph as the Markdown table in the README (a test keeps the two equal)."""
    rows = ["| topic | record | key | partitions | written by | read by (**consumer group**) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for t in GRAPH:
        readers = [f"**{g}**" for g in t.groups] + list(t.followers)
        record = t.record or t.values
        rows.append(
            f"| `<p>.{t.suffix}` | {record} | {t.key} | {t.partitions or '`--partitions`'} "
            f"| {', '.join(t.writers)} | {', '.join(readers)} |")
    return "\n".join(rows)

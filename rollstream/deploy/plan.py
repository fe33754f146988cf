"""How big a cluster a workload needs: replicas per stage, partitions, inference servers and the
KEDA lag thresholds that keep them there (`rollstream plan`).

The model is Little's law on what the benchmarks measured (benchmarks/results/; a test keeps
the constants below equal to them):
- RUN holds every running episode: turns x (inference latency + tool time) each. A RUN process
  works on at most `max_in_flight` at once, and spends CPU_S_PER_TURN per turn: the at_scale
  benchmark's, 10,000 episodes of 50 turns in flight over 4 RUN processes on a 3-node cluster
  (the prompt sent and echoed every turn, the turn's checkpoint, the transactions), with
  contexts growing to 32k tokens; a turn with a longer context costs more, since its request
  carries all of it.
- EVAL holds each trajectory for its scoring time, `max_in_flight` per process.
- INIT is CPU-bound: STAGE_CPU_S_PER_EVENT per event in and out (the metrics benchmark's
  decoding, re-encoding stage), a task in and `group_size` episodes out.
- A stage's lag is at least what it holds in flight, as those are not committed (and at least
  one event: a stage with work holds some). Where it is read matters (the chart's
  `autoscaling.lagSource`): Rollstream's own count (`status`, `prometheus`) stops there; Kafka's
  (`kafka`: high watermark minus committed offset, what KEDA's Kafka scaler reads) adds 1 per
  partition, the commit marker of the last transaction. KEDA then runs ceil(lag /
  lagThreshold) replicas, at most the partitions; each stage's threshold is chosen here so that
  this is the replicas the stage needs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# benchmarks/results/at_scale.json: RUN's CPU per turn, 10,000 episodes of 50 turns in flight.
AT_SCALE_RUN_CPU_MS_PER_TURN = 3.176
CPU_S_PER_TURN = AT_SCALE_RUN_CPU_MS_PER_TURN / 1000
# benchmarks/results/metrics.json: a decoding, re-encoding stage with metrics on, per event.
STAGE_CPU_S_PER_EVENT = 18.7e-6
MAX_PARTITIONS = 256
FILL = 0.75  # of a process's in-flight slots and CPU the plan uses: room for bursts
# The chart's autoscaling.lagSource values; only Kafka's own count sees the commit markers.
LAG_SOURCES = ("status", "prometheus", "kafka")


class PlanError(ValueError):
    """A workload this plan cannot serve (named in the message)."""


@dataclass(frozen=True)
class Workload:
    task_rate: float  # tasks published per second
    group_size: int = 8  # episodes per task
    turns: float = 3.0  # mean turns per episode
    decode_s: float = 2.0  # mean inference latency of one turn's completion
    tool_s: float = 0.5  # mean tool / environment time per turn
    eval_s: float = 0.2  # mean scoring time per episode
    max_in_flight: int = 64  # events one RUN / EVAL process works on at once
    commit_interval_ms: int = 200
    server_max_num_seqs: int = 256  # sequences one inference server decodes at once
    lag_source: str = "status"  # where KEDA reads the lag (the chart's autoscaling.lagSource)

    def check(self) -> None:
        for name in ("task_rate", "turns", "server_max_num_seqs", "max_in_flight",
                     "group_size", "commit_interval_ms"):
            if getattr(self, name) <= 0:
                raise PlanError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("decode_s", "tool_s", "eval_s"):
            if getattr(self, name) < 0:
                raise PlanError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.lag_source not in LAG_SOURCES:
            raise PlanError(f"lag_source must be one of {', '.join(LAG_SOURCES)}, "
                            f"got {self.lag_source!r}")

    def markers(self, partitions: int) -> int:
        """The commit markers in the lag KEDA reads: one per partition in Kafka's count."""
        return partitions if self.lag_source == "kafka" else 0

    @property
    def episodes_per_s(self) -> float:
        return self.task_rate * self.group_size


@dataclass(frozen=True)
class StagePlan:
    stage: str
    in_flight: float  # events held at once, over all replicas (Little's law)
    cpu_cores: float  # CPU the stage spends, over all replicas
    replicas: int
    lag: int  # the lag KEDA reads at that load: in flight (+ 1 per partition from Kafka)
    lag_threshold: int  # KEDA's lagThreshold: ceil(lag / it) = replicas


@dataclass(frozen=True)
class Plan:
    workload: Workload
    episodes_per_s: float
    concurrent_episodes: float
    partitions: int
    servers: int
    stages: list[StagePlan] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def keda_replicas(lag: int, lag_threshold: int, partitions: int) -> int:
    """What KEDA asks for (ceil(lag / lagThreshold), at most the partitions: the chart's
    maxReplicaCount)."""
    return min(partitions, math.ceil(lag / lag_threshold))


def _need(in_flight: float, cpu_cores: float, slots: int | None) -> int:
    """Replicas for enough in-flight slots (async stages) and CPU."""
    by_slots = math.ceil(in_flight / (slots * FILL)) if slots else 1
    return max(1, by_slots, math.ceil(cpu_cores / FILL))


def _stage(name: str, in_flight: float, cpu_cores: float, need: int, partitions: int,
           markers: int) -> StagePlan:
    """The lag threshold at which the lag KEDA reads at this load makes it run `need`
    replicas: the largest whose replica count is at least the need (where few events of lag
    per replica allow no exact one, KEDA's count, a little above the need, is the plan's)."""
    lag = max(1, math.ceil(in_flight)) + markers
    threshold = math.ceil(lag / need)  # gives at most `need`; a lower one gives more
    while threshold > 1 and keda_replicas(lag, threshold, partitions) < need:
        threshold -= 1
    replicas = keda_replicas(lag, threshold, partitions)
    return StagePlan(name, round(in_flight, 3), round(cpu_cores, 4), replicas, lag, threshold)


def plan(w: Workload) -> Plan:
    w.check()
    episodes = w.episodes_per_s
    concurrent = episodes * w.turns * (w.decode_s + w.tool_s)
    # (stage, events in flight, CPU cores, in-flight slots per process: None for a sync stage)
    loads = [
        ("init", w.task_rate * w.commit_interval_ms / 1000,
         (w.task_rate + episodes) * STAGE_CPU_S_PER_EVENT, None),
        ("run", concurrent, episodes * w.turns * CPU_S_PER_TURN, w.max_in_flight),
        ("eval", episodes * w.eval_s, episodes * STAGE_CPU_S_PER_EVENT, w.max_in_flight),
    ]
    needs = {name: _need(in_flight, cpu, slots) for name, in_flight, cpu, slots in loads}
    most = max(needs.values())
    if most > MAX_PARTITIONS:
        raise PlanError(f"the workload needs {most} replicas of a stage, more than "
                        f"{MAX_PARTITIONS} partitions allow; lower task_rate or raise "
                        "max_in_flight")
    # A power of two: replicas of 1, 2, 4... each get an even share of the partitions.
    partitions = 1 << max(0, math.ceil(math.log2(most)))
    stages = [_stage(name, in_flight, cpu, needs[name], partitions, w.markers(partitions))
              for name, in_flight, cpu, _ in loads]
    in_decode = episodes * w.turns * w.decode_s  # completions being decoded at once
    servers = max(1, math.ceil(in_decode / (w.server_max_num_seqs * FILL)))
    return Plan(w, round(episodes, 3), round(concurrent, 3), partitions, servers, stages)


def render(p: Plan) -> str:
    lines = [f"{p.episodes_per_s:g} episodes/s, {p.concurrent_episodes:g} running at once: "
             f"{p.partitions} partitions, {p.servers} inference server(s)",
             f"{'stage':<6} {'replicas':>8} {'in flight':>10} {'CPU cores':>9} "
             f"{'lag':>7} {'lagThreshold':>12}"]
    lines += [f"{s.stage:<6} {s.replicas:>8} {s.in_flight:>10g} {s.cpu_cores:>9g} {s.lag:>7} "
              f"{s.lag_threshold:>12}" for s in p.stages]
    return "\n".join(lines)

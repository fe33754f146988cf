"""Jobs on one shared fleet: weighted fair share of the inference servers' slots, measured from
the log, in one run on the real broker.

A RUN fleet (rollstream.service.fleet, in this process, as `rollstream fleet run` builds it) serves
the jobs of a fresh cluster prefix against simulated servers (rollstream.dev.simulated) that answer
every turn after a fixed delay (`TURN_S`, in `STEPS` decode steps, whatever the concurrency), up
to `SLOTS` episodes per server. Episodes (one `arithmetic` turn each) go straight to each job's
episodes topic, stamped with their publish time (INIT is not what this measures). Everything is
read back from the jobs' trajectories topics (committed records): each episode's publish time,
start and end.

1. **Weights**: three backlogged jobs weighted 1:2:1 on one server; each job's share of the
   turns completed while all three had input waiting (target: within 5 points of 25/50/25).
   The third job is kept `TOP_UP` episodes ahead of what it finished.
2. **Idle**: in the same run, the third job's input runs dry; the other two take its slots.
   Utilisation from its last episode's end on: episodes in flight / slots, sampled every
   `SAMPLE_S` (target ≥ 0.95), and from the log: episode-seconds / (slots × seconds). The
   baseline: one backlogged job alone on the same fleet and server.
3. **Flood**: two jobs publish at a steady rate (`PACED_PER_S` each), first alone, then while a
   third job floods the fleet with 10x their tasks; their p50 episode latency (publish → end)
   during the flood against alone (target ≤ 1.2x).
4. **Bursty, shared vs dedicated**: two jobs, each a training loop of `BATCHES` batches (a
   batch of `BATCH` episodes, wait for all, `TRAIN_S` of training, again), the second starting
   half a cycle after the first (real jobs drift out of phase: one trains while the other
   generates), on two servers: one shared fleet (both jobs on both servers, fair share) against
   the same servers split, one per job (each job its own server, `policy_urls`). Each job's
   episodes/s is its batches' episodes over the time from its first publish to its last
   batch's end, so the figure is a time, not a count of whole batches in a window; the two
   jobs' rates add up. Utilisation and episodes/s of both layouts, and their ratio. Its turns
   are `BURSTY_STEPS` decode steps (see there). Each scenario's clock starts once the fleet
   holds every job's partitions, their state restored (`until_served`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from benchmarks import print_table, write_result
from producers.publish import validate_task
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec
from rollstream.contracts.events import Job
from rollstream.dev.simulated import SimulatedServer
from rollstream.inference.routing import Router
from rollstream.runtime import Stage
from rollstream.service import jobs
from rollstream.service.fleet import Fleet
from rollstream.service.quotas import JobQuotas
from stages.run import RunStage

NAME = "fairshare"
PARTITIONS = 2
SLOTS = 8  # sequences a server decodes at once, and RUN's episodes per server at once
OVERSUBSCRIBED = 10  # RUN's episodes per server where slots are oversubscribed (10 per 8)
TURN_S = 0.4  # a turn's decode time, at any concurrency
STEPS = 4  # its decode steps (3 digits and the stop token): a step of 0.1 s
# The bursty scenario's: 20 steps of 20 ms, as a real server's decode step. A request joins the
# decode batch at a step boundary; an episode started a moment after its server began a step
# waits out that step. At 0.1 s steps that wait was a quarter of a turn, and it fell on one
# layout's waves more than the other's by how finishes and restarts interleaved (shared: 14 of
# a wave's 16 restarts a step late; dedicated: at worst 2 of a batch's 5 waves), not by sharing.
BURSTY_STEPS = 20
SAMPLE_S = 0.1
# 1-2: weights 1:2:1, all backlogged for WEIGHTED_S, then the third job's input runs dry.
WEIGHTS = {"w1a": 1.0, "w2": 2.0, "w1b": 1.0}
WEIGHTED_S = 25.0
# The shares are read from this long after every job finished its first episode: the jobs get
# their partitions one after another, the first takes every slot meanwhile (work-conserving),
# and the others then win the ties until their service has caught up (about 5 s here).
SETTLE_S = 6.0
IDLE_S = 15.0
TOP_UP = 16
# 3: two paced jobs, alone then under a flood of 10x their tasks.
PACED_PER_S = 2.5
PACED_S = 15.0
FLOOD_X = 10
# 4: two training loops, the second OFFSET of a dedicated cycle (generate, train) behind.
BATCH = 48
TRAIN_S = 2.0
BATCHES = 6
OFFSET = 0.5
QUICK = 3  # --quick: every phase this many times shorter

# 5: one job at max_in_flight = its slots, with and without the fetch buffer.
BUFFER_S = 15.0

TARGET_SHARE_POINTS = 2.0  # with slots oversubscribed
TARGET_UTILISATION = 0.95
TARGET_DECODE_BATCH = 0.95  # the servers' decode batch, with slots oversubscribed
TARGET_LATENCY_RATIO = 1.2
TARGET_SHARING = 1.3  # shared / dedicated episodes/s of the bursty jobs


def capacity_per_s(servers: int = 1) -> float:
    return servers * SLOTS / TURN_S


def script(steps: int) -> Callable[[list[int], dict[str, Any]], tuple[list[int], str]]:
    """A turn of `steps` tokens: digits, then the stop token."""
    def answer(prompt_ids: list[int], body: dict[str, Any]) -> tuple[list[int], str]:
        return [ord("1")] * (steps - 1) + list(body["stop_token_ids"][:1]), "1" * (steps - 1)

    return answer


@dataclass
class Episode:
    job: str
    published_ms: int
    started_ms: int
    finished_ms: int
    turns: int


@dataclass
class Cluster:
    """A fresh cluster prefix, its jobs and a RUN fleet serving them on `servers` (each
    decoding SLOTS sequences at once), RUN sending each `slots` episodes at once."""
    base: Settings
    servers: int
    slots: int = SLOTS
    steps: int = STEPS  # decode steps a turn, each TURN_S / steps
    stage: dict[str, int] = field(default_factory=dict)  # stage settings of the fleet's RUN
    settings: Settings = field(init=False)
    made: dict[str, Job] = field(default_factory=dict)
    samples: list[tuple[float, float]] = field(default_factory=list)  # (time, in flight/slots)
    # (time, sequence-seconds decoded by all servers so far), sampled with the above.
    decoded: list[tuple[float, float]] = field(default_factory=list)
    published: dict[str, int] = field(default_factory=dict)
    # One producer per job, kept, as a trainer keeps its own (a new one per batch spent a
    # metadata round trip and its start-up on every batch).
    producers: dict[str, Producer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.settings = load(bootstrap_servers=self.base.bootstrap_servers,
                             prefix=f"fair{uuid.uuid4().hex[:8]}", partitions=PARTITIONS)
        create_topics(self.settings.bootstrap_servers, self.settings.prefix, PARTITIONS,
                      specs=jobs.CLUSTER_TOPICS)

    def create(self, name: str, **fields: Any) -> Settings:
        job = jobs.new_job(name, self.settings.prefix, **fields)
        create_topics(self.settings.bootstrap_servers, job["prefix"], PARTITIONS,
                      specs=jobs.JOB_TOPICS)
        jobs.put(self.settings, job)
        self.made[name] = job
        self.published[name] = 0
        return jobs.job_settings(self.settings, job)

    def publish(self, name: str, count: int) -> None:
        """`count` episodes of job `name`, stamped now."""
        own = jobs.job_settings(self.settings, self.made[name])
        if name not in self.producers:
            self.producers[name] = kafka.producer(own)
        producer = self.producers[name]
        now = int(time.time() * 1000)
        first = self.published[name]
        for i in range(first, first + count):
            task = validate_task({"task_id": f"{name}-{i}", "env": "arithmetic",
                                  "prompt": "1+1=", "data": {"answer": "2"}, "group_size": 1,
                                  "max_turns": 1})
            task["created_at_ms"] = now
            episode_id = f"{task['task_id']}#0"
            kafka.produce(producer, own.topics.episodes, codec().encode("Episode", {
                "episode_id": episode_id, "task": task, "sample_index": 0,
                "created_at_ms": now}), key=episode_id)
        producer.flush(60)
        self.published[name] += count

    def episodes(self) -> list[Episode]:
        """Every job's finished episodes, from its committed trajectories."""
        found = []
        for name, job in self.made.items():
            own = jobs.job_settings(self.settings, job)
            parts = kafka.whole_topic(own, own.topics.trajectories) or []
            for msg in kafka.read_partitions(own, parts):
                t = codec().decode_as("Trajectory", msg.value())
                found.append(Episode(name, t["task"]["created_at_ms"], t["started_at_ms"],
                                     t["finished_at_ms"], len(t["turns"])))
        return found

    def utilisation(self, start: float, end: float) -> float:
        window = [u for t, u in self.samples if start <= t <= end]
        return statistics.fmean(window) if window else 0.0

    def decode_batch(self, start: float, end: float) -> float:
        """How full the servers' decode batches were between the samples nearest `start` and
        `end`: sequence-seconds decoded / (sequences x seconds)."""
        window = [(t, d) for t, d in self.decoded if start <= t <= end]
        if len(window) < 2:
            return 0.0
        (t0, d0), (t1, d1) = window[0], window[-1]
        return (d1 - d0) / (SLOTS * self.servers * (t1 - t0))

    async def serve(self, scenario: Callable[[Fleet], Any]) -> None:
        """Run the fleet on fresh servers while `scenario(fleet)` runs."""
        step_s = TURN_S / self.steps
        servers = [SimulatedServer(script=script(self.steps), step_s=lambda running: step_s,
                                   max_num_seqs=SLOTS) for _ in range(self.servers)]
        urls = [await s.start() for s in servers]
        run_settings = self.settings.override(
            policy_url=",".join(urls), server_max_in_flight=self.slots, health_interval_s=0.5,
            **self.stage)
        router = Router(urls, max_episodes=self.slots, health_interval_s=0.5)
        await router.start()

        def make_stage(s: Settings, quotas: JobQuotas, share: Callable[[], int]) -> Stage:
            if quotas.job["policy_urls"]:  # a dedicated server: its own router
                return RunStage(s, quotas=quotas)
            return RunStage(s, router=router, share=share, quotas=quotas)

        fleet = Fleet(run_settings, make_stage, drain_timeout_s=5, slots=router.slots)
        served = asyncio.create_task(fleet.serve())

        async def sample() -> None:
            while True:
                running = sum(s.runtime.in_flight for s in fleet.served.values())
                now = time.time()
                self.samples.append((now, running / (self.slots * self.servers)))
                self.decoded.append((now, sum(s.sequence_seconds() for s in servers)))
                await asyncio.sleep(SAMPLE_S)

        sampler = asyncio.create_task(sample())
        try:
            await scenario(fleet)
        finally:
            sampler.cancel()
            fleet.stop()
            await served
            await router.close()
            for server in servers:
                await server.stop()

    def close(self) -> None:
        for producer in self.producers.values():
            producer.flush(10)
        for job in self.made.values():
            delete_topics(self.settings.bootstrap_servers, job["prefix"])
        delete_topics(self.settings.bootstrap_servers, self.settings.prefix)


async def until_served(fleet: Fleet, names: set[str], timeout: float = 60) -> None:
    """Until the fleet serves jobs `names`, each holding its input partitions with their state
    restored: a scenario's clock starts on a fleet that has joined its groups, as a long-running
    job's does (a bursty job's first episode started 2.4 s after its first publish without this
    wait, 0.9 s with it: once per job, which a job's hours amortise and a few batches do not)."""
    def joined() -> set[str]:
        return {n for n, s in fleet.served.items()
                if len(s.runtime.loop.holding()[0]) == PARTITIONS
                and not s.runtime.loop.held.restoring}

    deadline = time.monotonic() + timeout
    while not names <= joined():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the fleet did not start jobs {sorted(names - joined())}")
        await asyncio.sleep(0.1)


def log_utilisation(episodes: list[Episode], slots: int, start_ms: float, end_ms: float) -> float:
    """Episode-seconds inside [start, end] over the slots' seconds: from the log alone."""
    busy = sum(max(0.0, min(e.finished_ms, end_ms) - max(e.started_ms, start_ms))
               for e in episodes)
    return busy / (slots * (end_ms - start_ms)) if end_ms > start_ms else 0.0


# -- 1 and 2: weights, then one job idle ---------------------------------------------------

def weights_and_idle(base: Settings, weighted_s: float, idle_s: float, slots: int,
                     settle_s: float = SETTLE_S) -> dict[str, Any]:
    cluster = Cluster(base, servers=1, slots=slots)
    idle_job = list(WEIGHTS)[-1]
    marks: dict[str, float] = {}
    # The others' backlogs outlast both phases, even at the servers' full rate.
    backlog = int(capacity_per_s() * (weighted_s + idle_s) * 1.5)
    try:
        for name, weight in WEIGHTS.items():
            cluster.create(name, weight=weight)
            if name != idle_job:
                cluster.publish(name, backlog)
        started = time.time()

        async def scenario(fleet: Fleet) -> None:
            await until_served(fleet, set(WEIGHTS))
            # The idle job is kept backlogged (TOP_UP episodes waiting or more) for weighted_s,
            # then left to run dry.
            end = time.time() + weighted_s
            while time.time() < end:
                done = fleet.served[idle_job].runtime.stats["processed"]
                if cluster.published[idle_job] - done < TOP_UP:
                    await asyncio.to_thread(cluster.publish, idle_job, TOP_UP)
                await asyncio.sleep(0.2)
            marks["dry"] = time.time()
            idle = fleet.served[idle_job].runtime
            while idle.in_flight or idle.stats["processed"] < cluster.published[idle_job]:
                await asyncio.sleep(0.1)
            marks["idle"] = time.time()
            await asyncio.sleep(idle_s)

        asyncio.run(cluster.serve(scenario))
        ended = time.time()
        found = cluster.episodes()
    finally:
        cluster.close()
    total = sum(WEIGHTS.values())
    # Phase 1: from `settle_s` after every job has finished an episode (all have started) to
    # the last top-up of the idle job (it had input waiting until then).
    firsts = [min(e.finished_ms for e in found if e.job == n) for n in WEIGHTS]
    idle_eps = [e for e in found if e.job == idle_job]
    w_end = marks["dry"] * 1000
    w_start = min(max(firsts) + settle_s * 1000, w_end - 1000)
    turns = {n: sum(e.turns for e in found if e.job == n and w_start <= e.finished_ms <= w_end)
             for n in WEIGHTS}
    shares = {n: round(100 * turns[n] / max(1, sum(turns.values())), 2) for n in WEIGHTS}
    targets = {n: round(100 * WEIGHTS[n] / total, 2) for n in WEIGHTS}
    worst = max(abs(shares[n] - targets[n]) for n in WEIGHTS)
    # Phase 2: from the idle job's last episode's end to the end of the run.
    i_start_ms = marks["idle"] * 1000
    i_end_ms = ended * 1000 - 1000  # the fleet's stop is left out
    busy = [e for e in found if e.job != idle_job]
    others = {n: sum(e.turns for e in busy if e.job == n and i_start_ms <= e.finished_ms
                     <= i_end_ms) for n in WEIGHTS if n != idle_job}
    sampled = cluster.utilisation(i_start_ms / 1000, i_end_ms / 1000)
    after_settle = cluster.utilisation(i_start_ms / 1000 + 2.0, i_end_ms / 1000)
    return {
        "slots_per_server": slots, "sequences_per_server": SLOTS,
        "weights": WEIGHTS, "backlog": backlog, "idle_job_published": len(idle_eps),
        "run_s": round(ended - started, 1),
        "weighted": {"window_s": round((w_end - w_start) / 1000, 1), "settle_s": settle_s,
                     "turns": turns,
                     "share_percent": shares, "target_percent": targets,
                     "worst_deviation_points": round(worst, 2),
                     "decode_batch": round(cluster.decode_batch(w_start / 1000, w_end / 1000), 4),
                     "met": worst <= TARGET_SHARE_POINTS},
        "idle": {"idle_job": idle_job, "window_s": round((i_end_ms - i_start_ms) / 1000, 1),
                 "turns_of_the_others": others,
                 "utilisation_sampled": round(sampled, 4),
                 "utilisation_sampled_after_2s": round(after_settle, 4),
                 "utilisation_from_log": round(log_utilisation(found, slots, i_start_ms,
                                                               i_end_ms), 4),
                 "decode_batch": round(cluster.decode_batch(i_start_ms / 1000,
                                                            i_end_ms / 1000), 4),
                 "met": sampled >= TARGET_UTILISATION},
    }


def one_job(base: Settings, seconds: float, slots: int = SLOTS,
            stage: dict[str, int] | None = None) -> dict[str, Any]:
    """One backlogged job alone on the fleet: its utilisation, episodes/s and decode batch (the
    baseline of 2, and each side of 5)."""
    cluster = Cluster(base, servers=1, slots=slots, stage=stage or {})
    marks: dict[str, float] = {}
    try:
        cluster.create("solo")
        cluster.publish("solo", int(capacity_per_s() * seconds * 1.5))

        async def scenario(fleet: Fleet) -> None:
            await until_served(fleet, {"solo"})
            while not fleet.served["solo"].runtime.stats["processed"]:
                await asyncio.sleep(0.1)
            marks["start"] = time.time()
            await asyncio.sleep(seconds)
            marks["end"] = time.time()

        asyncio.run(cluster.serve(scenario))
        found = cluster.episodes()
    finally:
        cluster.close()
    start_ms, end_ms = marks["start"] * 1000, marks["end"] * 1000
    return {"seconds": round(marks["end"] - marks["start"], 1),
            "episodes_per_s": round(sum(start_ms <= e.finished_ms <= end_ms for e in found)
                                    / (marks["end"] - marks["start"]), 2),
            "utilisation_sampled": round(cluster.utilisation(marks["start"], marks["end"]), 4),
            "utilisation_from_log": round(log_utilisation(found, slots, start_ms, end_ms), 4),
            "decode_batch": round(cluster.decode_batch(marks["start"], marks["end"]), 4)}


# -- 3: one job floods ---------------------------------------------------------------------

def flood(base: Settings, paced_s: float) -> dict[str, Any]:
    cluster = Cluster(base, servers=1)
    paced = ["p1", "p2"]
    marks: dict[str, float] = {}
    flood_tasks = int(paced_s * PACED_PER_S) * FLOOD_X
    try:
        for name in [*paced, "flood"]:
            cluster.create(name)

        async def pace(seconds: float) -> None:
            for _ in range(int(seconds * PACED_PER_S)):
                for name in paced:
                    await asyncio.to_thread(cluster.publish, name, 1)
                await asyncio.sleep(1 / PACED_PER_S)

        async def scenario(fleet: Fleet) -> None:
            await until_served(fleet, {*paced, "flood"})
            marks["alone"] = time.time()
            await pace(paced_s)
            marks["flood"] = time.time()
            await asyncio.to_thread(cluster.publish, "flood", flood_tasks)
            await pace(paced_s)
            marks["end"] = time.time()
            await asyncio.sleep(3)  # the last paced episodes finish

        asyncio.run(cluster.serve(scenario))
        found = cluster.episodes()
    finally:
        cluster.close()

    def p50(start: float, end: float) -> float:
        latencies = [e.finished_ms - e.published_ms for e in found
                     if e.job in paced and start * 1000 <= e.published_ms < end * 1000]
        return statistics.median(latencies) if latencies else float("nan")

    alone = p50(marks["alone"], marks["flood"])
    flooded = p50(marks["flood"], marks["end"])
    ratio = flooded / alone
    flood_done = sum(1 for e in found if e.job == "flood")
    return {"paced_per_s_each": PACED_PER_S, "seconds_each": paced_s, "flood_tasks": flood_tasks,
            "flood_episodes_finished": flood_done,
            "p50_latency_ms_alone": round(alone, 1), "p50_latency_ms_flooded": round(flooded, 1),
            "ratio": round(ratio, 3), "met": ratio <= TARGET_LATENCY_RATIO}


# -- 4: bursty jobs, one shared fleet vs dedicated servers -----------------------------------

def bursty(base: Settings, shared: bool, batches: int) -> dict[str, Any]:
    cluster = Cluster(base, servers=2, steps=BURSTY_STEPS)
    names = ["x", "y"]
    # A job's cycle on its own server: its batch generated at one server's rate, then trained.
    offset_s = OFFSET * (BATCH / capacity_per_s(1) + TRAIN_S)
    spans: dict[str, tuple[float, float]] = {}
    phases: list[tuple[float, float]] = []  # per batch: seconds to publish, then to process
    marks: dict[str, float] = {}
    try:
        async def scenario(fleet: Fleet) -> None:
            urls = fleet.settings.inference.policy_urls()
            for i, name in enumerate(names):
                fields = {} if shared else {"policy_urls": [urls[i]]}
                cluster.create(name, **fields)
            await until_served(fleet, set(names))
            marks["start"] = time.time()

            async def training_loop(name: str, delay_s: float) -> None:
                await asyncio.sleep(delay_s)
                started = time.time()
                for batch in range(batches):
                    before = fleet.served[name].runtime.stats["processed"]
                    publish = time.time()
                    await asyncio.to_thread(cluster.publish, name, BATCH)
                    published = time.time()
                    while fleet.served[name].runtime.stats["processed"] < before + BATCH:
                        await asyncio.sleep(0.02)
                    phases.append((published - publish, time.time() - published))
                    if batch < batches - 1:
                        await asyncio.sleep(TRAIN_S)
                spans[name] = (started, time.time())

            await asyncio.gather(*(training_loop(n, i * offset_s) for i, n in enumerate(names)))
            marks["end"] = time.time()

        asyncio.run(cluster.serve(scenario))
        found = cluster.episodes()
    finally:
        cluster.close()
    slots = SLOTS * 2
    rates = {n: batches * BATCH / (end - start) for n, (start, end) in spans.items()}
    return {"layout": "shared" if shared else "dedicated", "episodes": len(found),
            "seconds": round(marks["end"] - marks["start"], 2),
            "offset_s": round(offset_s, 3),
            "job_seconds": {n: round(end - start, 3) for n, (start, end) in spans.items()},
            "job_episodes_per_s": {n: round(r, 3) for n, r in rates.items()},
            "episodes_per_s": round(sum(rates.values()), 3),
            "batch_publish_s_mean": round(statistics.fmean(p for p, _ in phases), 3),
            "batch_processed_s_mean": round(statistics.fmean(g for _, g in phases), 3),
            "batch_processed_s": [round(g, 3) for _, g in phases],
            "batch_processed_s_ideal": round(BATCH / capacity_per_s(1 if not shared else 2), 3),
            "utilisation_sampled": round(cluster.utilisation(marks["start"], marks["end"]), 4),
            "utilisation_from_log": round(log_utilisation(
                found, slots, marks["start"] * 1000, marks["end"] * 1000), 4)}


def run(quick: bool = False) -> dict[str, Any]:
    scale = QUICK if quick else 1
    base = load(bootstrap_servers=local.resolve_bootstrap())
    per_sequence = weights_and_idle(base, WEIGHTED_S / scale, IDLE_S / scale, SLOTS,
                                    SETTLE_S / scale)
    weighted = weights_and_idle(base, WEIGHTED_S / scale, IDLE_S / scale, OVERSUBSCRIBED,
                                SETTLE_S / scale)
    alone = one_job(base, IDLE_S / scale, slots=OVERSUBSCRIBED)
    # 5: in flight bounded at the slots, so only the buffer keeps the next episode at hand.
    bounded = {"max_in_flight": OVERSUBSCRIBED}
    buffered = one_job(base, BUFFER_S / scale, OVERSUBSCRIBED, stage=bounded)
    unbuffered = one_job(base, BUFFER_S / scale, OVERSUBSCRIBED,
                         stage={**bounded, "fetch_buffer": 0})
    buffer = {"max_in_flight": OVERSUBSCRIBED, "fetch_buffer": Settings().stage.fetch_buffer,
              "buffered": buffered, "unbuffered": unbuffered,
              "episodes_per_s_ratio": round(buffered["episodes_per_s"]
                                            / max(1e-9, unbuffered["episodes_per_s"]), 3)}
    flooded = flood(base, PACED_S / scale)
    batches = max(2, BATCHES // scale)
    shared = bursty(base, shared=True, batches=batches)
    dedicated = bursty(base, shared=False, batches=batches)
    sharing = {"shared": shared, "dedicated": dedicated,
               "episodes_per_s_ratio": round(shared["episodes_per_s"]
                                             / dedicated["episodes_per_s"], 3),
               "utilisation_ratio": round(shared["utilisation_sampled"]
                                          / max(1e-9, dedicated["utilisation_sampled"]), 3)}

    w, i = weighted["weighted"], weighted["idle"]
    p = per_sequence["weighted"]
    print_table(f"weights 1:2:1, backlogged: share of completed turns (%), {OVERSUBSCRIBED} "
                f"slots per server of {SLOTS} sequences (and {SLOTS} slots)",
                ["job", "weight", "turns", "share %", "target %", f"share % at {SLOTS}"],
                [[n, WEIGHTS[n], w["turns"][n], w["share_percent"][n], w["target_percent"][n],
                  p["share_percent"][n]] for n in WEIGHTS])
    w["decode_met"] = w["decode_batch"] >= TARGET_DECODE_BATCH
    print(f"  worst deviation {w['worst_deviation_points']} points (target ≤ "
          f"{TARGET_SHARE_POINTS}): {'met' if w['met'] else 'MISSED'}; at {SLOTS} slots "
          f"{p['worst_deviation_points']}")
    print(f"  servers' decode batch {w['decode_batch']} full (target ≥ {TARGET_DECODE_BATCH}: "
          f"{'met' if w['decode_met'] else 'MISSED'}); at {SLOTS} slots {p['decode_batch']}")
    print_table("one job idle: the others take its slots",
                ["measure", "value", "target"],
                [["utilisation (in flight / slots)", i["utilisation_sampled"],
                  f"≥ {TARGET_UTILISATION}"],
                 ["  the same from 2 s after it went idle", i["utilisation_sampled_after_2s"], ""],
                 ["utilisation from the log", i["utilisation_from_log"], ""],
                 ["servers' decode batch", i["decode_batch"], ""],
                 ["baseline: one job alone (in flight / slots)", alone["utilisation_sampled"],
                  ""],
                 ["baseline: one job alone, from the log", alone["utilisation_from_log"], ""],
                 *[[f"turns of {n}", t, ""] for n, t in i["turns_of_the_others"].items()]])
    print_table("one job floods (10x): the others' p50 episode latency",
                ["alone ms", "flooded ms", "ratio", "target"],
                [[flooded["p50_latency_ms_alone"], flooded["p50_latency_ms_flooded"],
                  flooded["ratio"], f"≤ {TARGET_LATENCY_RATIO}"]])
    print_table("two bursty jobs: one shared fleet vs dedicated servers",
                ["layout", "episodes/s", "utilisation", "from the log"],
                [[r["layout"], r["episodes_per_s"], r["utilisation_sampled"],
                  r["utilisation_from_log"]] for r in (shared, dedicated)])
    print(f"  shared / dedicated: episodes/s x{sharing['episodes_per_s_ratio']} (target ≥ "
          f"{TARGET_SHARING}), utilisation x{sharing['utilisation_ratio']}")
    print_table(f"one job, at most {OVERSUBSCRIBED} in flight (its slots): the fetch buffer",
                ["fetch_buffer", "episodes/s", "utilisation", "decode batch"],
                [[buffer["fetch_buffer"], buffered["episodes_per_s"],
                  buffered["utilisation_sampled"], buffered["decode_batch"]],
                 [0, unbuffered["episodes_per_s"], unbuffered["utilisation_sampled"],
                  unbuffered["decode_batch"]]])
    print(f"  buffered / unbuffered episodes/s x{buffer['episodes_per_s_ratio']}")

    sharing["met"] = sharing["episodes_per_s_ratio"] >= TARGET_SHARING
    met = w["met"] and w["decode_met"] and i["met"] and flooded["met"] and sharing["met"]
    doc = {
        "quick": quick,
        "setup": {"sequences_per_server": SLOTS, "slots_per_server": OVERSUBSCRIBED,
                  "turn_s": TURN_S, "decode_steps_per_turn": STEPS,
                  "partitions": PARTITIONS, "episode": "one arithmetic turn",
                  "measured_from": "the jobs' committed trajectories (publish, start, end); "
                                   "utilisation also sampled from the fleet every "
                                   f"{SAMPLE_S} s"},
        "weights_and_idle": weighted, "weights_and_idle_one_slot_per_sequence": per_sequence,
        "one_job_alone": alone, "flood": flooded, "fetch_buffer": buffer,
        "bursty": {"batch": BATCH, "train_s": TRAIN_S, "batches_per_job": batches,
                   "decode_steps_per_turn": BURSTY_STEPS,
                   "offset_of_a_cycle": OFFSET, **sharing},
        "target": {"share_points": TARGET_SHARE_POINTS, "utilisation": TARGET_UTILISATION,
                   "decode_batch": TARGET_DECODE_BATCH,
                   "latency_ratio": TARGET_LATENCY_RATIO, "sharing_ratio": TARGET_SHARING,
                   "met": met},
    }
    path = write_result(NAME, doc)
    print(f"\nwrote {path}")
    return doc


if __name__ == "__main__":
    run()

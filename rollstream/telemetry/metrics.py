"""Prometheus metrics of every long-running process, served at /metrics on `--metrics-port`
beside the /health and /ready probes (rollstream.telemetry.health).

The other modules call one function here per thing worth counting, so what is measured and how
it is named lives in one place. Names follow Prometheus conventions: counters end in `_total`,
durations are in seconds. On by default (port 0: a free port, logged at start; many processes
share a host); `--metrics-port -1` turns metrics and probes off, and a stage then gets `_Off`,
whose methods do nothing (metrics on cost a forwarding stage 1.5% CPU: benchmarks/metrics.py).

Stage series carry a `stage` label (init, run, eval, bridge, train); inference series a `server`
label (the server's base URL). In a fleet (one process serving several jobs,
rollstream.service.fleet) the stage series and the per-job accounting (episodes, turns, sampled
tokens, sandbox-seconds, server-seconds, staleness) also carry `rollstream_job="<name>"`: what a
job's stage counts is counted in that job's context (`job_context`), tasks inheriting it. A process
serving one pipeline (`rollstream stage`) counts under no job, and its series have no such label, as
before. The label is not `job`: Prometheus gives every scraped series the `job` of its scrape
configuration, and would rename a `job` label of the target's to `exported_job`.
"""

from __future__ import annotations

import bisect
import contextvars
import itertools
import logging
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any, get_args
from urllib.parse import urlparse

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from rollstream.contracts.events import FailureClass
from rollstream.telemetry import health

log = logging.getLogger("rollstream.telemetry.metrics")

# Event latency: from the input record's timestamp (when it was produced) to when the stage is
# done with it; spans milliseconds (INIT) to minutes (a long RUN episode).
LATENCY_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
LATENCY_SAMPLES = 4  # events of a sync stage's batch whose latency is recorded
COMMIT_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
JOB_LABEL = "rollstream_job"

COMMIT_SECONDS = Histogram("rollstream_transaction_commit_seconds",
                           "Time to commit one transaction (offsets and outputs)", ["stage"],
                           buckets=COMMIT_BUCKETS)
ABORTS = Counter("rollstream_transaction_aborts_total",
                 "Transactions aborted (their events are redone)", ["stage"])
REBALANCES = Counter("rollstream_rebalances_total",
                     "Partition assignments, revocations and losses", ["stage", "kind"])

REWARD = Histogram("rollstream_reward", "Rewards of scored episodes (infra failures have none)",
                   ["env"], buckets=(0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1))
STALENESS = Histogram("rollstream_trained_sample_staleness_versions",
                      "Policy versions between a trained sample's oldest turn and the trainer",
                      buckets=STALENESS_BUCKETS)
POLICY_VERSION = Gauge("rollstream_policy_version", "The policy version this trainer published")
TRAIN_STEPS = Counter("rollstream_train_steps_total", "Trainer steps taken")
TRAINED_SAMPLES = Counter("rollstream_trained_samples_total", "Samples trained on")
TRAINED_TOKENS = Counter("rollstream_trained_tokens_total", "Sampled tokens trained on")

INFERENCE_REQUESTS = Counter("rollstream_inference_requests_total",
                             "Completion requests, by server and outcome (ok, error)",
                             ["server", "outcome"])
INFERENCE_RETRIES = Counter("rollstream_inference_retries_total",
                            "Failed completion requests that are tried again", ["server"])
MIGRATIONS = Counter("rollstream_episode_migrations_total",
                     "Episodes moved off a server (down, removed or ejected)", ["server"])
SERVER_LOAD = Gauge("rollstream_router_server_load", "The router's view of a server's load: "
                    "pinned episodes + other clients' requests + KV-cache use", ["server"])
SERVER_EPISODES = Gauge("rollstream_router_server_episodes", "Episodes pinned to a server",
                        ["server"])
SERVER_HEALTHY = Gauge("rollstream_router_server_healthy", "1 if a server is in rotation",
                       ["server"])
# A job's adapter on a healthy server: 1 where the server lacks the job's newest adapter (so it
# serves the job nothing), 0 where no server lists a version of it yet (the job samples the
# base model); `rollstream status --job` shows both.
ADAPTER_LACKING = Gauge("rollstream_router_adapter_lacking",
                        "1 if a server lacks the job's newest adapter; 0 while the job has none",
                        ["server", "adapter", JOB_LABEL])

CONTROLLER_APPLIED = Counter("rollstream_controller_policy_versions_applied_total",
                             "Policy versions the controller loaded into a server", ["server"])
CONTROLLER_FAILURES = Counter("rollstream_controller_update_failures_total",
                              "Weight updates a server refused or failed (retried later)",
                              ["server"])
CONTROLLER_UPDATE_SECONDS = Histogram("rollstream_controller_update_seconds",
                                      "Time to apply one policy version to one server "
                                      "(successful updates)", ["server"],
                                      buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30,
                                               60, 120, 300, 600))
CONTROLLER_SERVERS = Gauge("rollstream_controller_servers",
                           "Servers listed to the controller at its last check")
CONTROLLER_HEALTHY = Gauge("rollstream_controller_servers_healthy",
                           "Listed servers that reported their policy version at the "
                           "controller's last check")
CONTROLLER_VERSION = Gauge("rollstream_controller_latest_policy_version",
                           "The newest policy version the controller has read")

# Live sandboxes: their job and when they were created. The lock keeps a scrape from seeing a
# destroyed sandbox's time both as live and as counted (a counter must never go down).
_sandboxes: weakref.WeakKeyDictionary[Any, tuple[str, float]] = weakref.WeakKeyDictionary()
_sandbox_lock = threading.Lock()
SANDBOXES = Gauge("rollstream_sandboxes_alive", "Sandboxes created and not yet destroyed")


def _alive() -> int:
    with _sandbox_lock:
        return sum(1 for s in list(_sandboxes) if not s.closed)


SANDBOXES.set_function(_alive)

_serving = False
OFF = -1  # the --metrics-port that serves nothing


class _Handler(MetricsHandler):
    """/health and /ready (rollstream.telemetry.health) beside prometheus_client's /metrics."""

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if path == "/health":
            self._reply(200, b"ok\n", "text/plain")
        elif path == "/ready":
            ready, body = health.report()
            self._reply(200 if ready else 503, body, "application/json")
        else:
            super().do_GET()

    def _reply(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def serve(port: int, host: str = "0.0.0.0") -> int | None:
    """Serve /metrics, /health and /ready on `port` (0: a free one; OFF: nothing); call once,
    early, in a long-running process. Returns the port served (None: off)."""
    global _serving
    if port == OFF or _serving:
        return None
    server = _Server((host, port), _Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    _serving = True
    served = server.server_address[1]
    log.info("serving /metrics, /health and /ready on port %d", served)
    return served


def serving() -> bool:
    return _serving


class StageMetrics:
    """One stage process's hot-path series. Counted in plain attributes and exposed by
    `_StageCollector` when scraped: a prometheus_client Counter.inc or Histogram.observe took
    4-8 us here, more than a forwarding stage spends on an event."""

    def __init__(self, stage: str, job: str = "") -> None:
        self.stage = stage
        self.job = job
        self.consumed_n = 0
        self.dead_lettered_n = 0
        self.produced_n: defaultdict[str, int] = defaultdict(int)
        self.in_flight_n = 0
        self.paused_n = 0
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one: +Inf
        self.latency_sum = 0.0
        self._commit = COMMIT_SECONDS.labels(stage)
        self._aborts = ABORTS.labels(stage)
        _stages.add(self)

    def consumed(self, n: int = 1) -> None:
        self.consumed_n += n

    def finished(self, timestamp_ms: int) -> None:
        """An input event is done; `timestamp_ms` is its record timestamp."""
        seconds = max(0.0, time.time() - timestamp_ms / 1000)
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def finished_batch(self, msgs: list[Any]) -> None:
        """Input events (Kafka messages) just done together. A sample of them is recorded,
        evenly spaced, about LATENCY_SAMPLES: with every message recorded, metrics on cost a
        forwarding stage 11% more CPU per event (benchmarks/metrics.py)."""
        step = max(1, len(msgs) // LATENCY_SAMPLES)
        now = time.time()
        counts, bounds = self.latency_counts, LATENCY_BUCKETS
        for m in msgs[::step]:
            stamp = m.timestamp()[1]
            if stamp > 0:
                seconds = max(0.0, now - stamp / 1000)
                counts[bisect.bisect_left(bounds, seconds)] += 1
                self.latency_sum += seconds

    def produced(self, topic: str) -> None:
        self.produced_n[topic] += 1

    def dead_lettered(self) -> None:
        self.dead_lettered_n += 1

    def in_flight(self, n: int) -> None:
        self.in_flight_n = n

    def paused(self, n: int) -> None:
        self.paused_n = n

    def committed(self, seconds: float) -> None:
        self._commit.observe(seconds)

    def aborted(self) -> None:
        self._aborts.inc()

    def rebalanced(self, kind: str) -> None:
        REBALANCES.labels(self.stage, kind).inc()


class _Off(StageMetrics):
    """No metrics port: every call is a no-op."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def consumed(self, n: int = 1) -> None: ...
    def finished(self, timestamp_ms: int) -> None: ...
    def finished_batch(self, msgs: list[Any]) -> None: ...
    def produced(self, topic: str) -> None: ...
    def dead_lettered(self) -> None: ...
    def in_flight(self, n: int) -> None: ...
    def paused(self, n: int) -> None: ...
    def committed(self, seconds: float) -> None: ...
    def aborted(self) -> None: ...
    def rebalanced(self, kind: str) -> None: ...


_stages: weakref.WeakSet[StageMetrics] = weakref.WeakSet()


def _labels(labels: dict[str, str], job: str) -> dict[str, str]:
    """`labels`, with the job's where the series is a job's (the module's doc)."""
    return {**labels, JOB_LABEL: job} if job else labels


# Samples are added one by one (Metric.add_sample) because one family holds series with and
# without the job label; add_metric takes one fixed list of label names.
def _counter(family: Metric, labels: dict[str, str], value: float) -> None:
    family.add_sample(family.name + "_total", labels, value)


def _histogram(family: Metric, labels: dict[str, str], bounds: Iterable[float],
               counts: list[int], total: float) -> None:
    """A histogram's series from its per-bucket counts (the last: above every bound)."""
    cumulative = list(itertools.accumulate(counts))
    for bound, n in zip((*map(floatToGoString, bounds), "+Inf"), cumulative, strict=True):
        family.add_sample(family.name + "_bucket", {**labels, "le": bound}, n)
    family.add_sample(family.name + "_count", labels, cumulative[-1])
    family.add_sample(family.name + "_sum", labels, total)


class _StageCollector(Collector):
    """The StageMetrics of this process as Prometheus families (instances of one stage of one
    job summed)."""

    def collect(self) -> Iterator[Metric]:
        consumed = CounterMetricFamily("rollstream_events_consumed_total",
                                       "Input events a stage finished (handled or "
                                       "dead-lettered)")
        produced = CounterMetricFamily("rollstream_events_produced_total",
                                       "Events a stage produced, by destination topic")
        dead = CounterMetricFamily("rollstream_events_dead_lettered_total",
                                   "Input events sent to the dead-letter topic")
        in_flight = GaugeMetricFamily("rollstream_in_flight_events",
                                      "Events a stage is working on now")
        paused = GaugeMetricFamily("rollstream_paused_partitions",
                                   "Input partitions paused for backpressure")
        latency = HistogramMetricFamily("rollstream_event_latency_seconds",
                                        "From an input event's timestamp to the stage finishing "
                                        "it (a sync stage: a sample of each batch)")
        by_stage: dict[tuple[str, str], list[StageMetrics]] = {}
        for m in list(_stages):
            by_stage.setdefault((m.stage, m.job), []).append(m)
        for (stage, job), ms in sorted(by_stage.items()):
            labels = _labels({"stage": stage}, job)
            _counter(consumed, labels, sum(m.consumed_n for m in ms))
            _counter(dead, labels, sum(m.dead_lettered_n for m in ms))
            in_flight.add_sample(in_flight.name, labels, sum(m.in_flight_n for m in ms))
            paused.add_sample(paused.name, labels, sum(m.paused_n for m in ms))
            topics: dict[str, int] = {}
            for m in ms:
                for topic, n in list(m.produced_n.items()):
                    topics[topic] = topics.get(topic, 0) + n
            for topic, n in sorted(topics.items()):
                _counter(produced, {**labels, "topic": topic}, n)
            counts = [sum(c) for c in zip(*(list(m.latency_counts) for m in ms), strict=True)]
            _histogram(latency, labels, LATENCY_BUCKETS, counts, sum(m.latency_sum for m in ms))
        yield from (consumed, produced, dead, in_flight, paused, latency)


REGISTRY.register(_StageCollector())


def for_stage(stage: str) -> StageMetrics:
    """The stage's metrics when this process serves them, else the no-op ones; they count for
    the job whose context this is called in (`job_context`)."""
    return StageMetrics(stage, _job.get()) if _serving else _Off(stage)


# -- per-job accounting -------------------------------------------------------------------------

_job: contextvars.ContextVar[str] = contextvars.ContextVar("rollstream_job", default="")


@dataclass
class JobCounts:
    """What one job's stages counted in this process (job "": the process serves no fleet)."""

    # Every class from 0, so the first scored episodes show as an increase (rate() > 0).
    episodes: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(get_args(FailureClass), 0))
    turns: int = 0
    sampled_tokens: int = 0
    server_seconds: float = 0.0  # its completion requests' time on the inference servers
    sandbox_seconds: float = 0.0  # of its destroyed sandboxes (live ones: added when scraped)
    staleness_counts: list[int] = field(
        default_factory=lambda: [0] * (len(STALENESS_BUCKETS) + 1))
    staleness_sum: float = 0.0
    newest_version: int = -1  # the newest policy version of a turn it scored
    retries: int = 0  # episodes RUN sent back for another attempt after an infra failure
    retries_spent: int = 0  # infra failures RUN passed on with every retry spent
    # Groups the trainer bridge let go untrained, by reason.
    groups_dropped: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))


_jobs: dict[str, JobCounts] = {"": JobCounts()}


def job_context(name: str) -> contextvars.Context:
    """A copy of the current context in which what is counted counts for job `name`: build a
    job's stage and runtime with `context.run` and start its task with `context=`; the tasks
    it starts (its events' handlers) inherit it."""
    _jobs.setdefault(name, JobCounts())
    context = contextvars.copy_context()
    context.run(_job.set, name)
    return context


def forget_job(name: str) -> None:
    """Drop job `name`'s series: this process no longer serves it (paused, cancelled, deleted
    or moved), so the label's values stay as many as the jobs served. Served again, it counts
    from 0 (a counter reset, which rate() and increase() take in their stride)."""
    if not name:
        return
    _jobs.pop(name, None)
    for m in list(_stages):
        if m.job == name:
            _stages.discard(m)


def _counts() -> JobCounts:
    """The counts of the job this runs for. A count that comes after its job was forgotten (an
    episode cut off as the job stopped) goes to a throwaway: its series stay gone."""
    counts = _jobs.get(_job.get())
    return JobCounts() if counts is None else counts


class _JobCollector(Collector):
    """Each job's counts (`JobCounts`) as Prometheus families."""

    def collect(self) -> Iterator[Metric]:
        episodes = CounterMetricFamily("rollstream_episodes_total",
                                       "Episodes scored, by failure class (EVAL)")
        turns = CounterMetricFamily("rollstream_turns_total", "Agent turns sampled (RUN)")
        tokens = CounterMetricFamily("rollstream_sampled_tokens_total",
                                     "Completion tokens the inference servers sampled (RUN)")
        server = CounterMetricFamily("rollstream_server_seconds_total",
                                     "Seconds completion requests held an inference server "
                                     "(RUN): a job's share of the servers' time is its rate "
                                     "over every job's")
        sandbox = CounterMetricFamily("rollstream_sandbox_seconds_total",
                                      "Seconds sandboxes were alive, created to destroyed "
                                      "(live ones: up to now)")
        retries = CounterMetricFamily("rollstream_episode_retries_total",
                                      "Episodes played again in a fresh environment after an "
                                      "infra failure (RUN)")
        spent = CounterMetricFamily("rollstream_episode_retries_spent_total",
                                    "Infra failures passed on to EVAL with every retry spent "
                                    "(RUN)")
        dropped = CounterMetricFamily("rollstream_groups_dropped_total",
                                      "Groups the trainer bridge let go untrained, by reason")
        staleness = HistogramMetricFamily("rollstream_episode_staleness_versions",
                                          "Policy versions between a scored episode's oldest "
                                          "turn and the newest version of a turn this process "
                                          "scored for the job (EVAL)")
        with _sandbox_lock:
            now = time.monotonic()
            alive: defaultdict[str, float] = defaultdict(float)
            for job, started in list(_sandboxes.values()):
                alive[job] += now - started
            jobs = [(name, c, c.sandbox_seconds) for name, c in list(_jobs.items())]
        for name, c, sandbox_seconds in sorted(jobs, key=lambda j: j[0]):
            labels = _labels({}, name)
            for failure_class, n in list(c.episodes.items()):
                _counter(episodes, {"failure_class": failure_class, **labels}, n)
            _counter(turns, labels, c.turns)
            _counter(tokens, labels, c.sampled_tokens)
            _counter(server, labels, c.server_seconds)
            _counter(sandbox, labels, sandbox_seconds + alive[name])
            _counter(retries, labels, c.retries)
            _counter(spent, labels, c.retries_spent)
            for reason, n in list(c.groups_dropped.items()):
                _counter(dropped, {"reason": reason, **labels}, n)
            _histogram(staleness, labels, STALENESS_BUCKETS, list(c.staleness_counts),
                       c.staleness_sum)
        yield from (episodes, turns, tokens, server, sandbox, retries, spent, dropped, staleness)


REGISTRY.register(_JobCollector())


# -- domain events (one call each from the code where they happen) ---------------------------

def scored(env: str, failure_class: str, reward: float | None,
           versions: Iterable[int] = ()) -> None:
    """An episode scored; `versions`: its turns' policy versions (negative: unknown)."""
    counts = _counts()
    counts.episodes[failure_class] += 1
    if reward is not None:
        REWARD.labels(env).observe(reward)
    known = [v for v in versions if v >= 0]
    if known:
        counts.newest_version = max(counts.newest_version, *known)
        stale = counts.newest_version - min(known)
        counts.staleness_counts[bisect.bisect_left(STALENESS_BUCKETS, stale)] += 1
        counts.staleness_sum += stale


def turn(sampled_tokens: int) -> None:
    """RUN recorded an agent turn whose completion had `sampled_tokens` ids."""
    counts = _counts()
    counts.turns += 1
    counts.sampled_tokens += sampled_tokens


def retried(spent: bool) -> None:
    """RUN ended an episode as an infra failure: sent back for another attempt, or passed on
    with its retries `spent`."""
    counts = _counts()
    if spent:
        counts.retries_spent += 1
    else:
        counts.retries += 1


def group_dropped(reason: str) -> None:
    """The trainer bridge let a group go untrained (`reason`: why)."""
    _counts().groups_dropped[reason] += 1


def server_time(seconds: float) -> None:
    """A completion request held an inference server this long (whatever its outcome)."""
    _counts().server_seconds += seconds


def trained(version: int, samples: list[Any], tokens: float) -> None:
    """A trainer step produced `version` from `samples` (trainer_bridge Sample objects)."""
    POLICY_VERSION.set(version)
    TRAIN_STEPS.inc()
    TRAINED_SAMPLES.inc(len(samples))
    TRAINED_TOKENS.inc(tokens)
    for s in samples:
        if s.oldest_version is not None and s.oldest_version >= 0:
            STALENESS.observe(max(0, version - 1 - s.oldest_version))


def inference_request(server: str, ok: bool) -> None:
    INFERENCE_REQUESTS.labels(server, "ok" if ok else "error").inc()


def inference_retry(server: str) -> None:
    INFERENCE_RETRIES.labels(server).inc()


def migrated(from_server: str) -> None:
    MIGRATIONS.labels(from_server).inc()


def server_probed(server: Any) -> None:
    """The router's view of one server after a health check (routing.Server)."""
    load, _ = server.score()
    SERVER_LOAD.labels(server.url).set(load)
    SERVER_EPISODES.labels(server.url).set(server.episodes)
    SERVER_HEALTHY.labels(server.url).set(1 if server.usable else 0)


def policy_update(server: str, ok: bool, seconds: float) -> None:
    """The controller applied (or failed to apply) a policy version to one server."""
    if ok:
        CONTROLLER_APPLIED.labels(server).inc()
        CONTROLLER_UPDATE_SECONDS.labels(server).observe(seconds)
    else:
        CONTROLLER_FAILURES.labels(server).inc()


def servers_checked(version: int, listed: int, healthy: int) -> None:
    """The controller's last look at its servers, while keeping them on `version`."""
    CONTROLLER_VERSION.set(version)
    CONTROLLER_SERVERS.set(listed)
    CONTROLLER_HEALTHY.set(healthy)


def track_sandbox(sandbox: Any) -> None:
    """Count a sandbox as alive, for the job it was created for, until it is destroyed
    (`sandbox_destroyed`) or garbage."""
    with _sandbox_lock:
        _sandboxes[sandbox] = (_job.get(), time.monotonic())


def sandbox_destroyed(sandbox: Any) -> None:
    """Add a destroyed sandbox's lifetime to its job's sandbox-seconds."""
    with _sandbox_lock:
        tracked = _sandboxes.pop(sandbox, None)
        if tracked is not None and tracked[0] in _jobs:
            _jobs[tracked[0]].sandbox_seconds += time.monotonic() - tracked[1]


# -- the pipeline as `rollstream status --watch` sees it (an exporter for lag and the DLQ) -----

STAGE_LAG = Gauge("rollstream_stage_lag_events",
                  "Events on a stage group's input topic past its committed offsets", ["stage"])
STAGE_MEMBERS = Gauge("rollstream_stage_members", "Processes in a stage's consumer group",
                      ["stage"])
STAGE_COMMITTED = Gauge("rollstream_stage_committed_offsets",
                        "Sum of a stage group's committed offsets (rate(): its throughput)",
                        ["stage"])
DLQ_EVENTS = Gauge("rollstream_dead_letters", "Events on the dead-letter topic")
LATEST_POLICY = Gauge("rollstream_latest_policy_version",
                      "The newest policy version on the policy topic")


def pipeline_status(snapshot: dict[str, Any]) -> None:
    """Export one `rollstream status` snapshot."""
    for stage in snapshot["stages"]:
        STAGE_LAG.labels(stage["stage"]).set(stage["lag"])
        STAGE_MEMBERS.labels(stage["stage"]).set(len(stage["members"]))
        STAGE_COMMITTED.labels(stage["stage"]).set(stage["committed"])
    DLQ_EVENTS.set(snapshot["dlq"]["count"])
    if snapshot["policy"] is not None:
        LATEST_POLICY.set(snapshot["policy"]["version"])


# -- the HTTP API (`rollstream api`) -------------------------------------------------------------

API_REQUESTS = Counter("rollstream_api_requests_total",
                       "HTTP API requests, by route and status code", ["route", "code"])
API_TASKS = Counter("rollstream_api_tasks_total",
                    "Tasks submitted through the HTTP API (a resubmitted id counts again; INIT "
                    "rolls it out once)", ["dialect"])
API_CALLBACKS = Counter("rollstream_api_callbacks_total",
                        "Result callbacks POSTed, by outcome (delivered, failed: retried)",
                        ["outcome"])


def api_request(route: str, code: int) -> None:
    API_REQUESTS.labels(route, str(code)).inc()


def api_task(dialect: str) -> None:
    API_TASKS.labels(dialect).inc()


def api_callback(delivered: bool) -> None:
    API_CALLBACKS.labels("delivered" if delivered else "failed").inc()

"""A job's quotas on a shared fleet (rollstream.service.quotas), on the real broker with in-process
fleets: a job at a quota is paused, nothing dropped, and the other jobs go on unlimited.

- quota_episodes: a job with servers of its own, outside the fair share, keeps it too, over
  two RUN processes together;
- quota_turns_per_s: the turns sampled for the job, timed from their Turn records, stay at the
  quota while a job without one samples faster, and the paced job's share of the servers' slots
  goes to the other;
- quota_sandboxes: the job never has more sandboxes open (RUN's and EVAL's, counted from the
  backend's own leases) while a job without one opens more;
- quota_tasks_queued: INIT expands exactly the quota's tasks while RUN takes none, then the rest
  as RUN works through them, while a job without one is expanded whole.

And EVAL's fleet shares its sandboxes (scorings at once) between jobs by weight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from confluent_kafka import TopicPartition

from producers.publish import publish, validate_task
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings
from rollstream.contracts.codec import codec
from rollstream.contracts.events import Job
from rollstream.dev.simulated import SimulatedServer
from rollstream.envs import registry
from rollstream.envs.arithmetic import Arithmetic
from rollstream.envs.base import Environment, Score, StepResult
from rollstream.inference.routing import Router
from rollstream.runtime import Stage, StageRuntime
from rollstream.sandbox import Sandbox, Sandboxes, SandboxSpec, get_backend
from rollstream.service import jobs
from rollstream.service.fleet import Fleet
from rollstream.service.quotas import JobQuotas, portion
from stages.eval import EvalStage
from stages.init import InitStage
from stages.run import RunStage
from tests.helpers.sandbox_helpers import needs_bwrap

PARTITIONS = 2

# Builds a job's stage, as a fleet's MakeStage does, given the one shared router too.
MakeStage = Callable[[Settings, JobQuotas, Callable[[], int], Router], Stage]


def trajectories(settings: Settings, topic: str) -> list[dict]:
    parts = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    return [codec().decode_as("Trajectory", m.value())
            for m in kafka.read_partitions(settings, parts)]


def count(settings: Settings, topic: str) -> int:
    parts = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
    return sum(1 for _ in kafka.read_partitions(settings, parts, settle_s=0.5))


async def all_have(settings: Settings, topics: list[str], n: int) -> bool:
    """Every one of `topics` holds `n` committed records."""
    for topic in topics:
        if await asyncio.to_thread(count, settings, topic) != n:
            return False
    return True


def tasks(job: str, n: int, env: str = "arithmetic", group_size: int = 1) -> list[dict]:
    return [validate_task({"task_id": f"{job}-{i}", "env": env, "prompt": "1+1=",
                           "data": {"answer": "2"}, "group_size": group_size, "max_turns": 1})
            for i in range(n)]


def guesses(job: str, n: int, turns: int) -> list[dict]:
    """Episodes of `turns` turns each: the simulated server guesses digits, never the 15."""
    return [validate_task({"task_id": f"{job}-{i}", "env": "guess_number", "prompt": "Guess.",
                           "data": {"secret": 15, "low": 0, "high": 15}, "group_size": 1,
                           "max_turns": turns})
            for i in range(n)]


@pytest.fixture
def make_jobs(settings: Settings) -> Iterator[Callable[..., Job]]:
    made: list[str] = []

    def make(name: str, **fields: object) -> Job:
        job = jobs.new_job(name, settings.prefix, **fields)
        create_topics(settings.bootstrap_servers, job["prefix"], PARTITIONS,
                      specs=jobs.JOB_TOPICS)
        jobs.put(settings, job)
        made.append(job["prefix"])
        return job

    yield make
    for prefix in made:
        delete_topics(settings.bootstrap_servers, prefix)


async def serving(settings: Settings, stages: dict[str, MakeStage],
                  until: Callable[[dict[str, Fleet]], Awaitable[bool]],
                  timeout_s: float = 90, eval_slots: int = 0) -> None:
    """Fleets of the given stages (each its own, as separate processes would be) against one
    simulated server taking 8 episodes at once, until `until(fleets)` holds; EVAL's fleet
    shares `eval_slots` scorings at once."""
    server = SimulatedServer(step_s=lambda running: 0.005)
    url = await server.start()
    router = Router([url], max_episodes=8)
    await router.start()
    fleets = {name: Fleet(settings.override(policy_url=url, server_max_in_flight=8),
                          lambda s, quotas, share, make=make: make(s, quotas, share, router),
                          slots=(lambda: eval_slots) if name == "eval" else router.slots,
                          drain_timeout_s=5)
              for name, make in stages.items()}
    served = asyncio.gather(*(f.serve() for f in fleets.values()))
    try:
        deadline = time.monotonic() + timeout_s
        while not await until(fleets):
            assert time.monotonic() < deadline, "timed out"
            assert not served.done(), served.exception()
            await asyncio.sleep(0.1)
    finally:
        for fleet in fleets.values():
            fleet.stop()
        await served
        await router.close()
        await server.stop()


INIT = {"init": lambda s, quotas, share, router: InitStage(s, quotas=quotas)}
RUN = {"run": lambda s, quotas, share, router: RunStage(s, router=router, share=share,
                                                       quotas=quotas)}
# RUN of a job with servers of its own: its own router, outside the share.
RUN_OWN = {"run": lambda s, quotas, share, router: RunStage(s, quotas=quotas)}
EVAL = {"eval": lambda s, quotas, share, router: EvalStage(s, quotas=quotas)}
EVAL_SHARED = {"eval": lambda s, quotas, share, router: EvalStage(s, share=share,
                                                                  quotas=quotas)}


def test_turns_per_second_stay_at_the_quota(settings: Settings, make_jobs) -> None:
    paced = make_jobs("paced", quota_turns_per_s=5.0)
    free = make_jobs("free")
    per_job, turns = 6, 4
    for job in (paced, free):
        publish(jobs.job_settings(settings, job), guesses(job["name"], per_job, turns))
    done = {name: jobs.job_settings(settings, job).topics.trajectories
            for name, job in (("paced", paced), ("free", free))}

    async def finished(_: dict[str, Fleet]) -> bool:
        return await all_have(settings, list(done.values()), per_job)

    asyncio.run(serving(settings, INIT | RUN, finished))
    starts = {}
    for name, topic in done.items():
        starts[name] = sorted(turn["started_at_ms"]
                              for trajectory in trajectories(settings, topic)
                              for turn in trajectory["turns"])
        assert len(starts[name]) == per_job * turns  # all of them: paced, never dropped
    # Paced at 5 a second (a busy machine only slows it); 2 ms of slack for the ms stamps.
    n = per_job * turns
    span_s = (starts["paced"][-1] - starts["paced"][0]) / 1000
    assert (n - 1) / span_s <= (n - 1) / ((n - 1) / 5.0 - 0.002), starts["paced"]
    # The other job is not held to it: its episodes run side by side, so most of its turns
    # start sooner after the one before than the quota's 200 ms would allow. Gaps, not a rate:
    # a busy machine slows the turns (a CI run measured 10.7 a second, under the 15 this test
    # once asked for), but does not serialize episodes that are in flight together.
    gaps = [b - a for a, b in zip(starts["free"], starts["free"][1:], strict=False)]
    assert sum(gap < 200 - 2 for gap in gaps) > len(gaps) / 2, gaps


class SplitJob:
    """A job served by two RUN fleets, "run" and "run too" (two processes): its episodes are
    published once each fleet holds one of its two partitions; `held` is what the two held at
    each look, `runtimes` the job's runtimes in them."""

    def __init__(self, settings: Settings, job: Job, episodes: list[dict]) -> None:
        self.job, self.settings, self.episodes = job, jobs.job_settings(settings, job), episodes
        self.held: list[list[set[int]]] = []
        self.published = False

    async def runtimes(self, fleets: dict[str, Fleet]) -> list[StageRuntime]:
        name = self.job["name"]
        runtimes = [f.served[name].runtime for f in (fleets["run"], fleets["run too"])
                    if name in f.served]
        self.held.append(sorted((set(r.loop.held.progress) for r in runtimes), key=sorted))
        if not self.published and self.held[-1] == [{0}, {1}]:  # split: the work goes in
            await asyncio.to_thread(publish, self.settings, self.episodes)
            self.published = True
        return runtimes

    async def finished(self) -> bool:
        return await all_have(self.settings, [self.settings.topics.trajectories],
                              len(self.episodes))


def test_the_turn_quota_holds_over_the_fleet_not_in_each_process(settings: Settings,
                                                                 make_jobs) -> None:
    """Two RUN processes serving the job (one of its two partitions each) pace its turns
    together at the quota, each at half of it: each at the whole quota, they sampled twice it."""
    per_job, turns = 8, 4
    split = SplitJob(settings, make_jobs("paced", quota_turns_per_s=5.0),
                     guesses("paced", per_job, turns))

    async def finished(fleets: dict[str, Fleet]) -> bool:
        await split.runtimes(fleets)
        return await split.finished()

    asyncio.run(serving(settings, INIT | RUN | {"run too": RUN["run"]}, finished))
    starts = sorted(turn["started_at_ms"]
                    for trajectory in trajectories(settings, split.settings.topics.trajectories)
                    for turn in trajectory["turns"])
    n = per_job * turns
    assert len(starts) == n
    assert split.held[-1] == [{0}, {1}], split.held[-1]  # both took part to the end
    # Each process's bucket holds one token: n turns take at least (n - 2) / quota seconds.
    span_s = (starts[-1] - starts[0]) / 1000
    assert span_s >= (n - 2) / 5.0 - 0.01, (span_s, starts)


def test_a_paced_job_leaves_its_slots_to_the_others(settings: Settings, make_jobs) -> None:
    """A job whose next turn must wait takes no episodes, and its share of the servers' slots
    goes to a backlogged job beside it (work-conserving): without that, at equal weights, the
    other job would hold half of the 8 slots (measured: 4 at every look)."""
    paced = make_jobs("paced", quota_turns_per_s=2.0)
    free = make_jobs("free")
    publish(jobs.job_settings(settings, paced), tasks("paced", 40))
    publish(jobs.job_settings(settings, free), guesses("free", 80, turns=30))
    held: list[int] = []

    async def sampled(fleets: dict[str, Fleet]) -> bool:
        run = fleets["run"]
        if {"paced", "free"} <= set(run.served) and run.served["paced"].runtime.in_flight < 2:
            runtime = run.served["free"].runtime
            if 0 < runtime.stats["processed"] < 60:  # both backlogged
                held.append(runtime.in_flight + run.allowance("free"))
        return len(held) >= 30

    asyncio.run(serving(settings, INIT | RUN, sampled))
    assert sum(held) / len(held) >= 5, held  # measured: about 7


def test_a_job_with_servers_of_its_own_keeps_its_episode_quota(settings: Settings,
                                                                make_jobs) -> None:
    """Outside the fair share (its own servers, which take 8 at once) a job's quota_episodes
    still bounds RUN's episodes of it in flight."""
    per_job = 12
    most = [0]

    async def main() -> None:
        own = SimulatedServer(step_s=lambda running: 0.05)  # episodes long enough to overlap
        job = make_jobs("own", policy_urls=[await own.start()], quota_episodes=2)
        publish(jobs.job_settings(settings, job), guesses("own", per_job, turns=4))
        trajectories = jobs.job_settings(settings, job).topics.trajectories

        async def finished(fleets: dict[str, Fleet]) -> bool:
            served = fleets["run"].served.get("own")
            if served is not None:
                most[0] = max(most[0], served.runtime.in_flight)
            return await all_have(settings, [trajectories], per_job)

        try:
            await serving(settings, INIT | RUN_OWN, finished)
        finally:
            await own.stop()

    asyncio.run(main())
    assert most[0] == 2


def test_the_episode_quota_holds_over_the_fleet_not_in_each_process(settings: Settings,
                                                                    make_jobs) -> None:
    """Two RUN processes serving a job with servers of its own (one of its two partitions each)
    keep its quota_episodes=2 together, one each: each at the whole quota, they would hold 4."""
    most = [0]

    async def main() -> None:
        own = SimulatedServer(step_s=lambda running: 0.05)  # episodes long enough to overlap
        job = make_jobs("own", policy_urls=[await own.start()], quota_episodes=2)
        split = SplitJob(settings, job, guesses("own", 16, turns=4))

        async def finished(fleets: dict[str, Fleet]) -> bool:
            most[0] = max(most[0], sum(r.in_flight for r in await split.runtimes(fleets)))
            return await split.finished()

        try:
            await serving(settings, INIT | RUN_OWN | {"run too": RUN_OWN["run"]}, finished)
        finally:
            await own.stop()
        assert split.held[-1] == [{0}, {1}], split.held[-1]  # both took part to the end

    asyncio.run(main())
    assert most[0] == 2, most[0]


def test_the_portions_of_an_episode_quota_add_up_to_it() -> None:
    """Split by partitions, the processes' portions add up to the quota; each has at least one
    (the documented going over, when there are more processes than the quota)."""
    for count in range(1, 7):
        for quota in range(1, 14):
            ones = [portion(quota, {p}, count) for p in range(count)]
            assert sum(ones) == max(quota, count), (quota, count, ones)
            halves = [portion(quota, set(range(i, count, 2)), count) for i in (0, 1)]
            if count > 1 and quota >= 2:
                assert sum(halves) == quota, (quota, count, halves)
    assert portion(0, {0}, 4) == 0 and portion(5, {0}, 0) == 5  # none; count not known yet


class SlowScore(Arithmetic):
    """Arithmetic whose scoring takes 0.2 s, as a test run in a sandbox would."""

    name = "slow_score"

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        await asyncio.sleep(0.2)
        return await super().evaluate(task, trajectory)


def test_backlogged_jobs_share_evals_sandboxes_by_weight(settings: Settings, make_jobs,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two backlogged jobs, weights 1 and 3, on one EVAL fleet that scores 4 at once: while
    both have trajectories waiting they get 1 and 3 of the 4 (RUN's fair share, for EVAL)."""
    monkeypatch.setattr(registry, "_environments",
                        lambda: {**registry.BUILTINS, SlowScore.name: SlowScore})
    weights = {"x": 1, "y": 3}
    for name, weight in weights.items():
        job = make_jobs(name, weight=weight)
        publish(jobs.job_settings(settings, job), tasks(name, 60, env="slow_score"))
    samples: dict[str, list[int]] = {"x": [], "y": []}

    async def sampled(fleets: dict[str, Fleet]) -> bool:
        scoring = fleets["eval"]
        runtimes = {name: s.runtime for name, s in scoring.served.items()}
        # Once both have started (no preemption) while both have trajectories waiting: the
        # slots each holds or may take now. (A job with none waiting leaves its slots to the
        # other: on a loaded machine RUN fell behind for job y, and x's share read 0.37.)
        if len(runtimes) == 2 and all(0 < r.stats["processed"] < 50 and r.waiting > 0
                                      for r in runtimes.values()):
            for name, runtime in runtimes.items():
                samples[name].append(runtime.in_flight + scoring.allowance(name))
        return len(samples["x"]) >= 15

    asyncio.run(serving(settings, INIT | RUN | EVAL_SHARED, sampled, eval_slots=4))
    share_x = sum(samples["x"]) / (sum(samples["x"]) + sum(samples["y"]))
    assert 0.2 <= share_x <= 0.3, samples  # its weight's share, 1 of the 4


class Sandboxed(Environment):
    """Holds a sandbox for each episode in RUN (from reset to close) and one while EVAL scores."""

    name = "sandboxed"
    description = "a sandbox per episode and per scoring"
    live: dict[str, Sandbox] = {}

    async def reset(self, task: dict) -> dict:
        sandbox = await self.sandboxes.create(SandboxSpec(labels={"stage": "run"}))
        self.live[sandbox.id] = sandbox
        return {"sandbox": sandbox.id}

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        await asyncio.sleep(0.3)
        return StepResult(None, True, None, state)

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        async with await self.sandboxes.create(SandboxSpec(labels={"stage": "eval"})):
            await asyncio.sleep(0.3)
        return Score(1.0, "ok", {})

    def validate_task(self, task: dict) -> None:
        pass

    async def close(self, task: dict, state: dict) -> None:
        await self.live.pop(state["sandbox"]).destroy()


def test_a_job_never_has_more_sandboxes_open_than_its_quota(
        settings: Settings, make_jobs, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(registry, "_environments",
                        lambda: {**registry.BUILTINS, Sandboxed.name: Sandboxed})
    # Handed to the stages with their settings, as a fleet's process does.
    settings = settings.override(sandbox="bwrap", sandbox_root=str(tmp_path))
    made = {"capped": make_jobs("capped", quota_sandboxes=2), "open": make_jobs("open")}
    per_job = 8
    for name, job in made.items():
        publish(jobs.job_settings(settings, job), tasks(name, per_job, env="sandboxed"))
    scored = {name: jobs.job_settings(settings, job).topics.scored for name, job in made.items()}
    most = dict.fromkeys(made, 0)
    backend = get_backend("bwrap", settings.sandbox)
    done = threading.Event()

    def look() -> None:
        # Its own thread, a look every 20 ms, so a busy check of the scored topics can never
        # leave a gap in which a whole burst of sandboxes opens and closes unseen.
        while not done.wait(0.02):
            leases = backend.leases()
            for name in made:
                most[name] = max(most[name], sum(1 for lease in leases
                                                 if lease.labels.get("job") == name))

    async def finished(_: dict[str, Fleet]) -> bool:
        return await all_have(settings, list(scored.values()), per_job)

    looker = threading.Thread(target=look, daemon=True)
    looker.start()
    try:
        asyncio.run(serving(settings, INIT | RUN | EVAL, finished, timeout_s=50))
    finally:
        done.set()
        looker.join(timeout=10)
    assert most["capped"] == 2, most  # at its quota, never past it
    assert most["open"] > 2, most
    assert backend.leases() == []  # every sandbox destroyed


@needs_bwrap
def test_sandboxes_handed_a_jobs_quotas_label_them_and_wait_for_a_slot(tmp_path) -> None:
    """Without Kafka: the job's quotas, handed to Sandboxes, hold a second sandbox back while
    the one slot of quota_sandboxes=1 is taken, and label each with the job's name."""
    settings = Settings().override(sandbox="bwrap", sandbox_root=str(tmp_path))
    quotas = JobQuotas(jobs.new_job("capped", "cluster", quota_sandboxes=1), settings, "run")
    sandboxes = Sandboxes(settings.sandbox, quotas)
    backend = sandboxes.backend("bwrap")

    async def main() -> None:
        first = await sandboxes.create(SandboxSpec())
        second = asyncio.ensure_future(sandboxes.create(SandboxSpec()))
        await asyncio.sleep(1.0)
        assert not second.done()  # waiting for the slot
        assert [lease.labels["job"] for lease in backend.leases()] == ["capped"]
        await first.destroy()
        await (await asyncio.wait_for(second, 10)).destroy()

    asyncio.run(main())
    assert backend.leases() == []


def test_init_stops_taking_a_jobs_tasks_at_its_queue_quota(settings: Settings,
                                                            make_jobs) -> None:
    queued = make_jobs("queued", quota_tasks_queued=3)
    whole = make_jobs("whole")
    group, per_job = 2, 10
    for job in (queued, whole):
        publish(jobs.job_settings(settings, job), tasks(job["name"], per_job, group_size=group))
    episodes = {job["name"]: jobs.job_settings(settings, job).topics.episodes
                for job in (queued, whole)}
    trajectories = jobs.job_settings(settings, queued).topics.trajectories

    async def expanded(_: dict[str, Fleet]) -> bool:
        if not await all_have(settings, [episodes["whole"]], per_job * group):
            return False
        await asyncio.sleep(3)  # INIT has had time to take more of the other job, were it to
        return True

    # No RUN: nothing of the job's starts, so INIT stops at its quota of 3 tasks.
    asyncio.run(serving(settings, INIT, expanded))
    assert count(settings, episodes["queued"]) == 3 * group

    async def ran(_: dict[str, Fleet]) -> bool:
        return await all_have(settings, [trajectories], per_job * group)

    asyncio.run(serving(settings, INIT | RUN, ran))  # RUN works: the rest comes, none dropped
    assert count(settings, episodes["queued"]) == per_job * group

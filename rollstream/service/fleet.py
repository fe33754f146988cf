"""A shared fleet: one process serving one stage of every RUNNING job on the cluster.

The fleet follows the cluster's jobs topic (rollstream.service.jobs) and runs, in one process and
one asyncio loop, one StageRuntime per job it serves, each with that job's settings (its prefix,
policy, admission window): each job's runtime is the ordinary exactly-once runtime with its own
consumer group `<job prefix>.<stage>` and transactional id, so every per-job guarantee holds
unchanged. The runtimes share the loop fairly (`StageRuntime(shared=True)`: an idle one yields
instead of blocking), and the fleet owns the signals.

- A job created (or resumed) while the fleet runs is started at the next look (`LOOK_S`).
- A job paused, cancelled, deleted or moved to another fleet: its runtime stops taking events,
  lets in-flight ones finish within the drain timeout, commits and leaves its group; what did
  not finish is closed (RUN and EVAL close their sandboxes when an episode is cancelled) and
  is resumed by whoever serves the job next. No transaction stays open.
- A job whose settings changed (its adapter, servers or admission window) is restarted so.
- A runtime that fails is logged and started again after `RETRY_S`; the other jobs go on. One
  refused by the cluster (the fleet's principal has no grant on the job's prefix) fails alone
  and is tried again after `REFUSED_RETRY_S`, when a grant may have come; the fleet's own login
  refused stops the process where it reads the jobs topic.
- Each job's stage runs in its metrics context (rollstream.telemetry.metrics.job_context), so its
  series carry its name; a job no longer served loses its series (`metrics.forget_job`).

Fair share: RUN's jobs on the shared servers get `allowance` as their capacity, the weighted
work-conserving share of the servers' slots (rollstream.service.fairshare), planned once per round
of the jobs' asks (a `Plan`), not once per ask; EVAL's jobs, so, the share of the fleet's sandboxes
(scorings at once) where it has a bound. Quotas: each job's stage is built with the job's
JobQuotas (rollstream.service.quotas), which are its runtime's limit too. Which jobs a fleet serves:
those that name no group, or, with `fleet=NAME`, those that name that group (a dedicated fleet).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rollstream.cluster.kafka_errors import AccessDenied
from rollstream.config import Settings
from rollstream.consume.stopping import Stopping
from rollstream.contracts.events import Job
from rollstream.runtime import Stage, StageRuntime
from rollstream.service.fairshare import Demand, Plan
from rollstream.service.jobs import ACTIVE, JobReader, job_settings
from rollstream.service.quotas import JobQuotas
from rollstream.telemetry import metrics

log = logging.getLogger("rollstream.service.fleet")

LOOK_S = 0.5  # how often the jobs topic is looked at
RETRY_S = 5.0  # how long a job whose runtime failed waits before it is started again
REFUSED_RETRY_S = 30.0  # the same for a job the cluster refused the fleet: a grant is slower
# A job wants work while events it fetched wait for its share (StageRuntime.waiting), and until
# its polls have found nothing for this long: a partition paused or newly assigned fetches again
# only after a delay of up to the client's fetch wait (0.5 s by default). A job whose input did
# run out keeps first claim on free slots that long, so it is kept short.
WANTS_S = 0.6

# Builds a job's stage from its settings and quotas (`quotas.job`: its record); the callable is
# its fair share.
MakeStage = Callable[[Settings, JobQuotas, Callable[[], int]], Stage]


@dataclass
class Served:
    job: Job
    settings: Settings
    runtime: StageRuntime
    task: asyncio.Task[None]
    quotas: JobQuotas


class Fleet:
    def __init__(self, settings: Settings, make_stage: MakeStage, *, fleet: str | None = None,
                 drain_timeout_s: float = 30.0, slots: Callable[[], int] = lambda: 0) -> None:
        """`settings`: the fleet's, under the cluster's prefix (where the jobs topic is);
        `slots`: what the jobs share by weight: for RUN, how many episodes the shared servers
        take at once; for EVAL, how many scorings (each with at most one sandbox) run at once."""
        self.settings = settings
        self.make_stage = make_stage
        self.fleet = fleet
        self.drain_timeout_s = drain_timeout_s
        self.slots = slots
        self.stopping = Stopping(drain_timeout_s)
        self.served: dict[str, Served] = {}
        self._retry_at: dict[str, float] = {}
        self.plan = Plan(slots, self._demands)

    def serves(self, job: Job) -> bool:
        return job["state"] in ACTIVE and job["group"] == self.fleet

    def stop(self) -> None:
        self.stopping.ask()

    async def serve(self) -> None:
        """Serve the jobs until stopped; then stop every job's runtime and wait for them."""
        reader = JobReader(self.settings)
        log.info("fleet %s: following %s", self.fleet or "(shared)", self.settings.topics.jobs)
        try:
            while not self.stopping.asked:
                reader.poll()
                self._reap()
                if reader.at_end:  # never act on a partial view of the jobs
                    self._reconcile(reader.jobs)
                await asyncio.sleep(LOOK_S)
        finally:
            for served in self.served.values():
                served.runtime.stop()
            await asyncio.gather(*(s.task for s in self.served.values()),
                                 return_exceptions=True)
            self._reap()
            reader.close()

    def _reconcile(self, jobs: dict[str, Job]) -> None:
        for name, served in self.served.items():
            job = jobs.get(name)
            if (job is None or not self.serves(job)
                    or job_settings(self.settings, job) != served.settings):
                if not served.runtime.stopping.asked:
                    log.info("fleet: stopping job %s (%s)", name,
                             "deleted" if job is None else job["state"])
                    served.runtime.stop()
            else:
                # Weight, quotas and priority count from now on.
                served.job = served.quotas.job = job
        now = time.monotonic()
        for name, job in jobs.items():
            if name not in self.served and self.serves(job) and now >= self._retry_at.get(name, 0):
                self._start(job)

    def _start(self, job: Job) -> None:
        settings = job_settings(self.settings, job)
        context = metrics.job_context(job["name"])  # what its stage counts carries its name
        quotas = JobQuotas(job, settings)
        stage = context.run(self.make_stage, settings, quotas,
                            functools.partial(self.allowance, job["name"]))
        quotas.stage = stage.name
        runtime = context.run(StageRuntime, stage, settings, self.drain_timeout_s, shared=True,
                              label=f"job {job['name']}", limit=quotas.room)
        quotas.holding = runtime.loop.holding
        log.info("fleet: serving job %s (prefix %s) as group %s", job["name"], job["prefix"],
                 runtime.group)
        task = asyncio.create_task(_serve_job(runtime), name=f"job {job['name']}",
                                   context=context)
        self.served[job["name"]] = Served(job, settings, runtime, task, quotas)

    def _reap(self) -> None:
        """Forget the runtimes that ended; one that failed is started again later."""
        for name, served in list(self.served.items()):
            if not served.task.done():
                continue
            del self.served[name]
            served.runtime.loop.health.close()
            served.quotas.close()
            error = None if served.task.cancelled() else served.task.exception()
            if isinstance(error, JobRefused):
                log.error("fleet: job %s refused: %s; starting it again in %.0f s", name,
                          error, REFUSED_RETRY_S)
                self._retry_at[name] = time.monotonic() + REFUSED_RETRY_S
            elif error is not None:
                log.error("fleet: job %s failed; starting it again in %.0f s", name, RETRY_S,
                          exc_info=error)
                self._retry_at[name] = time.monotonic() + RETRY_S
            else:
                log.info("fleet: job %s stopped", name)
                metrics.forget_job(name)

    def allowance(self, name: str) -> int:
        """How many more episodes job `name` may start now on the shared servers."""
        served = self.served.get(name)
        return 0 if served is None else self.plan.allowance(name, served.runtime.in_flight)

    def _demands(self) -> dict[str, Demand]:
        recent = time.monotonic() - WANTS_S
        return {
            n: Demand(weight=s.job["weight"], in_flight=s.runtime.in_flight,
                      started=s.runtime.started, ready=s.runtime.waiting > 0,
                      # A job its quotas hold back wants nothing: its share is the others'.
                      wants=((s.runtime.waiting > 0
                              or _wants(s.runtime.loop.empty_since, recent))
                             and s.quotas.room(s.runtime.in_flight) != 0),
                      quota=s.quotas.episode_quota(),
                      priority=s.job["priority"])
            # RUN: a job with servers of its own is outside the share of the shared ones.
            for n, s in self.served.items()
            if s.runtime.stage.name != "run" or not s.job["policy_urls"]
        }


class JobRefused(Exception):
    """The cluster refused the fleet one of a job's topics, groups or transactional ids."""


async def _serve_job(runtime: StageRuntime) -> None:
    """A job's runtime, whose refusal (AccessDenied, a SystemExit that would end the process
    and every other job with it) fails this job alone."""
    try:
        await runtime.serve()
    except AccessDenied as exc:
        raise JobRefused(exc.message) from None


def _wants(empty_since: float | None, recent: float) -> bool:
    return empty_since is None or empty_since > recent

"""One cluster, pipeline and API process for tests/api (they take a minute to start on a busy
machine; the tests are in one file because the suite's workers take whole files): jobs alpha
(its pipeline runs) and beta (tokens only), each with a token."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from rollstream.cluster.topics import delete_topics
from rollstream.config import Settings
from rollstream.dev.processes import ProcessGroup
from tests.helpers.api_helpers import Api, Cluster, new_cluster, pipeline


@dataclass
class ApiSetup:
    cluster: Cluster
    alpha: Settings  # job alpha's settings (its prefix)
    procs: ProcessGroup
    api: Api
    run_args: list[str]
    run_name: str = "run"  # RUN's process now
    restarts: int = 0

    @contextmanager
    def run_held_back(self) -> Iterator[None]:
        """Nothing finishes inside: RUN is stopped, and started again after."""
        self.procs.stop(self.run_name)
        try:
            yield
        finally:
            self.restarts += 1
            self.run_name = f"run-{self.restarts}"
            self.procs.start(self.run_name, "stage", "run", *self.run_args)


@pytest.fixture(scope="package")
def setup(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiSetup]:
    cluster = new_cluster(bootstrap)
    for name in ("alpha", "beta"):
        cluster.create_job(name)
        cluster.tokens[name] = cluster.token(name)
    procs = ProcessGroup(tmp_path_factory.mktemp("api-logs"))
    alpha = cluster.job_settings("alpha")
    try:
        run_args = pipeline(procs, alpha)
        api = Api(procs, cluster, "--deadline-grace", "1")
        api.start()
        yield ApiSetup(cluster, alpha, procs, api, run_args)
    finally:
        procs.stop_all()
        delete_topics(bootstrap, cluster.prefix, whole_namespace=True)

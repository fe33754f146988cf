"""Per-job tokens: another job's token is refused on this job's tasks, results and events; no
token, a wrong one, a revoked one get 401; an API for one job refuses the others'; a rotated
token replaces the old; no token is in any process's log or the CLI's output but its once.
HTTPS with a certificate."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rollstream.broker.secure import material
from rollstream.service import jobs
from tests.api.conftest import ApiSetup
from tests.helpers.api_helpers import Api, wait_until
from tests.helpers.seed_api_models import AgentSpec, EvaluatorSpec, TaskRequest


def test_another_jobs_token_is_refused(setup: ApiSetup) -> None:
    api, alpha, beta = setup.api, setup.cluster.tokens["alpha"], setup.cluster.tokens["beta"]
    request = TaskRequest(task_id="mine", instruction="1+1=", num_samples=1,
                          agent=AgentSpec(harness="rollstream"),
                          evaluator=EvaluatorSpec(strategy="arithmetic", config={"answer": "2"}))
    assert api.call("POST", "/jobs/alpha/rollout/task/submit", alpha,
                    request.model_dump())[0] == 200
    for method, path in (("GET", "/jobs/alpha/rollout/task/mine"),
                         ("DELETE", "/jobs/alpha/rollout/task/mine"),
                         ("GET", "/jobs/alpha/events"), ("GET", "/jobs/alpha/status"),
                         ("POST", "/jobs/alpha/rollout/task/submit")):
        status, body = api.call(method, path, beta, request.model_dump())
        assert (status, body) == (403, {"detail": "the token is not job alpha's"}), path
    # At the root the token is its job's: beta's namespace holds no task of alpha's.
    assert api.call("GET", "/rollout/task/mine", beta)[0] == 404
    assert api.call("GET", "/rollout/task/mine", alpha)[0] == 200
    for token in (None, "rst_00000000_" + "x" * 43, "not-a-token"):
        status, body = api.call("GET", "/rollout/task/mine", token)
        assert status == 401 and "detail" in body


def test_a_job_whose_topics_cannot_be_read_is_answered_503(setup: ApiSetup) -> None:
    cluster = setup.cluster
    jobs.put(cluster.settings, jobs.new_job("gamma", cluster.prefix))  # no topics made
    token = cluster.token("gamma")
    wait_until(lambda: setup.api.call("GET", "/rollout/task/x", token)[0] != 401,
               "the token", setup.procs, 30)
    status, body = setup.api.call("GET", "/rollout/task/x", token, timeout=60)
    assert status == 503 and "do not exist" in body["detail"]


def test_one_job_api_over_tls_rotation_revocation_and_no_token_in_output(
        setup: ApiSetup, tmp_path: Path) -> None:
    cluster = setup.cluster
    # Over HTTPS, with the secured broker's certificate (127.0.0.1 is in its names).
    only_alpha = Api(setup.procs, cluster, "--job", "alpha", tls=material(tmp_path / "tls"))
    only_alpha.start()
    assert only_alpha.url.startswith("https://")
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(only_alpha.url + "/health", timeout=10)  # not trusted: no CA
    assert only_alpha.call("GET", "/status", cluster.tokens["beta"])[0] == 403
    assert only_alpha.call("GET", "/status", cluster.tokens["alpha"])[0] == 200

    second = cluster.token("alpha")
    assert only_alpha.call("GET", "/status", second)[0] in (200, 401)  # read within a poll
    wait_until(lambda: only_alpha.call("GET", "/status", second)[0] == 200, "a new token",
               setup.procs, 30)
    [first_id, second_id] = cluster.token("alpha", "list").split()
    assert second.startswith(f"rst_{second_id}_")
    assert cluster.revoke("alpha", second_id) == f"job alpha: API token {second_id} revoked"
    wait_until(lambda: only_alpha.call("GET", "/status", second)[0] == 401, "the revocation",
               setup.procs, 30)
    assert only_alpha.call("GET", "/status", cluster.tokens["alpha"])[0] == 200

    rotated = cluster.token("beta", "rotate")
    old_beta, cluster.tokens["beta"] = cluster.tokens["beta"], rotated
    wait_until(lambda: setup.api.call("GET", "/status", old_beta)[0] == 401, "the rotation",
               setup.procs, 30)
    assert setup.api.call("GET", "/status", rotated)[0] == 200
    assert first_id == cluster.tokens["alpha"].split("_")[1]

    only_alpha.stop()  # SIGTERM: a clean exit

    tokens = [cluster.tokens["alpha"], second, old_beta, rotated]
    logs = [p.read_text(errors="replace") for p in setup.procs.log_dir.glob("*.log")]
    assert logs and not [t for t in tokens for text in logs if t in text]
    printed = [o for o in cluster.outputs if any(t in o for t in tokens)]
    assert all(o.strip() in tokens for o in printed)  # a token printed alone, at its creation


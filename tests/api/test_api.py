"""The HTTP API (`rollstream api`) on a real pipeline, driven over HTTP with the seed's own
request and response models (tests/helpers/seed_api_models.py). One file, so that one pipeline
and API process (tests/api/conftest.py) serve every test of the suite's run (its workers take
whole files).

- ProRL Agent: `/process` answers the scored trajectory's ids, whole prompts and logprobs; the
  same job_id again is the same single rollout; the control routes; `/cancel`.
- Polar: submit → events → poll → result with a callback (retried past a failure), traces equal
  to the scored records; cancels; deadlines.
- Tokens: another job's token refused (403) on this job's tasks, results and events; 401 without
  one, wrong, revoked or rotated away; an API for one job; HTTPS; no token in any output.
- The API process SIGKILLed with 64 tasks accepted and unfinished: each completes exactly once.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from rollstream.broker.secure import material
from rollstream.contracts.codec import unpack_ids, unpack_logprobs
from rollstream.service import jobs
from tests.api.conftest import ApiSetup
from tests.helpers.api_helpers import Api, EventReader, Receiver, records, scored, wait_until
from tests.helpers.seed_api_models import (
    AgentSpec,
    CancelRequest,
    EvaluatorSpec,
    LLMServerRequest,
    ProcessRequest,
    ProcessResult,
    TaskRequest,
    TaskResult,
    TaskStatus,
)

# -- prorl -------------------------------------------------------------------------------

def _request(job_id: str, i: int) -> ProcessRequest:
    instance = ({"data_source": "guess_number", "prompt": "Guess 0-9.", "instance_id": job_id,
                 "data": {"secret": i % 10, "low": 0, "high": 9}, "max_turns": 3}
                if i % 2 else
                {"data_source": "arithmetic", "prompt": f"{i}+2=", "instance_id": job_id,
                 "data": {"answer": str(i + 2)}})
    return ProcessRequest(instance=instance, job_id=job_id,
                          sampling_params={"temperature": 1.0, "max_output_tokens": 6})


def test_process_answers_the_scored_trajectory_once(setup: ApiSetup) -> None:
    api, token = setup.api, setup.cluster.tokens["alpha"]
    assert api.call("POST", "/start", token) == (200, {"status": "Server started successfully"})
    results = {}
    for i in range(4):
        request = _request(f"p{i}", i)
        status, body = api.call("POST", "/process", token, request.model_dump())
        assert status == 200, body
        results[request.job_id] = ProcessResult.model_validate(body)

    log = scored(setup.alpha)
    for job_id, result in results.items():
        records = log[f"prorl:{job_id}#0"]
        assert len(records) == 1
        turns = records[0]["trajectory"]["turns"]
        assistant = [m for m in result.messages if m.role == "assistant"]
        assert len(assistant) == len(turns) >= 1
        assert result.messages[-1].role == "assistant"
        assert result.instance_id == job_id
        context: list[int] = []
        for message, turn in zip(assistant, turns, strict=True):
            assert message.token_ids == unpack_ids(turn["completion_ids"]).tolist()
            assert np.array_equal(np.asarray(message.logprobs, dtype=np.float32),
                                  unpack_logprobs(turn["logprobs"]))
            prompt = unpack_ids(turn["prompt_ids"]).tolist()
            context = prompt if turn["index"] == 0 or turn["new_sample"] else context + prompt
            assert message.input_ids == context  # the whole prompt of that call
            context = context + message.token_ids
        assert result.success == (records[0]["failure_class"] in ("ok", "truncated"))
        assert result.resolved == (records[0]["reward"] == 1.0)
        assert result.timing is not None and result.timing.counted_elapsed >= 0
    assert any(len(r.messages) > 2 for r in results.values())  # a multi-turn one among them

    # A caller that reconnects with the same job_id gets the same trajectory, no second one.
    status, again = api.call("POST", "/process", token, _request("p1", 1).model_dump())
    assert status == 200
    assert ProcessResult.model_validate(again) == results["p1"]
    assert len(scored(setup.alpha)["prorl:p1#0"]) == 1


def test_control_routes(setup: ApiSetup) -> None:
    api, token = setup.api, setup.cluster.tokens["alpha"]
    status, body = api.call("GET", "/status", token)
    assert status == 200 and body["status"] == "running" and body["pending_jobs"] == 0
    status, body = api.call("POST", "/cancel", token, CancelRequest(job_id="nope").model_dump())
    assert (status, body) == (200, {"status": "Cancel requested for job nope"})

    address = "http://127.0.0.1:8000/v1"
    status, body = api.call("POST", "/add_llm_server", token,
                            LLMServerRequest(address=address).model_dump())
    assert (status, body) == (200, {"status": f"Added LLM server address: {address}"})
    assert jobs.get(setup.cluster.settings, "alpha")["policy_urls"] == ["http://127.0.0.1:8000"]
    status, _ = api.call("POST", "/clear_llm_server", token)
    assert status == 200
    assert jobs.get(setup.cluster.settings, "alpha")["policy_urls"] == []

    # A request the model refuses names the field; an unknown environment is named too.
    status, body = api.call("POST", "/process", token, {"instance": {}})
    assert status == 422 and body["detail"][0]["loc"] == ["sampling_params"]
    status, body = api.call("POST", "/process", token, ProcessRequest(
        instance={"data_source": "no-such-env", "prompt": "x"}, sampling_params={}).model_dump())
    assert status == 422 and "no-such-env" in body["detail"]
    assert api.call("POST", "/stop", token)[0] == 200


# -- polar -------------------------------------------------------------------------------

SAMPLES = 4


def task(task_id: str, callback_url: str | None = None, timeout_seconds: float = 600
         ) -> TaskRequest:
    return TaskRequest(
        task_id=task_id, instruction="3+4=", num_samples=SAMPLES, dispatch_priority=50,
        timeout_seconds=timeout_seconds, callback_url=callback_url,
        metadata={"group_id": task_id},
        agent=AgentSpec(harness="rollstream", model_name="policy",
                        settings={"step_limit": 1, "model_kwargs": {"max_tokens": 6}}),
        evaluator=EvaluatorSpec(strategy="arithmetic", config={"answer": "7"}))


def test_submit_events_poll_and_callback(setup: ApiSetup) -> None:
    api, token = setup.api, setup.cluster.tokens["alpha"]
    receiver = Receiver(fail_first=1)  # the first delivery fails: it must be retried
    events = EventReader(f"{api.url}/events", token)
    try:
        assert events.content_type.startswith("text/event-stream")
        status, body = api.call("POST", "/rollout/task/submit", token,
                                task("polar-1", receiver.url).model_dump())
        assert (status, body) == (200, {"task_id": "polar-1", "status": "running"})

        def polled() -> TaskStatus:
            status, body = api.call("GET", "/rollout/task/polar-1", token)
            assert status == 200, body
            return TaskStatus.model_validate(body)

        wait_until(lambda: polled().status == "completed", "the task to complete", setup.procs)
        wait_until(lambda: receiver.ids() == {"polar-1"}, "the callback", setup.procs, 60)
        wait_until(lambda: any(e["type"] == "task.completed" for e in events.of("polar-1")),
                   "the completion event", setup.procs, 30)
    finally:
        events.close()
        receiver.close()

    final = polled()
    assert final.total_sessions == final.completed_sessions == len(final.results) == SAMPLES
    log = scored(setup.alpha)
    for index, session in enumerate(final.results):  # in session order once over
        records = log[f"polar:polar-1#{index}"]
        assert len(records) == 1
        assert session.task_id == "polar-1"
        assert session.status == ("ERROR" if records[0]["failure_class"] in ("env", "infra")
                                  else "COMPLETED")
        turn = records[0]["trajectory"]["turns"][0]
        [trace] = session.trajectory.traces
        assert trace.prompt_ids == unpack_ids(turn["prompt_ids"]).tolist()
        assert trace.response_ids == unpack_ids(turn["completion_ids"]).tolist()
        assert np.array_equal(np.asarray(trace.response_logprobs, dtype=np.float32),
                              unpack_logprobs(turn["logprobs"]))
        assert trace.loss_mask == [1] * len(trace.response_ids)
        assert trace.reward == records[0]["reward"]
        assert session.metadata == {"group_id": "polar-1"}

    # At least once (every API process of the job delivers what the log does not yet record
    # as delivered): the copies carry the result's id, and are the same result.
    assert receiver.calls and {result_id for result_id, _ in receiver.calls} == {"polar-1"}
    expected = TaskResult.model_validate(final.model_dump())
    assert all(TaskResult.model_validate(body) == expected for _, body in receiver.calls)

    kinds = [e["type"] for e in events.events]
    assert kinds[0] == "hello"
    mine = [e["type"] for e in events.of("polar-1")]
    assert mine[0] == "task.created" and mine[-1] == "task.completed"
    assert mine.count("session.state_changed") == SAMPLES

    # The same task_id again is the same task: answered as it is, nothing rolled out again.
    status, body = api.call("POST", "/rollout/task/submit", token,
                            task("polar-1", receiver.url).model_dump())
    assert (status, body) == (200, {"task_id": "polar-1", "status": "completed"})
    assert sum(1 for k in scored(setup.alpha) if k.startswith("polar:polar-1#")) == SAMPLES


def test_cancel_and_refusals(setup: ApiSetup) -> None:
    api, token = setup.api, setup.cluster.tokens["alpha"]
    assert api.call("GET", "/rollout/task/never", token) == (404, {"detail": "Task not found"})
    assert api.call("DELETE", "/rollout/task/never", token)[0] == 404
    status, body = api.call("DELETE", "/rollout/task/early?register_if_missing=true", token)
    assert status == 200 and TaskStatus.model_validate(body).status == "cancelled"
    status, body = api.call("POST", "/rollout/task/submit", token, task("early").model_dump())
    assert (status, body) == (409, {"detail": "task early was cancelled before submission"})

    status, body = api.call("POST", "/rollout/task/submit", token, task("late").model_dump())
    assert status == 200
    status, body = api.call("DELETE", "/rollout/task/late", token)
    assert status == 200 and TaskStatus.model_validate(body).status in ("cancelled", "completed")

    bad = task("bad").model_dump()
    bad["num_samples"] = 0
    status, body = api.call("POST", "/rollout/task/submit", token, bad)
    assert status == 422 and body["detail"][0]["loc"] == ["num_samples"]
    no_env = task("no-env").model_dump()
    no_env["evaluator"] = None
    status, body = api.call("POST", "/rollout/task/submit", token, no_env)
    assert status == 422 and "evaluator.strategy" in body["detail"]


def test_cancels_and_deadlines_of_unfinished_tasks(setup: ApiSetup) -> None:
    """With nothing finishing: a /process call that /cancel ends answers 200 with its error (as
    ProRL's does); a DELETE answers cancelled; past timeout_seconds (and the API's grace, 1 s
    here) every session is a TIMEOUT and the task is completed, its late results not counted."""
    api, token = setup.api, setup.cluster.tokens["alpha"]
    request = ProcessRequest(job_id="to-cancel", sampling_params={},
                             instance={"env": "arithmetic", "prompt": "1+1=",
                                       "data": {"answer": "2"}})
    with setup.run_held_back(), ThreadPoolExecutor(1) as pool:
        held = pool.submit(api.call, "POST", "/process", token, request.model_dump())
        wait_until(lambda: api.call("GET", "/status", token)[1]["jobs"] >= 1,
                   "the /process task", setup.procs, 60)
        assert api.call("POST", "/cancel", token, {"job_id": "to-cancel"})[0] == 200
        status, body = held.result(60)
        assert status == 200
        result = ProcessResult.model_validate(body)
        assert result.error == "job to-cancel cancelled" and not result.success

        assert api.call("POST", "/rollout/task/submit", token, task("gone").model_dump())[0] == 200
        status, body = api.call("DELETE", "/rollout/task/gone", token)
        assert status == 200
        gone = TaskStatus.model_validate(body)
        assert gone.status == "cancelled" and gone.completed_sessions == 0
        assert {s.status for s in gone.results} == {"ERROR"}

        status, _ = api.call("POST", "/rollout/task/submit", token,
                             task("deadline", timeout_seconds=1).model_dump())
        assert status == 200
        wait_until(lambda: api.call("GET", "/rollout/task/deadline", token)[1]["status"]
                   == "completed", "the deadline", setup.procs, 60)
    over = TaskStatus.model_validate(api.call("GET", "/rollout/task/deadline", token)[1])
    assert over.completed_sessions == 0 and len(over.results) == SAMPLES
    assert all(s.status == s.trajectory.status == "TIMEOUT" and not s.trajectory.traces
               for s in over.results)
    # RUN is back: the late episodes are scored, and still do not count.
    wait_until(lambda: sum(1 for k in scored(setup.alpha) if k.startswith("polar:deadline#"))
               == SAMPLES, "the late episodes", setup.procs)
    assert TaskStatus.model_validate(api.call("GET", "/rollout/task/deadline", token)[1]) == over


# -- access ------------------------------------------------------------------------------

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


# -- restart -----------------------------------------------------------------------------

POLAR, PRORL = 48, 16


def polar_task(i: int, callback_url: str) -> TaskRequest:
    return TaskRequest(task_id=f"k{i}", instruction=f"{i % 7}+1=", callback_url=callback_url,
                       agent=AgentSpec(harness="rollstream",
                                       settings={"model_kwargs": {"max_tokens": 6}}),
                       evaluator=EvaluatorSpec(strategy="arithmetic",
                                               config={"answer": str(i % 7 + 1)}))


def prorl_request(i: int) -> ProcessRequest:
    return ProcessRequest(job_id=f"r{i}", sampling_params={"max_output_tokens": 6},
                          instance={"env": "arithmetic", "prompt": f"{i % 5}+3=",
                                    "data": {"answer": str(i % 5 + 3)}})


def test_sigkilled_api_loses_and_repeats_nothing(setup: ApiSetup) -> None:
    api, token, procs = setup.api, setup.cluster.tokens["alpha"], setup.procs
    receiver = Receiver()
    pool = ThreadPoolExecutor(16)
    try:
        with setup.run_held_back():  # nothing finishes until the API is back
            submit_and_kill(setup, receiver, pool)
            api.start()

        def all_completed() -> bool:
            return all(TaskStatus.model_validate(api.call("GET", f"/rollout/task/k{i}",
                                                          token)[1]).status == "completed"
                       for i in range(POLAR))

        wait_until(all_completed, "every Polar task to complete", procs)
        results = list(pool.map(lambda i: api.call("POST", "/process", token,
                                                   prorl_request(i).model_dump()), range(PRORL)))
        assert all(status == 200 for status, _ in results)
        assert all(ProcessResult.model_validate(body).messages for _, body in results)
        wait_until(lambda: receiver.ids() == {f"k{i}" for i in range(POLAR)}, "every callback",
                   procs, 120)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        receiver.close()

    log = scored(setup.alpha)
    expected = {f"polar:k{i}#0" for i in range(POLAR)} | {f"prorl:r{i}#0" for i in range(PRORL)}
    assert {k for k in log if k.startswith(("polar:k", "prorl:r"))} == expected
    assert all(len(log[k]) == 1 for k in expected)  # no task rolled out twice
    tasks = [m.key().decode() for m in records(setup.alpha, setup.alpha.topics.tasks)]
    assert sorted(k for k in tasks if k.startswith(("polar:k", "prorl:r"))) == sorted(
        k.removesuffix("#0") for k in expected)  # the reconnects published nothing again
    # Each callback's body is its task's result; a receiver keyed by result id sees each once.
    assert all(body["task_id"] == result_id and body["status"] == "completed"
               for result_id, body in receiver.calls)


def submit_and_kill(setup: ApiSetup, receiver: Receiver, pool: ThreadPoolExecutor) -> None:
    """64 tasks accepted (48 Polar submits, 16 /process calls held open), then SIGKILL."""
    api, token, procs = setup.api, setup.cluster.tokens["alpha"], setup.procs
    submitted = list(pool.map(lambda i: api.call(
        "POST", "/rollout/task/submit", token, polar_task(i, receiver.url).model_dump()),
        range(POLAR)))
    assert all(s == (200, {"task_id": f"k{i}", "status": "running"})
               for i, s in enumerate(submitted))
    # /process calls held open when the process dies: their callers see the connection go.
    held = [pool.submit(api.call, "POST", "/process", token, prorl_request(i).model_dump())
            for i in range(PRORL)]

    def accepted() -> int:
        return sum(1 for m in records(setup.alpha, setup.alpha.topics.tasks)
                   if m.key().decode().startswith(("polar:k", "prorl:r")))

    wait_until(lambda: accepted() == POLAR + PRORL, "every task accepted", procs, 120)
    api.kill()
    for call in held:
        try:
            call.result(60)
        except OSError:
            continue  # the connection was cut
        raise AssertionError("a /process call was answered by a killed process")
    assert not [k for k in scored(setup.alpha) if k.startswith(("polar:k", "prorl:r"))]

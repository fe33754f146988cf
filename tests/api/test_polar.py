"""Polar's task API, driven with its own models: submit → events → poll → result, the callback
delivered (retried past a receiver's failure, with the result's id), traces equal to the scored
records; cancel; a request its model refuses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rollstream.contracts.codec import unpack_ids, unpack_logprobs
from tests.api.conftest import ApiSetup
from tests.helpers.api_helpers import EventReader, Receiver, scored, wait_until
from tests.helpers.seed_api_models import (
    AgentSpec,
    EvaluatorSpec,
    ProcessRequest,
    ProcessResult,
    TaskRequest,
    TaskResult,
    TaskStatus,
)

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

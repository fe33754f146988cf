"""The API process SIGKILLed with 64 tasks accepted and unfinished (RUN held back), then
started again: every task completes exactly once (counted on the log), Polar's polling and
callbacks deliver, and ProRL callers that reconnect with their job_id get their rollout."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.api.conftest import ApiSetup
from tests.helpers.api_helpers import Receiver, records, scored, wait_until
from tests.helpers.seed_api_models import (
    AgentSpec,
    EvaluatorSpec,
    ProcessRequest,
    ProcessResult,
    TaskRequest,
    TaskStatus,
)

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

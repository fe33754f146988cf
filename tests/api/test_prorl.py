"""ProRL Agent's API, driven with its own request and result models: `/process` rolls out one
trajectory on the job's pipeline and answers with the scored record's ids and logprobs; the
same job_id again is the same rollout; the control routes answer as ProRL's do."""

from __future__ import annotations

import numpy as np

from rollstream.contracts.codec import unpack_ids, unpack_logprobs
from rollstream.service import jobs
from tests.api.conftest import ApiSetup
from tests.helpers.api_helpers import scored
from tests.helpers.seed_api_models import (
    CancelRequest,
    LLMServerRequest,
    ProcessRequest,
    ProcessResult,
)


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

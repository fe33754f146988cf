"""Scored trajectories built the way RUN and EVAL build them, for bridge and trainer tests."""

from __future__ import annotations

from producers.publish import validate_task
from rollstream.contracts.codec import pack_ids, pack_logprobs


def turn(index: int, prompt: list[int], completion: list[int], version: int) -> dict:
    return {"index": index, "prompt_ids": pack_ids(prompt), "completion_ids": pack_ids(completion),
            "logprobs": pack_logprobs([-1.0 - 0.1 * i for i in range(len(completion))]),
            "policy_version": version, "finish_reason": "stop", "started_at_ms": 1,
            "inference_ms": 1.0}


def scored(task_id: str, index: int, reward: float | None, *, group_size: int = 4,
           version: int = 0, failure_class: str | None = None,
           turns: list[dict] | None = None, attempt: int = 0) -> dict:
    task = validate_task({"task_id": task_id, "env": "copy_letter", "prompt": "Say a",
                          "data": {"letter": "a"}, "group_size": group_size})
    trajectory = {"episode_id": f"{task_id}#{index}", "task": task, "sample_index": index,
                  "turns": turns if turns is not None else
                  [turn(0, [258, 83, 260, 259], [97 + index, 260], version)],
                  "termination": "DONE", "started_at_ms": 1, "attempt": attempt}
    return {"trajectory": trajectory, "reward": reward, "scored_at_ms": 2,
            "failure_class": failure_class or ("infra" if reward is None else "ok")}

"""A scored episode as the two dialects show a trajectory: ProRL Agent's chat messages (each
assistant message with its sampled ids, logprobs and whole prompt) and Polar's traces (one per
training sample: prompt ids, response ids with a loss mask over the sampled tokens).

Ids and logprobs are the scored record's, unpacked as they are (never re-tokenized).
"""

from __future__ import annotations

import json
from typing import Any

from rollstream.contracts.codec import unpack_ids, unpack_logprobs
from rollstream.contracts.events import ScoredTrajectory, Turn


def _ids(data: bytes) -> list[int]:
    return [int(i) for i in unpack_ids(data)]


def _logprobs(data: bytes) -> list[float]:
    return [float(x) for x in unpack_logprobs(data)]


def _tool_calls(turn: Turn) -> list[dict[str, Any]]:
    """ProRL's `tool_calls` (each call's function: name and arguments), from a turn's parsed
    action when it names a function."""
    if not turn["tool_call"]:
        return []
    try:
        action = json.loads(turn["tool_call"])
    except json.JSONDecodeError:
        return []
    if isinstance(action, dict) and isinstance(action.get("name"), str):
        return [{"name": action["name"], "arguments": action.get("arguments", {})}]
    return []


def messages(scored: ScoredTrajectory) -> list[dict[str, Any]]:
    """ProRL Agent's `messages`: the task's prompt, then per turn the assistant's message with
    `token_ids` (sampled), `input_ids` (the whole prompt of that call) and `logprobs`, and the
    environment's answer as the next user message; trailing non-assistant messages dropped."""
    trajectory = scored["trajectory"]
    out: list[dict[str, Any]] = [{"role": "user", "content": trajectory["task"]["prompt"]}]
    context: list[int] = []
    for turn in trajectory["turns"]:
        prompt = _ids(turn["prompt_ids"])
        # A new sample re-renders the whole context; otherwise its ids extend the last one.
        context = prompt if turn["index"] == 0 or turn["new_sample"] else context + prompt
        completion = _ids(turn["completion_ids"])
        message: dict[str, Any] = {"role": "assistant", "content": turn["completion_text"],
                                   "token_ids": completion, "input_ids": list(context),
                                   "logprobs": _logprobs(turn["logprobs"])}
        calls = _tool_calls(turn)
        if calls:
            message["tool_calls"] = calls
        out.append(message)
        context = context + completion
        if turn["observation"] is not None:
            out.append({"role": "user", "content": turn["observation"]})
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out


def traces(scored: ScoredTrajectory) -> list[dict[str, Any]]:
    """Polar's `traces`: one per training sample (a turn that starts one and the turns after
    it), the reward on the last."""
    out: list[dict[str, Any]] = []
    trajectory = scored["trajectory"]
    for turn in trajectory["turns"]:
        prompt = _ids(turn["prompt_ids"])
        completion = _ids(turn["completion_ids"])
        logprobs = _logprobs(turn["logprobs"])
        assistant = {"role": "assistant", "content": turn["completion_text"]}
        if not out or turn["new_sample"]:
            first = not out
            out.append({"prompt_ids": prompt, "response_ids": [], "loss_mask": [],
                        "response_logprobs": [], "response_messages": [],
                        "prompt_messages": ([{"role": "user",
                                              "content": trajectory["task"]["prompt"]}]
                                            if first else []),
                        "tools": None, "finish_reason": None, "reward": None,
                        "metadata": {"policy_versions": []}})
        else:  # the observation's tokens extend the sample, not trained on
            trace = out[-1]
            trace["response_ids"] += prompt
            trace["loss_mask"] += [0] * len(prompt)
            trace["response_logprobs"] += [0.0] * len(prompt)
        trace = out[-1]
        trace["response_ids"] += completion
        trace["loss_mask"] += [1] * len(completion)
        trace["response_logprobs"] += logprobs
        trace["response_messages"].append(assistant)
        if turn["observation"] is not None:
            trace["response_messages"].append({"role": "user", "content": turn["observation"]})
        trace["finish_reason"] = turn["finish_reason"]
        trace["metadata"]["policy_versions"].append(turn["policy_version"])
    if out:
        out[-1]["reward"] = scored["reward"]
    return out

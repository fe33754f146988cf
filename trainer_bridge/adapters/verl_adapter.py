"""verl: an agent loop, registered as "rollstream", that submits the dataset row's prompt to
Rollstream as a task and returns a scored sample of it as verl's `AgentLoopOutput`.

verl runs the loop once per sample, `rollout.n` times per row: the first run of a row publishes
one task of that group size, and each run takes the next sample of its scored group (the reward
is EVAL's score, so verl needs no reward function). A group is acknowledged (its offsets
committed) when its last sample has been handed to verl. Rows are told apart by the row's
`index` and prompt.

    actor_rollout_ref.rollout.agent.agent_loop_config_path -> [{name: rollstream,
        _target_: trainer_bridge.adapters.verl_adapter.RollstreamAgentLoop}]
    with `RollstreamAgentLoop.source = GroupSource(settings, env="...")` set in the worker.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from rollstream.config import Settings
from trainer_bridge.adapters.sequences import split
from trainer_bridge.adapters.tasks import publish_tasks
from trainer_bridge.bridge import Batch, TrainerBridge
from trainer_bridge.groups import Group, GroupPolicy, Sample


def agent_loop_output(sample: Sample) -> AgentLoopOutput:
    q = split(sample)
    return AgentLoopOutput(
        prompt_ids=q.prompt_ids, response_ids=q.response_ids, response_mask=q.response_mask,
        response_logprobs=q.response_logprobs, reward_score=sample.reward,
        num_turns=2 * q.num_turns, metrics=AgentLoopMetrics(),
        extra_fields={"episode_id": sample.episode_id,
                      "policy_versions": sorted({v for v in q.response_versions if v >= 0})})


class GroupSource:
    """Tasks out, scored groups back, over a bridge read from one thread at a time."""

    def __init__(self, settings: Settings, env: str,
                 data: Callable[[str], dict[str, Any]] = lambda prompt: {},
                 policy: GroupPolicy | None = None) -> None:
        self.settings = settings
        self.env = env
        self.data = data  # the task's env data for a prompt
        self.bridge = TrainerBridge(settings, 1, policy or GroupPolicy(drop_zero_variance=False))
        self._lock = threading.Lock()
        self._rows: dict[str, str] = {}  # row key -> task id
        self._groups: dict[str, tuple[Group, list[Sample]]] = {}  # task id -> (group, left)

    def take(self, row: str, prompt: str, n: int) -> Sample:
        """The next sample of the row's group, publishing its task on the row's first call."""
        with self._lock:
            if row not in self._rows:
                [self._rows[row]] = publish_tasks(self.settings, "verl", self.env, [prompt],
                                                  [self.data(prompt)], n)
            task_id = self._rows[row]
            while task_id not in self._groups:
                for batch in self.bridge.batches(max_batches=1):
                    for g in batch.groups:
                        ordered = sorted(g.samples,
                                         key=lambda s: s.scored["trajectory"]["sample_index"])
                        self._groups[g.task_id] = (g, ordered)
            group, left = self._groups[task_id]
            sample = left.pop(0)
            if not left:  # all of it handed to verl
                del self._groups[task_id]
                del self._rows[row]
                Batch([group], self.bridge).ack()
            return sample

    def close(self) -> None:
        """Leave the bridge's consumer group; groups not yet handed out in full stay
        uncommitted, so the next source gets them again."""
        self.bridge.close()


@register("rollstream")
class RollstreamAgentLoop(AgentLoopBase):
    source: GroupSource | None = None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if self.source is None:
            raise RuntimeError("RollstreamAgentLoop.source is not set: assign a GroupSource "
                               "before verl starts its agent loops")
        messages = kwargs["raw_prompt"]
        prompt = messages if isinstance(messages, str) else messages[-1]["content"]
        row = json.dumps([kwargs.get("index"), messages], sort_keys=True, default=str)
        n = int(self.rollout_config.n)
        sample = await asyncio.to_thread(self.source.take, row, prompt, n)
        return agent_loop_output(sample)

"""Trainers that hand Rollstream their prompts and get scored groups back, through a real
pipeline (INIT, RUN with the embedded policy server, EVAL as processes): TRL's GRPOTrainer with
the service-mode `rollout_func` (`TaskRollouts`), and verl's agent loop whose `run()` returns
verl's own `AgentLoopOutput`, validated by verl's pydantic model."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import TopicPartition

from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, load
from rollstream.contracts.codec import codec, unpack_ids, unpack_logprobs
from rollstream.contracts.events import SCORED_TRAJECTORY, TASK
from rollstream.dev import tiny_model
from rollstream.dev.processes import ProcessGroup
from tests.helpers.trainers_env import committed_versions, pipeline, use_trainers
from trainer_bridge.bridge import TrainerBridge
from trainer_bridge.groups import GroupPolicy

use_trainers()
pytestmark = pytest.mark.trainers

GROUP = 4


@pytest.fixture(scope="module")
def job(bootstrap: str) -> Iterator[Settings]:
    """One job's topics for the module: its pipeline is started once for both trainers."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, prefix, partitions=4)
    yield load(bootstrap_servers=bootstrap, prefix=prefix, partitions=4)
    delete_topics(bootstrap, prefix)


@pytest.fixture(scope="module")
def running(job: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    with pipeline(job, tmp_path_factory.mktemp("pipeline")) as procs:
        yield procs


def read(settings: Settings, topic: str, schema: str) -> list[dict]:
    parts = [TopicPartition(topic, p, 0) for p in range(settings.partitions)]
    return [codec().decode_as(schema, m.value()) for m in kafka.read_partitions(settings, parts)]


def logged_turns(settings: Settings) -> dict[str, dict]:
    """Each scored episode's task and only turn, by episode id."""
    out = {}
    for e in read(settings, settings.topics.scored, SCORED_TRAJECTORY):
        [turn] = e["trajectory"]["turns"]
        out[e["trajectory"]["episode_id"]] = {
            "task_id": e["trajectory"]["task"]["task_id"], "reward": e["reward"],
            "prompt_ids": unpack_ids(turn["prompt_ids"]).tolist(),
            "completion_ids": unpack_ids(turn["completion_ids"]).tolist(),
            "logprobs": unpack_logprobs(turn["logprobs"]).tolist()}
    return out


def test_trl_service_mode_publishes_the_trainers_prompts_and_trains_on_their_groups(
        job: Settings, running: ProcessGroup, tmp_path: Path) -> None:
    from trainer_bridge.adapters import trl_adapter

    calls: list[tuple[list, dict[str, list]]] = []  # what TRL handed the adapter and got back

    class Recorded(trl_adapter.TaskRollouts):
        def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
            out = super().__call__(prompts, trainer)
            calls.append((list(prompts), out))
            return out

    model = tiny_model.build(tmp_path / "tiny").model
    with TrainerBridge(job, 2) as dropping, pytest.raises(ValueError, match="zero-variance"):
        trl_adapter.TaskRollouts(dropping, tmp_path, env="copy_letter")
    bridge = TrainerBridge(job, 2, GroupPolicy(drop_zero_variance=False))
    rollouts = Recorded(bridge, tmp_path / "ckpt", env="copy_letter",
                        data=lambda prompt: {"letter": prompt[-1]}, idle_timeout_s=120)
    steps, letters = 2, "abcd"
    trainer = trl_adapter.grpo_trainer(rollouts, model, model, [f"Say {c}" for c in letters],
                                       max_steps=steps, groups_per_batch=2,
                                       num_generations=GROUP, use_cpu=True)
    try:
        trainer.train()
    finally:
        bridge.close()

    tasks = {t["task_id"]: t for t in read(job, job.topics.tasks, TASK)
             if t["task_id"].startswith("trl-")}
    assert sorted(t["prompt"] for t in tasks.values()) == [f"Say {c}" for c in letters]
    assert all(t["group_size"] == GROUP and t["env"] == "copy_letter" for t in tasks.values())
    logged = logged_turns(job)
    by_task: dict[str, list[dict]] = {}
    for episode_id in sorted(logged, key=lambda e: int(e.rsplit("#", 1)[1])):
        by_task.setdefault(logged[episode_id]["task_id"], []).append(logged[episode_id])
    assert len(calls) == steps
    for prompts, out in calls:
        # TRL repeats each prompt num_generations times; the adapter answered with that prompt's
        # task's group, each sample as the server sampled it and EVAL scored it.
        distinct = prompts[::GROUP]
        assert prompts == [p for p in distinct for _ in range(GROUP)]
        expected = [turn for p in distinct for turn in by_task[
            next(t for t, task in tasks.items() if task["prompt"] == p)]]
        assert out["prompt_ids"] == [t["prompt_ids"] for t in expected]
        assert out["completion_ids"] == [t["completion_ids"] for t in expected]
        for got, turn in zip(out["logprobs"], expected, strict=True):
            np.testing.assert_allclose(got, turn["logprobs"], rtol=1e-6)
        assert out[trl_adapter.REWARD_COLUMN] == [t["reward"] for t in expected]
    versions = committed_versions(job)
    assert [v["version"] for v in versions] == [1, 2]
    assert all(v["metrics"]["samples"] == 2 * GROUP for v in versions)


def test_verl_agent_loop_run_returns_verls_output_for_each_sample_of_its_group(
        job: Settings, running: ProcessGroup, tmp_path: Path) -> None:
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import agent_loop as verl

    from trainer_bridge.adapters.verl_adapter import GroupSource, RollstreamAgentLoop

    model = tiny_model.build(tmp_path / "tiny").model
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": GROUP}}, "data": {}})
    rows = [{"raw_prompt": [{"role": "user", "content": f"Say {c}"}], "index": i}
            for i, c in enumerate("ef")]

    async def one(row: dict) -> verl.AgentLoopOutput:
        # As verl's AgentLoopWorker runs a sample: a loop instance per sample from the registry.
        loop = hydra.utils.instantiate(
            config=verl._agent_loop_registry["rollstream"],
            trainer_config=verl.DictConfigWrap(config=config), server_manager=None,
            tokenizer=tokenizer, processor=None, hf_model_type=None, dataset_cls=None,
            data_config=verl.DictConfigWrap(config.data), tools=verl.ToolListWrap([]))
        assert isinstance(loop, RollstreamAgentLoop)
        return await loop.run({"temperature": 1.0}, **row)

    async def batch() -> list[verl.AgentLoopOutput]:  # each row repeated rollout.n times
        return await asyncio.gather(*(one(row) for row in rows for _ in range(GROUP)))

    without_data = GroupSource(job, env="copy_letter")
    try:  # a task INIT would dead-letter is refused here, not waited for
        with pytest.raises(ValueError, match="letter"):
            without_data.take("row", "Say e", GROUP)
    finally:
        without_data.close()
    RollstreamAgentLoop.source = GroupSource(job, env="copy_letter",
                                             data=lambda prompt: {"letter": prompt[-1]})
    try:
        outputs = asyncio.run(batch())
    finally:
        RollstreamAgentLoop.source.close()
        RollstreamAgentLoop.source = None

    tasks = {t["task_id"]: t for t in read(job, job.topics.tasks, TASK)
             if t["task_id"].startswith("verl-")}
    assert sorted(t["prompt"] for t in tasks.values()) == ["Say e", "Say f"]
    logged = logged_turns(job)
    for r, row in enumerate(rows):
        group = outputs[r * GROUP:(r + 1) * GROUP]
        episodes = [out.extra_fields["episode_id"] for out in group]
        [task_id] = {logged[e]["task_id"] for e in episodes}  # one task per row
        assert tasks[task_id]["prompt"] == row["raw_prompt"][-1]["content"]
        assert len(set(episodes)) == GROUP  # each run() its own sample of the group
        for out, episode_id in zip(group, episodes, strict=True):
            again = verl.AgentLoopOutput.model_validate(out.model_dump())  # verl's own model
            turn = logged[episode_id]
            assert again.prompt_ids == turn["prompt_ids"]
            assert again.response_ids == turn["completion_ids"]
            assert again.response_mask == [1] * len(turn["completion_ids"])
            assert again.response_logprobs == pytest.approx(turn["logprobs"])
            assert again.reward_score == turn["reward"]
            assert again.extra_fields["policy_versions"] == [0]
    with TrainerBridge(job, 1) as after:  # every group was committed once verl had all of it
        assert list(after.batches(idle_timeout_s=3)) == []

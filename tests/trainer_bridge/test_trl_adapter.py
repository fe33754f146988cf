"""TRL fed by Rollstream: its real GRPOTrainer (rollout_func) trains the tiny local Qwen2 on the
CPU from a job's scored topic, each step's weights committed as a PolicyVersion with the batch's
offsets (killed and restarted: test_trl_recovery.py). TRL's
AsyncGRPOTrainer trains from the same topic through the Rollstream rollout worker, with only its
CUDA-only pieces replaced here (see `cpu_async_grpo`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from rollstream.config import Settings
from rollstream.dev import tiny_model
from tests.helpers import vllm_server
from tests.helpers.trainers_env import (
    committed_versions,
    publish_scored,
    sampled_groups,
    use_trainers,
)
from trainer_bridge.bridge import TrainerBridge

use_trainers()
pytestmark = pytest.mark.trainers

GROUP = 4
GROUPS_PER_STEP = 2


def test_grpo_trainer_trains_five_steps_from_the_scored_topic(
        settings: Settings, tiny: tiny_model.TinyModel, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from trainer_bridge.adapters import trl_adapter

    steps = 5
    events = sampled_groups(tiny.model, steps * GROUPS_PER_STEP, GROUP)
    publish_scored(settings, events)
    rollouts = trl_adapter.train(settings, tiny.model, tmp_path / "ckpt", max_steps=steps,
                                 groups_per_batch=GROUPS_PER_STEP, num_generations=GROUP,
                                 use_cpu=True)
    versions = committed_versions(settings)
    assert [v["version"] for v in versions] == [1, 2, 3, 4, 5]
    assert len({v["step_id"] for v in versions}) == steps  # five different batches
    base = load_file(str(tiny.model / "model.safetensors"))
    last = load_file(str(Path(versions[-1]["uri"]) / "model.safetensors"))
    assert any(not torch.equal(base[k], last[k]) for k in base)  # TRL's loss moved the weights
    assert [e["version"] for e in rollouts.published] == [1, 2, 3, 4, 5]
    with TrainerBridge(settings, 1) as again:  # every batch's offsets are committed
        assert list(again.batches(idle_timeout_s=3)) == []


@pytest.fixture
def cpu_async_grpo(monkeypatch: pytest.MonkeyPatch) -> None:
    """What keeps TRL 1.16's AsyncGRPOTrainer off a CPU, replaced for this test only: the
    FlashAttention-3 kernel its tree attention fetches from a model hub at run time (CUDA only)
    by `trl_cpu.varlen_attention`, TRL's own tree attention around it unchanged; and the peak-flops
    lookup by `torch.cuda.get_device_name` by "unknown", the answer TRL gives for a device it
    does not know (its MFU metrics are then left out)."""
    from trainer_bridge.adapters import trl_cpu

    for module, name, replacement in trl_cpu.replacements():
        monkeypatch.setattr(module, name, replacement)


def test_async_grpo_trainer_trains_through_the_rollout_worker(
        settings: Settings, tiny: tiny_model.TinyModel, tmp_path: Path,
        cpu_async_grpo: None) -> None:
    from datasets import Dataset
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from trainer_bridge.adapters import trl_adapter

    steps, per_step = 3, GROUPS_PER_STEP * GROUP
    # One batch more than it trains: the trainer's data loader fetches the next batch while it
    # steps on this one, so it would wait for a fourth after its third step.
    publish_scored(settings, sampled_groups(tiny.model, (steps + 1) * GROUPS_PER_STEP, GROUP,
                                            seed=2))
    weights = trl_adapter.SavedWeights(tmp_path / "weights")
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=per_step,
        num_generations=GROUP, max_steps=steps, learning_rate=1e-3, weight_sync_steps=1,
        token_budget=0, use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        logging_steps=1, heartbeat_stale_after_s=120)
    with TrainerBridge(settings, GROUPS_PER_STEP) as bridge:
        worker = trl_adapter.RolloutWorker(bridge, per_step, weights)
        AsyncGRPOTrainer(
            model=str(tiny.model), reward_funcs=trl_adapter.rollstream_reward, args=args,
            # Only TRL's own worker reads prompts; this one's rollouts come from the scored topic.
            train_dataset=Dataset.from_dict({"prompt": ["rollstream"] * per_step}),
            processing_class=AutoTokenizer.from_pretrained(tiny.model), rollout_worker=worker,
            weight_transfer=weights).train()
    versions = committed_versions(settings)
    assert [v["version"] for v in versions] == [1, 2, 3]
    assert [v["metrics"]["samples"] for v in versions] == [per_step] * steps
    assert len({v["step_id"] for v in versions}) == steps  # three different batches
    assert [v["version"] for v in worker.published] == [1, 2, 3]
    # Each version names the weights TRL synced after that step, and TRL's loss moved them.
    assert [v["uri"] for v in versions] == [
        str(tmp_path / "weights" / f"weights-{n}.safetensors") for n in (2, 3, 4)]
    start = load_file(str(tmp_path / "weights" / "weights-1.safetensors"))  # the cold sync
    last = load_file(versions[-1]["uri"])
    assert any(not torch.equal(start[k], last[k]) for k in start)
    # The batch it fetched but never trained is not committed: the next trainer gets it.
    with TrainerBridge(settings, GROUPS_PER_STEP) as again:
        left = list(again.batches(idle_timeout_s=3))
    assert [len(b.samples) for b in left] == [per_step]
    assert left[0].step_id not in {v["step_id"] for v in versions}


@pytest.mark.vllm
@pytest.mark.slow
def test_trl_versions_are_served_by_real_vllm_and_recorded_on_the_turns_after(
        settings: Settings, real_vllm: vllm_server.RealVllm, tmp_path: Path) -> None:
    """The loop on vLLM's CPU build with TRL as its trainer: INIT, RUN, EVAL and the controller
    as processes, GRPOTrainer in this process training from the scored topic. The tiny model's
    random weights score about 0 on copy_letter, so zero-variance groups are trained too."""
    from producers.publish import publish
    from rollstream.dev.loop import ClosedLoop, LoopConfig
    from trainer_bridge.adapters import trl_adapter
    from trainer_bridge.groups import GroupPolicy

    steps, model = 5, real_vllm.model.model
    loop = ClosedLoop(settings, tmp_path, LoopConfig(tasks=32, group_size=GROUP, hf_model=model,
                                                     trainer=False))
    loop.start(policy_url=real_vllm.url)  # serves the starting weights as version 0
    try:
        publish(settings, loop.tasks())
        rollouts = trl_adapter.train(
            settings, model, tmp_path / "ckpt", max_steps=steps,
            groups_per_batch=GROUPS_PER_STEP, num_generations=GROUP, use_cpu=True,
            policy=GroupPolicy(drop_zero_variance=False), idle_timeout_s=300)
        for progress in loop.follow(deadline=time.time() + 300):
            if {t["policy_version"] for s in progress.scored
                    for t in s["trajectory"]["turns"]} & set(range(1, steps + 1)):
                break
    finally:
        loop.stop()
    versions = committed_versions(settings)
    assert [v["version"] for v in versions] == list(range(1, steps + 1))
    assert [e["version"] for e in rollouts.published] == list(range(1, steps + 1))
    # Turns sampled after an update record the version vLLM served: TRL's weights, applied by
    # the controller; none records a version nobody published.
    recorded = {t["policy_version"] for s in progress.scored for t in s["trajectory"]["turns"]}
    assert recorded <= set(range(steps + 1)) and max(recorded) >= 1

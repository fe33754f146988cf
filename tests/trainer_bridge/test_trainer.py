"""Tensor batches and the reference GRPO trainer on the embedded policy (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollstream.policy_server import model as tiny
from tests.helpers.scored_factory import scored, turn
from trainer_bridge.bridge import Batch
from trainer_bridge.groups import GroupAssembler, Sample
from trainer_bridge.tensors import to_tensors
from trainer_bridge.trainer import GRPOTrainer, TinyPolicy


def two_turn_sample() -> Sample:
    turns = [turn(0, [258, 72, 260, 259], [65, 66, 260], version=3),
             turn(1, [258, 79, 260, 259], [67, 260], version=4)]
    sample = Sample(scored("t", 0, 1.0, turns=turns), 0, 0)
    sample.advantage = 0.5
    return sample


def test_tensor_batch_keeps_ids_exact_and_masks_only_sampled_tokens() -> None:
    sample = two_turn_sample()
    short = Sample(scored("u", 1, 0.0), 0, 1)
    short.advantage = -0.5
    batch = to_tensors([sample, short])
    ids = [258, 72, 260, 259, 65, 66, 260, 258, 79, 260, 259, 67, 260]
    assert batch.input_ids[0].tolist() == ids
    assert batch.loss_mask[0].tolist() == [False] * 4 + [True] * 3 + [False] * 4 + [True] * 2
    assert batch.versions[0].tolist() == [-1] * 4 + [3] * 3 + [-1] * 4 + [4] * 2
    sampled_lp = batch.old_logprobs[0][batch.loss_mask[0]].tolist()
    assert sampled_lp == [-1.0, -1.100000023841858, -1.2000000476837158, -1.0,
                          -1.100000023841858]
    assert batch.advantages[0][batch.loss_mask[0]].tolist() == [0.5] * 5
    assert batch.advantages[0][~batch.loss_mask[0]].abs().sum() == 0  # prompts: no advantage
    assert batch.attention_mask[1].sum() == 6 and not batch.loss_mask[1][6:].any()  # padding


def test_packing_fits_samples_into_rows_and_restarts_positions() -> None:
    samples = [two_turn_sample()] + [Sample(scored("u", i, 0.0), 0, i) for i in range(3)]
    for s in samples:
        s.advantage = 1.0
    packed = to_tensors(samples, pack_to=20)
    assert packed.input_ids.shape[0] == 2  # 13 + 6 | 6 + 6
    assert int(packed.attention_mask.sum()) == 13 + 3 * 6
    first_row = packed.sequence_ids[0].tolist()
    assert first_row[:13] == [0] * 13 and packed.position_ids[0, 13].item() == 0


def batch_of_groups(n_groups: int = 4) -> Batch:
    assembler = GroupAssembler()
    groups = []
    for g in range(n_groups):
        for i in range(4):
            group = assembler.add(Sample(scored(f"t{g}", i, float(i % 2)), 0, g * 4 + i), 0)
        groups.append(group)
    return Batch(groups, _bridge=None)  # type: ignore[arg-type]


def test_grpo_step_raises_the_probability_of_rewarded_tokens(tmp_path: Path) -> None:
    policy = TinyPolicy(seed=0)
    trainer = GRPOTrainer(policy, tmp_path, version=0)
    batch = batch_of_groups()
    tensors = to_tensors(batch.trainable)
    before = policy.token_logprobs(tensors).detach()
    event = trainer.step(batch)
    after = policy.token_logprobs(tensors).detach()
    mask = tensors.loss_mask[:, 1:]
    gain = ((after - before) * tensors.advantages[:, 1:] * mask).sum()
    assert gain > 0  # positive-advantage tokens up, negative ones down
    assert event["version"] == 1 and event["kind"] == "full"
    assert event["metrics"]["samples"] == 16 and event["metrics"]["groups"] == 4
    assert event["step_id"] == batch.step_id
    model, version = tiny.load(event["uri"])
    assert version == 1
    assert torch.equal(model.head.bias, policy.model.head.bias)


def test_step_id_names_the_batch_by_its_episodes() -> None:
    assert batch_of_groups().step_id == batch_of_groups().step_id
    assert batch_of_groups(3).step_id != batch_of_groups(4).step_id


def test_grpo_step_on_a_hugging_face_causal_lm(tmp_path: Path) -> None:
    # A tiny randomly initialized GPT-2 written locally: the adapter never touches the hub.
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainer_bridge.trainer import HFPolicy

    base = tmp_path / "base"
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=300, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(base)
    policy = HFPolicy(base, device="cpu")
    trainer = GRPOTrainer(policy, tmp_path / "ckpt", version=policy.version)
    batch = batch_of_groups()
    tensors = to_tensors(batch.trainable)
    before = policy.token_logprobs(tensors).detach()
    event = trainer.step(batch)
    after = policy.token_logprobs(tensors).detach()
    gain = ((after - before) * tensors.advantages[:, 1:] * tensors.loss_mask[:, 1:]).sum()
    assert gain > 0
    assert event["version"] == 1 and Path(event["uri"]).is_dir()
    reloaded = HFPolicy(Path(event["uri"]), device="cpu")
    assert reloaded.version == 1
    assert torch.equal(reloaded.model.lm_head.weight, policy.model.lm_head.weight)


def test_training_curves_are_tensorboard_event_files_next_to_checkpoints(
        tmp_path: Path) -> None:
    # Read back with TensorBoard's own reader, not the writer that made them.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = GRPOTrainer(TinyPolicy(seed=0), tmp_path, version=0)
    events = [trainer.step(batch_of_groups()) for _ in range(2)]
    board = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    board.Reload()
    tags = set(board.Tags()["scalars"])
    assert {"loss", "kl", "clip_frac", "mean_reward", "tokens", "advantages/mean",
            "staleness/mean"} <= tags
    losses = board.Scalars("loss")
    assert [e.step for e in losses] == [1, 2]
    assert [e.value for e in losses] == [
        pytest.approx(ev["metrics"]["loss"], rel=1e-5) for ev in events]
    assert [e.value for e in board.Scalars("tokens")] == [ev["metrics"]["tokens"] for ev in events]
    assert board.Scalars("kl")[0].value >= 0
    # The samples' turns were sampled by version 0 (scored_factory): step 2 trains 1 behind.
    assert [e.value for e in board.Scalars("staleness/max")] == [0, 1]
    assert "advantages" in board.Tags()["histograms"]

"""verl, slime, Tinker and TRL's async trainer fed by Rollstream, each checked with the peer's own
classes (imported from the pinned packages) on batches a real bridge assembled from real Avro
events: verl's AgentLoopOutput validation and tensors, Tinker's Datum, TRL's RolloutSample through
TRL's own queue dataset, planner and collator. slime is not on the package registry: its adapter
is checked against the fields of slime's Sample as slime's source defines them."""

from __future__ import annotations

import enum
import sys
import time
import types
from collections import defaultdict
from dataclasses import make_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollstream.config import Settings
from rollstream.contracts.codec import unpack_ids, unpack_logprobs
from rollstream.dev import tiny_model
from tests.helpers.trainers_env import (
    committed_versions,
    publish_scored,
    sampled_groups,
    use_trainers,
)
from trainer_bridge.bridge import Batch, TrainerBridge

use_trainers()
pytestmark = pytest.mark.trainers

GROUP = 4
# slime.utils.types.Sample's fields and Sample.Status's values, and RolloutFnTrainOutput's fields
# (slime/rollout/base_types.py), as slime's source defines them.
SLIME_SAMPLE_FIELDS = {
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
    "multimodal_train_inputs", "multimodal_train_input_id", "apply_chat_template_kwargs",
    "response", "response_length", "label", "reward", "loss_mask", "weight_versions",
    "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata",
    "generate_function_path", "custom_rm_path", "train_metadata", "session_id",
    "non_generation_time"}
SLIME_STATUSES = {"pending", "completed", "truncated", "aborted", "failed"}
SLIME_OUTPUT_FIELDS = ("samples", "metrics")


@pytest.fixture
def batch(settings: Settings, tiny: tiny_model.TinyModel) -> Batch:
    publish_scored(settings, sampled_groups(tiny.model, 2, GROUP, version=3))
    bridge = TrainerBridge(settings, 2)
    try:
        yield next(bridge.batches(idle_timeout_s=30))
    finally:
        bridge.close()


def _turn(sample):  # noqa: ANN001, ANN202
    return sample.scored["trajectory"]["turns"][0]


def test_verl_agent_loop_output_is_verls_own_and_registered(batch: Batch) -> None:
    from verl.experimental.agent_loop import agent_loop as verl

    from trainer_bridge.adapters.verl_adapter import RollstreamAgentLoop, agent_loop_output

    assert verl._agent_loop_registry["rollstream"]["_target_"] == \
        f"{RollstreamAgentLoop.__module__}.{RollstreamAgentLoop.__qualname__}"
    assert issubclass(RollstreamAgentLoop, verl.AgentLoopBase)
    for sample in batch.trainable:
        out = agent_loop_output(sample)
        # verl's pydantic model validates a dump of it, and its own as_dict makes the tensors.
        again = verl.AgentLoopOutput.model_validate(out.model_dump())
        tensors = again.as_dict()
        assert tensors["prompts"].tolist() == unpack_ids(_turn(sample)["prompt_ids"]).tolist()
        assert tensors["responses"].tolist() == \
            unpack_ids(_turn(sample)["completion_ids"]).tolist()
        np.testing.assert_allclose(tensors["rollout_log_probs"].numpy(),
                                   unpack_logprobs(_turn(sample)["logprobs"]))
        assert again.reward_score == sample.reward
        assert again.extra_fields["policy_versions"] == [3]


def test_tinker_datum_from_a_batch(batch: Batch) -> None:
    from tinker import Datum
    from tinker.types import datum as tinker_datum

    from trainer_bridge.adapters.tinker_adapter import data

    out = data(batch.trainable)
    assert all(isinstance(d, Datum) for d in out)
    for d, sample in zip(out, batch.trainable, strict=True):
        assert set(d.loss_fn_inputs) <= set(tinker_datum._KEY_TO_TYPE)  # names Tinker knows
        prompt = unpack_ids(_turn(sample)["prompt_ids"]).tolist()
        completion = unpack_ids(_turn(sample)["completion_ids"]).tolist()
        assert d.model_input.to_ints() == (prompt + completion)[:-1]
        targets = d.loss_fn_inputs["target_tokens"].to_numpy()
        assert targets.tolist() == (prompt + completion)[1:]
        sampled = slice(len(prompt) - 1, None)
        np.testing.assert_allclose(d.loss_fn_inputs["logprobs"].to_numpy()[sampled],
                                   unpack_logprobs(_turn(sample)["logprobs"]), rtol=1e-6)
        adv = d.loss_fn_inputs["advantages"].to_numpy()
        assert np.all(adv[: len(prompt) - 1] == 0)
        np.testing.assert_allclose(adv[sampled], sample.advantage, rtol=1e-6)


def test_slime_samples_have_slimes_fields(batch: Batch) -> None:
    from trainer_bridge.adapters.slime_adapter import group_fields

    rows = group_fields(batch.groups)
    assert [len(r) for r in rows] == [GROUP, GROUP]  # list[list[Sample]], grouped by prompt
    for gi, row in enumerate(rows):
        for fields in row:
            assert set(fields) <= SLIME_SAMPLE_FIELDS
            assert fields["status"] in SLIME_STATUSES
            assert fields["group_index"] == gi
            n = fields["response_length"]
            assert len(fields["loss_mask"]) == len(fields["rollout_log_probs"]) == n
            assert len(fields["weight_versions"]) == n
            assert all(isinstance(v, str) for v in fields["weight_versions"])
            assert len(fields["tokens"]) > n
    assert len({f["index"] for row in rows for f in row}) == 2 * GROUP


@pytest.fixture
def slime_types(monkeypatch: pytest.MonkeyPatch) -> tuple[type, type]:
    """slime's Sample and RolloutFnTrainOutput as modules named as slime names them, built from
    the field lists above and nothing else: a keyword outside them is a TypeError, a status
    outside Sample.Status a ValueError. slime itself cannot be installed here (not on the
    package registry, and CI fetches no source), so this is what its output is checked against."""
    sample = make_dataclass("Sample", [(f, Any, None) for f in sorted(SLIME_SAMPLE_FIELDS)])
    sample.Status = enum.Enum("Status", {v.upper(): v for v in SLIME_STATUSES})
    output = make_dataclass("RolloutFnTrainOutput", [(f, Any, None) for f in SLIME_OUTPUT_FIELDS])
    modules = {"slime": {}, "slime.utils": {}, "slime.rollout": {},
               "slime.utils.types": {"Sample": sample},
               "slime.rollout.base_types": {"RolloutFnTrainOutput": output}}
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    return sample, output


def test_slime_generate_rollout_returns_slimes_types_and_commits_at_the_next_call(
        settings: Settings, tiny: tiny_model.TinyModel, slime_types: tuple[type, type],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from trainer_bridge.adapters import slime_adapter

    sample_cls, output_cls = slime_types
    events = sampled_groups(tiny.model, 4, GROUP, version=2)
    publish_scored(settings, events)
    logged = {e["trajectory"]["episode_id"]: _turn_of(e) for e in events}
    monkeypatch.setenv("ROLLSTREAM_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("ROLLSTREAM_PREFIX", settings.prefix)
    monkeypatch.setenv("ROLLSTREAM_PARTITIONS", str(settings.partitions))
    monkeypatch.setenv("ROLLSTREAM_SLIME_GROUPS", "2")
    monkeypatch.setattr(slime_adapter, "_state", {})
    # slime evaluates with the rollout function unless told otherwise: the answer names how.
    with pytest.raises(ValueError, match="training rollouts only.* set --eval-function-path "
                                         "slime.rollout.sglang_rollout.generate_rollout"):
        slime_adapter.generate_rollout(None, 0, None, evaluation=True)
    try:
        with caplog.at_level("WARNING", "rollstream.bridge.slime"):
            first = slime_adapter.generate_rollout(None, 0, None)
            second = slime_adapter.generate_rollout(None, 1, None)  # slime trained on the first
    finally:
        slime_adapter._state["bridge"].close()
    said = [r.getMessage() for r in caplog.records if r.name == "rollstream.bridge.slime"]
    assert len(said) == 1 and f"nothing is published to {settings.topics.policy}" in said[0]
    assert committed_versions(settings) == []
    seen: list[str] = []
    for out in (first, second):
        assert isinstance(out, output_cls)
        assert [len(row) for row in out.samples] == [GROUP, GROUP]  # grouped by prompt
        for gi, row in enumerate(out.samples):
            assert len({s.prompt for s in row}) == 1
            for s in row:
                assert isinstance(s, sample_cls) and s.group_index == gi
                assert s.status is sample_cls.Status.COMPLETED
                turn = logged[s.metadata["episode_id"]]
                prompt, completion = turn["prompt_ids"], turn["completion_ids"]
                assert s.tokens == prompt + completion
                assert s.response_length == len(completion) == len(s.loss_mask)
                assert s.loss_mask == [1] * len(completion)
                np.testing.assert_allclose(s.rollout_log_probs, turn["logprobs"], rtol=1e-6)
                assert s.weight_versions == ["2"] * len(completion)
                seen.append(s.metadata["episode_id"])
    assert sorted(seen) == sorted(logged)  # every sample once, across the two calls
    # The second call committed the first batch; the second is not committed until slime asks
    # again, so a restarted rollout function gets exactly it back.
    second_ids = {s.metadata["episode_id"] for row in second.samples for s in row}
    with TrainerBridge(settings, 2) as again:
        [batch] = list(again.batches(idle_timeout_s=5))
    assert {s.episode_id for s in batch.samples} == second_ids


def _turn_of(event: dict) -> dict:
    turn = event["trajectory"]["turns"][0]
    return {"prompt_ids": unpack_ids(turn["prompt_ids"]).tolist(),
            "completion_ids": unpack_ids(turn["completion_ids"]).tolist(),
            "logprobs": unpack_logprobs(turn["logprobs"]).tolist()}


def test_async_grpo_worker_feeds_trls_dataset_and_collator(
        settings: Settings, tiny: tiny_model.TinyModel, tmp_path: Path) -> None:
    import torch
    from trl.experimental.async_grpo import async_grpo_trainer as trl_async
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from trainer_bridge.adapters.trl_adapter import RolloutWorker, SavedWeights

    publish_scored(settings, sampled_groups(tiny.model, 4, GROUP))
    per_step = 2 * GROUP
    weights = SavedWeights(tmp_path / "weights")
    bridge = TrainerBridge(settings, 2)
    worker = RolloutWorker(bridge, per_step, weights)
    metrics: dict[str, list] = defaultdict(list)
    dataset = trl_async.RolloutQueueDataset(
        worker.rollout_buffer, model_version_fn=lambda: 0, check_health_fn=worker.check_health,
        stale_after_s=120, metrics=metrics, poll_interval_s=1.0)
    planner = trl_async.FixedCountBatcher(dataset, num_processes=1, microbatch_size=per_step)
    collator = trl_async.DataCollatorForRollout(pad_token_id=0, metrics=metrics)
    worker.update_model_version(1)  # TRL's cold sync at train start: the weights it starts from
    worker.start()
    try:
        rows = next(iter(planner))
        collated = collator([rows])
        assert isinstance(worker.rollout_buffer.get(timeout=30), RolloutSample)
        assert collated["input_ids"].shape[0] == 1 and collated["global_n_tokens"].item() > 0
        assert len(collator.groups_trained) == 2
        # The trained step: weights synced, then TRL's next version reported; its batch is
        # committed as the first version after the starting weights.
        weights.send_weights(iter([("w", torch.zeros(2))]))
        worker.update_model_version(2)
        deadline = time.monotonic() + 60
        versions: list[dict] = []
        while not versions and time.monotonic() < deadline:
            versions = committed_versions(settings)
            time.sleep(0.2)
        assert [v["version"] for v in versions] == [1]
        assert versions[0]["uri"] == str(weights.latest)
        assert versions[0]["metrics"]["samples"] == per_step
    finally:
        worker.stop()
        bridge.close()

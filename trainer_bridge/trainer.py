"""The Trainer protocol, and the reference trainer: GRPO with PPO-clip in torch.

A trainer takes a batch of scored groups and returns the PolicyVersion it produced:

    class Trainer(Protocol):
        def step(self, batch: Batch) -> dict   # a PolicyVersion event (schemas/policy_version.avsc)

The reference `GRPOTrainer` trains a `PolicyModel`: the embedded tiny policy on the CPU
(`TinyPolicy`) or a Hugging Face causal LM from a local directory, on a GPU when there is one
(`HFPolicy`); any model wrapped the same way works. After each step it saves a checkpoint and
returns its PolicyVersion; the train loop publishes it, and the inference controller makes the
servers load it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from trainer_bridge.bridge import Batch
from trainer_bridge.curves import TrainingCurves
from trainer_bridge.tensors import TensorBatch, to_tensors


class Trainer(Protocol):
    def step(self, batch: Batch) -> dict:
        """Train on the batch; return the PolicyVersion event of the new weights."""
        ...


class PolicyModel(Protocol):
    def parameters(self): ...  # noqa: ANN201 (torch's iterator of parameters)

    def token_logprobs(self, batch: TensorBatch) -> torch.Tensor:
        """log p(input_ids[:, t+1] | input_ids[:, :t+1]) for every position, shape [B, T-1]."""
        ...

    def save(self, stem: Path, version: int) -> Path:
        """Write the weights as `stem` plus the model's suffix; return the path servers load."""
        ...


class TinyPolicy:
    """The embedded policy (rollstream.policy_server.model.TinyLM) as a trainable PolicyModel."""

    def __init__(self, checkpoint: Path | None = None, seed: int = 0) -> None:
        from rollstream.policy_server import model as tiny

        self._tiny = tiny
        self.model, self.version = (tiny.load(checkpoint) if checkpoint is not None
                                    else (tiny.build_model(seed), 0))
        self.model.train()

    def parameters(self):  # noqa: ANN201
        return self.model.parameters()

    def token_logprobs(self, batch: TensorBatch) -> torch.Tensor:
        # Right padding only: a recurrent model never reads past a sequence's end, so no
        # attention mask is needed (packed rows would leak state across samples: not used here).
        ids = batch.input_ids
        logits, _ = self.model(ids[:, :-1])
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]

    def save(self, stem: Path, version: int) -> Path:
        path = stem.with_name(stem.name + ".safetensors")
        self._tiny.save(self.model, path, version)
        return path


class HFPolicy:
    """A Hugging Face causal LM from a local directory (no hub access), on the GPU when present.

    Checkpoints are `save_pretrained` directories (safetensors), what vLLM's `reload_weights`
    reads. Needs the `hf` extra (transformers).
    """

    def __init__(self, path: Path, device: str | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        self.model.train()
        version_file = Path(path) / VERSION_FILE
        self.version = int(version_file.read_text()) if version_file.is_file() else 0

    def parameters(self):  # noqa: ANN201
        return self.model.parameters()

    def token_logprobs(self, batch: TensorBatch) -> torch.Tensor:
        ids = batch.input_ids.to(self.device)
        mask = batch.attention_mask.to(self.device).long()
        logits = self.model(input_ids=ids, attention_mask=mask,
                            position_ids=batch.position_ids.to(self.device)).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0].cpu()

    def save(self, stem: Path, version: int) -> Path:
        self.model.save_pretrained(stem, safe_serialization=True)
        (stem / VERSION_FILE).write_text(str(version))
        return stem


VERSION_FILE = "rollstream_policy_version"


@dataclass(frozen=True)
class GRPOConfig:
    lr: float = 3e-3
    clip_eps: float = 0.2
    epochs: int = 1
    max_grad_norm: float = 1.0


class GRPOTrainer:
    """PPO-clip on group-relative advantages; the ratio is against the logprobs the inference
    server reported for each sampled token (the behaviour policy, whatever its version)."""

    def __init__(self, policy: PolicyModel, checkpoint_dir: Path, version: int,
                 config: GRPOConfig | None = None) -> None:
        self.policy = policy
        self.config = config or GRPOConfig()
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.version = version
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=self.config.lr)
        self.curves = TrainingCurves(checkpoint_dir / "tensorboard")

    def loss(self, batch: TensorBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logprobs = self.policy.token_logprobs(batch)
        mask = batch.loss_mask[:, 1:].float()
        advantages = batch.advantages[:, 1:]
        log_ratio = logprobs - batch.old_logprobs[:, 1:]
        ratio = torch.exp(log_ratio)
        clipped = ratio.clamp(1 - self.config.clip_eps, 1 + self.config.clip_eps)
        per_token = -torch.minimum(ratio * advantages, clipped * advantages)
        tokens = mask.sum().clamp(min=1)
        loss = (per_token * mask).sum() / tokens  # token-level mean, as in DAPO / Dr. GRPO
        with torch.no_grad():
            clip_frac = (((ratio - 1).abs() > self.config.clip_eps).float() * mask).sum() / tokens
            # KL(behaviour || current), the non-negative k3 estimator on the sampled tokens.
            kl = (((ratio - 1) - log_ratio) * mask).sum() / tokens
        return loss, {"loss": loss.item(), "clip_frac": float(clip_frac), "kl": float(kl)}

    def step(self, batch: Batch) -> dict:
        samples = batch.trainable
        tensors = to_tensors(samples)
        metrics: dict[str, float] = {}
        for _ in range(self.config.epochs):
            loss, metrics = self.loss(tensors)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
        self.version += 1
        path = self.policy.save(self.checkpoint_dir / f"policy-v{self.version}", self.version)
        rewards = [s.reward for s in samples if s.reward is not None]
        metrics.update({
            "samples": float(len(samples)),
            "groups": float(len(batch.groups)),
            "tokens": float(tensors.num_sampled_tokens),
            "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        })
        self.curves.step(self.version, metrics,
                         [s.advantage for s in samples if s.advantage is not None],
                         [self.version - 1 - s.oldest_version for s in samples
                          if s.oldest_version is not None and s.oldest_version >= 0])
        return {
            "version": self.version,
            "kind": "full",
            "uri": str(path),
            "step_id": batch.step_id,
            "metrics": metrics,
            "created_at_ms": int(time.time() * 1000),
        }

"""The trainers the adapters are proven against (`make trainer-deps` puts them under
.rollstream/trainers), and scored groups sampled from the tiny local Qwen2 for them to train on.

The trainers' directory goes first on sys.path of the tests that need it, and in PYTHONPATH of
the processes they start: it holds the newer huggingface_hub and click TRL's datasets needs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from producers.publish import validate_task
from rollstream import policy_versions
from rollstream.cluster import kafka
from rollstream.config import Settings
from rollstream.contracts.codec import codec, pack_ids, pack_logprobs
from rollstream.contracts.events import SCORED_TRAJECTORY
from rollstream.dev.processes import ProcessGroup

TRAINERS = Path(os.environ.get("ROLLSTREAM_TRAINERS_PATH") or
                Path(__file__).resolve().parents[2] / ".rollstream" / "trainers")
PROMPTS = ["alpha beta", "gamma delta", "one two three", "the quick fox", "red green",
           "seven eight", "north south", "left right"]


def use_trainers() -> None:
    """Put the pinned trainers first on sys.path, or skip saying how to install them."""
    if not (TRAINERS / ".installed").is_file():
        pytest.skip(f"the pinned trainers are not under {TRAINERS} (`make trainer-deps`)",
                    allow_module_level=True)
    if str(TRAINERS) not in sys.path:
        sys.path.insert(0, str(TRAINERS))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TRAINERS), str(Path(__file__).resolve().parents[2])]),
        "TRL_EXPERIMENTAL_SILENCE": "1"}


def sampled_groups(model_dir: Path, tasks: int, group_size: int, tokens: int = 6,
                   version: int = 0, seed: int = 0) -> list[dict]:
    """ScoredTrajectory events: each task's prompt in the tiny model's chat template, completions
    sampled from the model with their logprobs, rewards varied within each group."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    events = []
    for t in range(tasks):
        text = PROMPTS[t % len(PROMPTS)]
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                         add_generation_prompt=True, return_dict=False)
        ids = torch.tensor([list(prompt)])
        with torch.no_grad():
            out = model.generate(ids, do_sample=True, max_new_tokens=tokens, min_new_tokens=tokens,
                                 num_return_sequences=group_size, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
            scores = model.compute_transition_scores(out.sequences, out.scores,
                                                     normalize_logits=True)
        task = validate_task({"task_id": f"task-{seed}-{t}", "env": "copy_letter", "prompt": text,
                              "data": {"letter": "a"}, "group_size": group_size})
        for i in range(group_size):
            completion = out.sequences[i, ids.shape[1]:].tolist()
            turn = {"index": 0, "prompt_ids": pack_ids(list(prompt)),
                    "completion_ids": pack_ids(completion),
                    "logprobs": pack_logprobs(scores[i].tolist()), "policy_version": version,
                    "finish_reason": "length", "started_at_ms": 1, "inference_ms": 1.0}
            trajectory = {"episode_id": f"{task['task_id']}#{i}", "task": task,
                          "sample_index": i, "turns": [turn], "termination": "DONE",
                          "started_at_ms": 1}
            events.append({"trajectory": trajectory, "reward": (i % 4) / 3,
                           "scored_at_ms": 2, "failure_class": "ok"})
    return events


def publish_scored(settings: Settings, events: list[dict]) -> None:
    p = kafka.producer(settings)
    for e in events:
        kafka.produce(p, settings.topics.scored, codec().encode(SCORED_TRAJECTORY, e),
                      key=e["trajectory"]["episode_id"])
    p.flush(30)


def committed_versions(settings: Settings) -> list[dict]:
    """The policy versions committed on the job's policy topic, in order."""
    return policy_versions.newer(
        kafka.read_partitions(settings, policy_versions.partitions(settings)))


@contextmanager
def pipeline(settings: Settings, log_dir: Path) -> Iterator[ProcessGroup]:
    """INIT, RUN and EVAL as processes with the embedded policy server: tasks published on the
    job's topic come back scored. The embedded policy samples byte-level token ids (below 261),
    which every model here takes as ids, so the trainers see real sampled rollouts."""
    procs = ProcessGroup(log_dir)
    common = [*settings.client_flags(), "--commit-interval-ms", "100"]
    try:
        policy = procs.start_policy()
        procs.start("init", "stage", "init", *common)
        procs.start("run", "stage", "run", *common, "--policy-url", policy.url)
        procs.start("eval", "stage", "eval", *common)
        policy.ready()
        yield procs
    finally:
        procs.stop_all()

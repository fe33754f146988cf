"""The token-exact turn logic against real chat templates (Qwen3, Qwen2.5, Llama 3.1,
DeepSeek-R1-Distill: tests/fixtures/chat_templates, sources in SOURCES.md) and the shipped
reasoning-keeping variants, each checked against transformers' `apply_chat_template`.

Real tokenizer.json files are not available offline: each family gets a small byte-level BPE
tokenizer holding that family's special tokens (and Qwen's NFC normalizer), so the templates'
special tokens encode as single ids just as with the real vocabularies."""

from __future__ import annotations

import asyncio
import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from rollstream.contracts.codec import unpack_ids
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.inference.chat import sample_count
from rollstream.inference.hf_template import HFChatTemplate
from stages.run import RunStage, conversation
from tests.helpers.hf import transformers
from tests.helpers.run_helpers import guess_episodes, play, run_settings

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"
SHIPPED = Path(__file__).parents[2] / "rollstream" / "inference" / "templates"
QWEN3 = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
QWEN3_KEEP = SHIPPED / "qwen3-keep-reasoning.jinja"
R1 = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
R1_KEEP = SHIPPED / "deepseek-r1-keep-reasoning.jinja"

# name: (special tokens, added non-special tokens, tokenizer_config, generation_config eos
# tokens, NFC normalizer)
FAMILIES: dict[str, tuple[list[str], list[str], dict[str, Any], list[str], bool]] = {
    "qwen": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
             ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
              "</tool_response>"],
             {"eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>"},
             ["<|im_end|>", "<|endoftext|>"], True),
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"], [],
               {"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"},
               ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], False),
    "r1": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
            "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"],
           ["<think>", "</think>"],
           {"eos_token": "<｜end▁of▁sentence｜>", "bos_token": "<｜begin▁of▁sentence｜>"},
           ["<｜end▁of▁sentence｜>"], False),
}
CORPUS = ["Guess a number between 0 and 9.", "higher", "lower", "let me think about it",
          "The answer is 5. I think so.", "You are a careful assistant.", "ls -la src/"] * 20


def tokenizer_dir(root: Path, family: str, template: Path) -> Path:
    specials, added, config, eos, nfc = FAMILIES[family]
    tokenizer = Tokenizer(models.BPE())
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_tokens(added)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {**config, "chat_template": template.read_text()}))
    (root / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tokenizer.token_to_id(t) for t in eos]}))
    return root


def reference(root: Path, messages: list[dict], template: Path, **kwargs: Any) -> str:
    """transformers' rendering of the whole conversation (an independent implementation)."""
    config = json.loads((root / "tokenizer_config.json").read_text())
    hf = transformers().PreTrainedTokenizerFast(tokenizer_file=str(root / "tokenizer.json"),
                                 bos_token=config.get("bos_token"),
                                 eos_token=config.get("eos_token"))
    return hf.apply_chat_template(messages, chat_template=template.read_text(), tokenize=False,
                                  add_generation_prompt=True, **kwargs)


def sampled(t: HFChatTemplate, text: str) -> tuple[list[int], str]:
    return [*t.encode(text), t.stop_token_ids[0]], text


def converse(t: HFChatTemplate, answers: list[str], observations: list[str],
             system: str | None = None, observation_role: str = "user"
             ) -> tuple[list[list[int]], list[bool], list[dict]]:
    """Plays turns through next_prompt as RUN does: the samples' ids, the new-sample flags,
    and the messages (ending with the last observation)."""
    task = {"prompt": "Guess a number between 0 and 9.",
            "metadata": {"system_prompt": system} if system else {}}
    turns: list[dict] = []
    samples: list[list[int]] = [[]]
    flags = []
    for answer, observation in zip(answers, observations, strict=True):
        messages = conversation(task, turns, observation_role)
        ids, new = t.next_prompt(samples[-1], messages)
        flags.append(new)
        if new:
            samples.append([])
        completion, text = sampled(t, answer)
        samples[-1] += ids + completion
        turns.append({"completion_text": text, "observation": observation,
                      "tool_call": "{}", "new_sample": new})
    messages = conversation(task, turns, observation_role)
    ids, new = t.next_prompt(samples[-1], messages)
    flags.append(new)
    samples[-1] = ids if new else samples[-1] + ids
    return samples, flags, messages


THINKING = [f"<think>\nThe secret is unknown; try {d}.\n</think>\n\n{d}" for d in (5, 7, 6, 8)]
HINTS = ["higher", "lower", "higher", "lower"]


def test_qwen3_keep_reasoning_four_thinking_turns_are_one_sample_equal_to_the_template(
        tmp_path: Path) -> None:
    root = tokenizer_dir(tmp_path / "qwen3", "qwen", QWEN3)
    keep = HFChatTemplate(root, chat_template=QWEN3_KEEP)
    samples, flags, messages = converse(keep, THINKING, HINTS, system="Be brief.")
    assert flags == [False] * 5 and len(samples) == 1
    expected = keep.encode(reference(root, messages, QWEN3_KEEP))
    assert samples[0] == expected  # token for token
    assert keep.decode(samples[0]).count("<think>") == 4
    # The model's own template drops earlier reasoning: every later turn is a new sample.
    original = HFChatTemplate(root)
    samples, flags, messages = converse(original, THINKING, HINTS)
    assert flags == [False, True, True, True, True]
    assert samples[-1] == original.encode(reference(root, messages, QWEN3))


def test_r1_keep_reasoning_is_append_only_and_equal_to_the_template(tmp_path: Path) -> None:
    root = tokenizer_dir(tmp_path / "r1", "r1", R1)
    # R1's prompt opens the think block: the model samples from inside it.
    answers = [a.removeprefix("<think>\n") for a in THINKING]
    keep = HFChatTemplate(root, chat_template=R1_KEEP)
    samples, flags, messages = converse(keep, answers, HINTS)
    assert flags == [False] * 5
    assert samples[0] == keep.encode(reference(root, messages, R1_KEEP))
    original = HFChatTemplate(root, {"enable_thinking": True})
    _, flags, messages = converse(original, answers, HINTS)
    assert flags == [False, True, True, True, True]
    assert original.render(messages, True) == reference(root, messages, R1, enable_thinking=True)


@pytest.mark.parametrize(("family", "template"), [
    ("qwen", TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"),
    ("llama3", TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"),
    ("qwen", QWEN3)])
def test_append_only_real_templates_keep_one_sample_with_tool_observations(
        tmp_path: Path, family: str, template: Path) -> None:
    root = tokenizer_dir(tmp_path / family, family, template)
    t = HFChatTemplate(root)
    answers = ["5", "ls -la src/", "7", "8"]
    samples, flags, messages = converse(t, answers, HINTS, system="You are a careful assistant.",
                                        observation_role="tool")
    assert flags == [False] * 5
    assert [m["role"] for m in messages].count("tool") == 4
    assert samples[0] == t.encode(reference(root, messages, template))


def test_stop_ids_include_generation_config_ends(tmp_path: Path) -> None:
    llama = HFChatTemplate(tokenizer_dir(tmp_path / "l", "llama3",
                                         TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"))
    names = [llama.tokenizer.id_to_token(i) for i in llama.stop_token_ids]
    assert names == ["<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"]


def test_decomposed_unicode_observation_does_not_split_on_a_normalizing_tokenizer(
        tmp_path: Path) -> None:
    root = tokenizer_dir(tmp_path / "q", "qwen", TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja")
    t = HFChatTemplate(root)
    nfd = unicodedata.normalize("NFD", "café.py not found")
    samples, flags, messages = converse(t, ["5", "6"], [nfd, "lower"])
    assert nfd != unicodedata.normalize("NFC", nfd) and flags == [False] * 3
    # What the server sees equals the tokenizer's own encoding of the whole conversation.
    assert samples[0] == t.encode(reference(root, messages,
                                            TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"))


def test_run_with_the_keep_template_and_kwargs_counts_one_sample(tmp_path: Path) -> None:
    root = tokenizer_dir(tmp_path / "qwen3", "qwen", QWEN3)
    settings = run_settings([]).override(tokenizer_path=str(root), chat_template=str(QWEN3_KEEP),
                                         chat_template_kwargs='{"enable_thinking": false}')
    t = RunStage._template(settings.inference)
    assert isinstance(t, HFChatTemplate) and t.template_kwargs == {"enable_thinking": False}

    def guess(prompt: list[int], body: dict) -> tuple[list[int], str]:
        return sampled(t, str(len(prompt) % 3))

    counts = {}
    for name, template in (("keep", t), ("original", HFChatTemplate(root, {
            "enable_thinking": False}))):
        episodes = guess_episodes(1, max_turns=4, max_tokens=64)
        episodes[0]["task"]["data"] = json.dumps({"secret": 9, "low": 0, "high": 9})
        with Fleet([SimulatedServer(script=guess)]) as fleet:
            [trajectory], _ = asyncio.run(play(
                settings.override(policy_url=fleet.urls[0]), episodes,
                template=template))
        assert len(trajectory["turns"]) == 4, trajectory["termination_detail"]
        counts[name] = sample_count(trajectory["turns"])
        if name == "keep":
            ids = [i for turn in trajectory["turns"] for key in ("prompt_ids", "completion_ids")
                   for i in unpack_ids(turn[key]).tolist()]
            assert t.decode(ids).count("<think>\n\n</think>\n\n") == 4
    assert counts == {"keep": 1, "original": 4}


def test_run_fails_clearly_when_text_is_not_the_sampled_ids(tmp_path: Path) -> None:
    t = HFChatTemplate(tokenizer_dir(tmp_path / "q", "qwen", QWEN3))

    def leaky(prompt: list[int], body: dict) -> tuple[list[int], str]:
        ids, text = sampled(t, "5")
        return ids, text + "<|im_end|>"  # a proxy that kept the stop token in the text

    with Fleet([SimulatedServer(script=leaky)]) as fleet:
        [trajectory], _ = asyncio.run(play(run_settings(fleet.urls),
                                           guess_episodes(1, max_tokens=64), template=t))
    assert trajectory["termination"] == "INFRA_ERROR"
    assert "not the detokenization of its token ids" in trajectory["termination_detail"]
    assert trajectory["turns"] == []

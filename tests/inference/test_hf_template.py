"""A real model's chat template from a local tokenizer directory (built here, no download):
append-only templates extend the token history; Qwen3-style ones that drop earlier thinking
blocks start a new sample, in the template and through RUN."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rollstream.contracts.codec import unpack_ids
from rollstream.dev.simulated import Fleet, SimulatedServer
from rollstream.inference.hf_template import HFChatTemplate, TemplateError
from tests.helpers.run_helpers import guess_episodes, play, run_settings
from tests.helpers.tokenizer_helpers import tokenizer_dir

# Qwen2.5-style: every message rendered the same whatever follows it (append-only).
PLAIN = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3-style: an assistant turn before the last user message loses its <think> block.
THINKING = (
    "{%- set ns = namespace(last_query=0) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and '</think>' in m.content %}"
    "{%- set reasoning = m.content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set answer = m.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- if loop.index0 > ns.last_query %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + answer }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + answer }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def answer(template: HFChatTemplate, text: str) -> tuple[list[int], str]:
    """What a server samples: the text's ids and the end-of-turn token."""
    return [*template.encode(text), template.stop_token_ids[0]], text


def test_append_only_template_extends_the_sample(tmp_path: Path) -> None:
    t = HFChatTemplate(tokenizer_dir(tmp_path / "plain", PLAIN))
    assert t.stop_token_ids == [2, 0]  # eos_token, then generation_config's others
    prompt = t.first_prompt("Guess a number")
    assert t.decode(prompt) == "<|im_start|>user\nGuess a number<|im_end|>\n<|im_start|>assistant\n"
    sampled, text = answer(t, "5")
    messages = [{"role": "user", "content": "Guess a number"},
                {"role": "assistant", "content": text}, {"role": "user", "content": "higher"}]
    delta, new_sample = t.next_prompt(prompt + sampled, messages)
    assert not new_sample
    assert t.decode(delta) == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    whole = t.decode(prompt + sampled + delta)
    assert whole == t.render(messages, add_generation_prompt=True)


def test_template_that_drops_thinking_starts_a_new_sample(tmp_path: Path) -> None:
    t = HFChatTemplate(tokenizer_dir(tmp_path / "qwen3", THINKING))
    prompt = t.first_prompt("Guess a number")
    sampled, text = answer(t, "<think>\nlet me think\n</think>\n\n5")
    messages = [{"role": "user", "content": "Guess a number"},
                {"role": "assistant", "content": text}, {"role": "user", "content": "higher"}]
    ids, new_sample = t.next_prompt(prompt + sampled, messages)
    assert new_sample
    assert ids == t.encode(t.render(messages, add_generation_prompt=True))
    assert "<think>" not in t.decode(ids) and t.decode(ids).endswith("assistant\n")
    # Without a thinking block the same template is append-only.
    plain, text = answer(t, "5")
    _, split = t.next_prompt(prompt + plain, [*messages[:1], {"role": "assistant",
                                                             "content": text}, messages[2]])
    assert not split


def test_missing_pieces_are_named(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="no tokenizer.json"):
        HFChatTemplate(tmp_path)
    root = tokenizer_dir(tmp_path / "t", PLAIN)
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(TemplateError, match="no chat template"):
        HFChatTemplate(root)
    (root / "chat_template.jinja").write_text(PLAIN)  # newer repositories ship it beside
    assert HFChatTemplate(root).first_prompt("x")


@pytest.mark.parametrize(("template", "splits"), [(PLAIN, False), (THINKING, True)])
def test_run_splits_only_where_the_template_rewrites_history(
        tmp_path: Path, template: str, splits: bool) -> None:
    t = HFChatTemplate(tokenizer_dir(tmp_path / "tok", template))

    def think_then_guess(prompt: list[int], body: dict) -> tuple[list[int], str]:
        return answer(t, f"<think>\nlet me think\n</think>\n\n{len(prompt) % 3}")

    episodes = guess_episodes(1, max_turns=3, max_tokens=64)
    episodes[0]["task"]["data"] = json.dumps({"secret": 9, "low": 0, "high": 9})
    with Fleet([SimulatedServer(script=think_then_guess)]) as fleet:
        [trajectory], _ = asyncio.run(play(run_settings(fleet.urls), episodes, template=t))
        sent = [body["prompt"] for body in fleet.servers[0].received]
    turns = trajectory["turns"]
    assert len(turns) == 3 and [tr["new_sample"] for tr in turns] == [False, splits, splits]
    context: list[int] = []
    for turn, prompt in zip(turns, sent, strict=True):
        ids = unpack_ids(turn["prompt_ids"]).tolist()
        context = ids if turn["new_sample"] else context + ids
        assert prompt == context  # the server got exactly the sample's ids
        context += unpack_ids(turn["completion_ids"]).tolist()
    if splits:  # each new sample is the whole conversation, re-rendered, thinking dropped
        assert "<think>" not in t.decode(unpack_ids(turns[2]["prompt_ids"]).tolist())

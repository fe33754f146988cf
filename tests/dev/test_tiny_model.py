"""The tiny local model (rollstream.dev.tiny_model), read back by transformers itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rollstream.dev import tiny_model
from rollstream.inference.hf_template import HFChatTemplate
from tests.helpers.hf import transformers


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tiny_model.TinyModel:
    return tiny_model.build(tmp_path_factory.mktemp("tiny") / "m")


def greedy(model, ids: list[int], n: int = 12) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_transformers_loads_a_qwen2_with_its_tokenizer_and_chat_template(
        built: tiny_model.TinyModel) -> None:
    model = transformers().AutoModelForCausalLM.from_pretrained(built.model)
    assert isinstance(model, transformers().Qwen2ForCausalLM)
    assert model.dtype == torch.float32
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads) == (128, 2, 4, 2)
    tokenizer = transformers().AutoTokenizer.from_pretrained(built.model)
    assert len(tokenizer) == config.vocab_size == tiny_model.VOCAB_SIZE
    messages = [{"role": "user", "content": "Guess the number, 中文 🙂"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nGuess the number, 中文 🙂<|im_end|>\n<|im_start|>assistant\n"
    # RUN's own rendering of the template is token-exact against transformers'.
    ours = HFChatTemplate(built.model)
    assert ours.first_prompt(messages[0]["content"]) == tokenizer.encode(
        text, add_special_tokens=False)
    assert ours.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    for text in ["What is 12 + 7? 19", "def f(x):\n    return x * 3\n", "Caf\u00e9 Cafe\u0301",
                 "  spaces\t\n\nand 中文 🙂 λ!", "it's DONE, you'll see"]:
        assert ours.encode(text) == tokenizer.encode(text, add_special_tokens=False), text


def test_the_two_weight_sets_are_two_policies(built: tiny_model.TinyModel) -> None:
    prompt = HFChatTemplate(built.model).first_prompt("What is 2 + 3?")
    first, second = (greedy(transformers().AutoModelForCausalLM.from_pretrained(p), prompt)
                     for p in built.weights)
    assert first != second


def test_the_adapters_load_in_peft_and_each_changes_the_output(
        built: tiny_model.TinyModel) -> None:
    peft = pytest.importorskip("peft", reason="peft is the independent reader of adapters")
    prompt = HFChatTemplate(built.model).first_prompt("What is 2 + 3?")
    base = greedy(transformers().AutoModelForCausalLM.from_pretrained(built.model), prompt)
    outputs = []
    for adapter in built.adapters:
        model = peft.PeftModel.from_pretrained(
            transformers().AutoModelForCausalLM.from_pretrained(built.model), adapter)
        config = json.loads((adapter / "adapter_config.json").read_text())
        assert config["r"] == tiny_model.LORA_RANK
        outputs.append(greedy(model, prompt))
    assert base not in outputs and outputs[0] != outputs[1]


def test_a_complete_build_is_reused_and_a_seed_gives_the_same_bytes(
        built: tiny_model.TinyModel, tmp_path: Path) -> None:
    weights = built.model / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert tiny_model.build(built.root) == built
    assert weights.stat().st_mtime_ns == stamp
    again = tiny_model.build(tmp_path / "again")
    for f in sorted(p.name for p in built.model.iterdir()):
        assert (built.model / f).read_bytes() == (again.model / f).read_bytes(), f
    for ours, theirs in zip(built.adapters, again.adapters, strict=True):
        name = "adapter_model.safetensors"  # the config names its base by path
        assert (ours / name).read_bytes() == (theirs / name).read_bytes()

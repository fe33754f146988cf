"""RUN's expectation of a server's `text` against tokenizers' own incremental decoder (the one
vLLM's detokenizer runs), on the tiny model's byte-level BPE."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from rollstream.dev import tiny_model
from rollstream.inference.detokenize import served_text
from rollstream.inference.hf_template import HFChatTemplate


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> HFChatTemplate:
    return HFChatTemplate(tiny_model.build(tmp_path_factory.mktemp("tiny") / "m").model)


def streamed(tokenizer: Tokenizer, prompt: list[int], ids: list[int]) -> str:
    stream = DecodeStream(ids=prompt, skip_special_tokens=False)
    return "".join(stream.step(tokenizer, i) or "" for i in ids)


def test_served_text_is_what_the_incremental_decoder_has_written(
        template: HFChatTemplate) -> None:
    tokenizer = template.tokenizer
    prompt = template.first_prompt("Say something in 中文 🙂")
    lead = tokenizer.encode("中", add_special_tokens=False).ids
    rng = random.Random(0)
    cases = [lead[:1], [*tokenizer.encode("ok ", add_special_tokens=False).ids, lead[0]]]
    cases += [[rng.randrange(3, tokenizer.get_vocab_size()) for _ in range(rng.randint(1, 12))]
              for _ in range(300)]
    cut = 0
    for ids in cases:
        assert served_text(template.decode, ids) == streamed(tokenizer, prompt, ids), ids
        cut += template.decode(ids).endswith("\ufffd")
    assert cut > 30  # many outputs end inside a character; the decoder held those back


def test_an_output_that_ends_well_is_its_plain_decode(template: HFChatTemplate) -> None:
    ids = template.encode("def f(x): return x  # 中文 🙂")
    assert served_text(template.decode, ids) == template.decode(ids) == (
        "def f(x): return x  # 中文 🙂")

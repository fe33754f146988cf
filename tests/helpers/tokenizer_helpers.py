"""A local tokenizer directory as Hugging Face lays it out, built here with no download."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = ["Guess a number between 0 and 9.", "higher", "lower", "let me think about it",
          "The answer is 5. I think so.", "user assistant system"] * 20


def tokenizer_dir(root: Path, template: str) -> Path:
    """A byte-level BPE tokenizer trained on a few sentences, with Qwen's chat specials."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_tokens(["<think>", "</think>"])  # added but not special, as in Qwen3
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": template}))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return root

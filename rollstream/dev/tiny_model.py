"""A tiny real Hugging Face model made here with a fixed seed, for a real inference server.

Nothing is downloaded: a byte-level BPE tokenizer is trained with `tokenizers` on text generated
from the seed, with a ChatML chat template in its tokenizer_config.json (the layout Qwen ships),
and a Qwen2ForCausalLM (hidden 128, 2 layers, 4 heads of 32, 2 KV heads) is initialized randomly
and saved as fp32 safetensors. vLLM's CPU attention takes head sizes 32, 64, 80, ... only.

Besides the model (policy version 0) it writes a second weight set of the same architecture (the
next policy version, for weight reloads) and two LoRA adapters in PEFT's on-disk format (for two
jobs sharing a server, or a version applied as an adapter). Weights are drawn with a wider spread
than a training run's init so that the greedy token has a clear margin: a server's kernels and
transformers' then agree on it (see HEAD_SCALE).

    python -m rollstream.dev.tiny_model OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

VOCAB_SIZE = 496
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 2048
INIT_RANGE = 0.1
# The output layer drawn 4 times wider still: peaked next-token distributions, like a trained
# model's, and greedy margins far above the float error of any kernel.
HEAD_SCALE = 4.0
LORA_RANK = 8
LORA_ALPHA = 16
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Qwen2's pre-tokenization regex (its tokenizer.json, and transformers' Qwen2Tokenizer).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Bumped when what `build` writes changes, so an old build is not taken as complete.
FORMAT = 3
_MARKER = "tiny-model.json"

_TEXT = (
    "the a number guess is higher lower correct answer think step result value you I it "
    "please try again done task file code run test error line print def return if else for "
    "in and or not true false list add sum total count left right yes no hello world"
)
_WORDS = tuple(_TEXT.split())
_EXTRA = ("é", "ü", "ß", "中文", "日本", "€", "→", "🙂", "λ", "Ω")  # multi-byte characters


@dataclass(frozen=True)
class TinyModel:
    """Paths of one build. `model` is a complete model directory (config, weights, tokenizer)
    serving as policy version 0; `weights[1]` holds the next version's weights (a complete
    directory too); `adapters` are PEFT LoRA adapter directories."""

    root: Path
    model: Path
    weights: tuple[Path, Path]
    adapters: tuple[Path, Path]


def _layout(root: Path) -> TinyModel:
    return TinyModel(root=root, model=root / "model",
                     weights=(root / "model", root / "weights-1"),
                     adapters=(root / "lora-a", root / "lora-b"))


def _corpus(rng: random.Random, lines: int = 3000) -> list[str]:
    """Chat-like lines: words, arithmetic, code-ish text and some multi-byte characters."""
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.5:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
            out.append(" ".join(words).capitalize() + rng.choice(".?!"))
        elif kind < 0.7:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            out.append(f"What is {a} + {b}? {a + b}")
        elif kind < 0.9:
            name = rng.choice(_WORDS)
            out.append(f"def {name}(x):\n    return x * {rng.randint(1, 9)}\n")
        else:
            out.append(" ".join(rng.choice(_WORDS + _EXTRA) for _ in range(6)))
    return out


def _write_tokenizer(directory: Path, rng: random.Random) -> int:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # Qwen2's pipeline exactly: transformers builds it for a qwen2 model whatever tokenizer.json
    # says, so any other one would make transformers and the template's tokenizer disagree.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_corpus(rng), trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        # Known to every transformers release that reads tokenizer.json.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tokenizer.get_vocab_size()


def _config(vocab: int, eos: int, pad: int):  # -> transformers.Qwen2Config
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS, initializer_range=INIT_RANGE,
        tie_word_embeddings=False, eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
        torch_dtype="float32")


def _write_model(directory: Path, config, seed: int) -> None:
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.save_pretrained(directory, safe_serialization=True)
    generation = {"eos_token_id": [config.eos_token_id], "pad_token_id": config.pad_token_id}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _write_adapter(directory: Path, base: Path, config, seed: int) -> None:
    """A LoRA adapter as PEFT saves one: adapter_config.json and adapter_model.safetensors with
    keys `base_model.model.<module>.lora_A.weight` (rank x in) and `lora_B.weight` (out x rank).
    B is random (PEFT's init makes it zero) so that the adapter changes the model's output."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    head = HIDDEN // HEADS
    shapes = {  # (in, out) of each target linear layer
        "q_proj": (HIDDEN, HEADS * head), "k_proj": (HIDDEN, KV_HEADS * head),
        "v_proj": (HIDDEN, KV_HEADS * head), "o_proj": (HEADS * head, HIDDEN),
        "gate_proj": (HIDDEN, INTERMEDIATE), "up_proj": (HIDDEN, INTERMEDIATE),
        "down_proj": (INTERMEDIATE, HIDDEN),
    }
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for name in LORA_TARGETS:
            part = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{name}"
            fan_in, fan_out = shapes[name]
            tensors[f"{key}.lora_A.weight"] = torch.randn(
                LORA_RANK, fan_in, generator=generator) * fan_in ** -0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(
                fan_out, LORA_RANK, generator=generator) * 0.2
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
        "r": LORA_RANK, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(LORA_TARGETS), "fan_in_fan_out": False, "inference_mode": True,
        "modules_to_save": None, "use_rslora": False, "use_dora": False,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))


def _complete(root: Path, seed: int) -> bool:
    marker = root / _MARKER
    if not marker.is_file():
        return False
    return json.loads(marker.read_text()) == {"format": FORMAT, "seed": seed}


def build(out_dir: Path, seed: int = 0) -> TinyModel:
    """Write the model, its second weight set and two adapters under `out_dir`; a complete
    build of the same seed there is reused as it is. Deterministic for a seed."""
    root = Path(out_dir)
    paths = _layout(root)
    if _complete(root, seed):
        return paths
    # Written beside, then moved into place: an interrupted build is never taken as complete,
    # and two processes building at once each write their own.
    staging = root.with_name(f"{root.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staged = _layout(staging)
    staged.model.mkdir(parents=True)
    rng = random.Random(seed)
    vocab = _write_tokenizer(staged.model, rng)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(staged.model / "tokenizer.json"))
    config = _config(vocab, tokenizer.token_to_id("<|im_end|>"),
                     tokenizer.token_to_id("<|endoftext|>"))
    _write_model(staged.model, config, seed)
    shutil.copytree(staged.model, staged.weights[1])
    _write_model(staged.weights[1], config, seed + 1)
    for i, adapter in enumerate(staged.adapters):
        _write_adapter(adapter, paths.model, config, seed + 2 + i)
    (staging / _MARKER).write_text(json.dumps({"format": FORMAT, "seed": seed}))
    if _complete(root, seed):  # another process finished first: the same bytes
        shutil.rmtree(staging)
    else:
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rollstream.dev.tiny_model",
                                     description="Build the tiny local model.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = build(args.out_dir, args.seed)
    print(f"tiny model at {paths.model}")


if __name__ == "__main__":
    main()

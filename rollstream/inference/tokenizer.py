"""Byte-level tokenizer of the embedded policy: ids 0-255 are raw bytes, then five specials.

Every string round-trips through UTF-8 bytes, so no text is out of vocabulary and no download is
ever needed. `encode` never produces special ids (text that spells "<|end|>" stays bytes), so an
observation cannot inject a turn boundary; specials enter a sequence only through the chat template.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD = 256
EOS = 257
USER = 258
ASSISTANT = 259
END = 260
VOCAB_SIZE = 261

SPECIAL_TOKENS: dict[int, str] = {
    PAD: "<|pad|>",
    EOS: "<|eos|>",
    USER: "<|user|>",
    ASSISTANT: "<|assistant|>",
    END: "<|end|>",
}


class ByteTokenizer:
    """Stateless; the attribute names follow Hugging Face tokenizers where they overlap."""

    vocab_size = VOCAB_SIZE
    eos_token_id = EOS
    pad_token_id = PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Bytes decode as UTF-8 with errors="replace"; a special renders as its name
        ("<|end|>") or, with skip_special_tokens, as nothing (vLLM's default for responses)."""
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            if i not in SPECIAL_TOKENS:
                raise ValueError(f"token id {i} is out of vocabulary (size {VOCAB_SIZE})")
            # Bytes are decoded per run, so a multi-byte character split by a special breaks.
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
            if not skip_special_tokens:
                parts.append(SPECIAL_TOKENS[i])
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_str(self, token_id: int) -> str:
        """One token as text, as vLLM reports it in `logprobs.tokens` (a lone continuation byte
        of a multi-byte character shows as U+FFFD)."""
        return self.decode([token_id])

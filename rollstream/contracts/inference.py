"""What RUN's inference client and the embedded policy server both speak, in one module: the
embedded policy's byte-level tokenizer, its append-only chat template, and the sampling
parameters with their defaults and a server's checks. RUN (rollstream.inference, the gateway)
and the server (rollstream.policy_server) import it; neither imports the other.

Tokenizer: ids 0-255 are raw bytes, then five specials. Every string round-trips through UTF-8
bytes, so no text is out of vocabulary and no download is ever needed. `encode` never produces
special ids (text that spells "<|end|>" stays bytes), so an observation cannot inject a turn
boundary; specials enter a sequence only through the chat template.

Chat template: a conversation reads
`<|user|> u1 <|end|> <|assistant|> a1 <|end|> <|user|> u2 <|end|> <|assistant|> ...`.
The model ends its turn by emitting `<|end|>` (the stop token), so after a completion the next
observation appends `<|user|> text <|end|> <|assistant|>` and every earlier token is reused
verbatim: token-in/token-out multi-turn rollouts never re-tokenize history. RUN uses
`stop_token_ids`, `next_prompt` and `decode` (rollstream.inference.chat.ChatTemplate); a template
for a Hugging Face tokenizer (rollstream.inference.hf_template) implements the same.

Sampling parameters: the defaults are the Avro record's (`schemas/sampling.avsc`, a task's
`sampling`): RUN's client fills the fields a task leaves out with them, and the embedded server's
`SamplingParams` takes the same defaults for the same fields. Where vLLM's server differs, the
embedded server follows vLLM, since it must answer a request as vLLM would: a body without
`max_tokens` gets 16 tokens (`SERVER_MAX_TOKENS`, vLLM's completions default), where a task's
default is 64 per turn. RUN sends every field explicitly, so that difference never reaches a
rollout. `rollstream.contracts.events.SamplingParams` is the record's shape as a TypedDict; it
has no defaults.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import schemas
from rollstream.contracts.codec import Ids, id_list
from rollstream.contracts.events import SAMPLING_PARAMS

# -- the tokenizer ------------------------------------------------------------------------

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


# -- the chat template --------------------------------------------------------------------

class EmbeddedChatTemplate:
    def __init__(self, tokenizer: ByteTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self.stop_token_ids: list[int] = [END]

    def first_prompt(self, user_text: str) -> list[int]:
        return [USER, *self.tokenizer.encode(user_text), END, ASSISTANT]

    def observation_delta(self, text: str) -> list[int]:
        """Tokens to append after an assistant completion (which ends with `<|end|>`)."""
        return [USER, *self.tokenizer.encode(text), END, ASSISTANT]

    def next_prompt(
        self, sample_ids: Ids, messages: Sequence[Mapping[str, str]]
    ) -> tuple[list[int], bool]:
        """The ids to append for the last message (always an append: this template never
        re-renders history, so it never starts a new sample); the whole rendering when there
        is no history yet (a system message, then the task)."""
        if len(sample_ids) == 0:  # RUN's sample is an array: no truth value
            return self.render(messages, add_generation_prompt=True), False
        delta = self.observation_delta(messages[-1].get("content") or "")
        if sample_ids[-1] not in self.stop_token_ids:
            # Cut off before its stop token (max_tokens): close the turn so the template stays
            # well-formed (the closing token is prompt, never trained on as sampled).
            return [END, *delta], False
        return delta, False

    def decode(self, ids: Ids) -> str:
        """Text of ids as the server writes it (RUN asks for special tokens in `text`)."""
        return self.tokenizer.decode(id_list(ids), skip_special_tokens=False)

    def render(
        self, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool
    ) -> list[int]:
        """Whole conversation as ids. Every non-assistant role (system, user, tool) is a user turn:
        the tiny model has no other role tokens."""
        ids: list[int] = []
        for message in messages:
            role = ASSISTANT if message["role"] == "assistant" else USER
            ids += [role, *self.tokenizer.encode(message.get("content") or ""), END]
        if add_generation_prompt:
            ids.append(ASSISTANT)
        return ids


# -- sampling parameters ------------------------------------------------------------------

SAMPLING_DEFAULTS: dict[str, Any] = {
    f["name"]: f["default"] for f in schemas.raw_schemas()[SAMPLING_PARAMS]["fields"]
}
SERVER_MAX_TOKENS = 16  # vLLM's /v1/completions default for a body without max_tokens
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_TEMPERATURE = 2.0
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling as a vLLM-compatible server takes it (the embedded server's)."""

    max_tokens: int = SERVER_MAX_TOKENS
    temperature: float = SAMPLING_DEFAULTS["temperature"]
    top_p: float = SAMPLING_DEFAULTS["top_p"]
    top_k: int = SAMPLING_DEFAULTS["top_k"]  # -1 or 0: disabled, as in vLLM
    seed: int | None = SAMPLING_DEFAULTS["seed"]
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 0  # top alternatives to report per token, besides the sampled one

    def __post_init__(self) -> None:
        # vLLM 0.33's checks (SamplingParams._verify_args; the seed's range from its request
        # model): a value that cannot be sampled with is a 400, never a failed batch.
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number, got {self.temperature}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if self.temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if self.seed is not None and not INT64_MIN <= self.seed <= INT64_MAX:
            raise ValueError(f"seed must be in [{INT64_MIN}, {INT64_MAX}], got {self.seed}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}.")

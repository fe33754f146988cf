"""Append-only chat template of the embedded policy.

A conversation reads
`<|user|> u1 <|end|> <|assistant|> a1 <|end|> <|user|> u2 <|end|> <|assistant|> ...`.
The model ends its turn by emitting `<|end|>` (the stop token), so after a completion the next
observation appends `<|user|> text <|end|> <|assistant|>` and every earlier token is reused
verbatim: token-in/token-out multi-turn rollouts never re-tokenize history.

A template for a Hugging Face tokenizer implements the same interface: `stop_token_ids`,
`first_prompt`, `observation_delta` (and `render` for /tokenize with messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rollstream.policy.tokenizer import ASSISTANT, END, USER, ByteTokenizer


class EmbeddedChatTemplate:
    def __init__(self, tokenizer: ByteTokenizer | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self.stop_token_ids: list[int] = [END]

    def first_prompt(self, user_text: str) -> list[int]:
        return [USER, *self.tokenizer.encode(user_text), END, ASSISTANT]

    def observation_delta(self, text: str) -> list[int]:
        """Tokens to append after an assistant completion (which ends with `<|end|>`)."""
        return [USER, *self.tokenizer.encode(text), END, ASSISTANT]

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

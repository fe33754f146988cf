"""Append-only chat template of the embedded policy.

A conversation reads
`<|user|> u1 <|end|> <|assistant|> a1 <|end|> <|user|> u2 <|end|> <|assistant|> ...`.
The model ends its turn by emitting `<|end|>` (the stop token), so after a completion the next
observation appends `<|user|> text <|end|> <|assistant|>` and every earlier token is reused
verbatim: token-in/token-out multi-turn rollouts never re-tokenize history.

RUN uses `stop_token_ids`, `next_prompt` and `decode`; a template for a Hugging Face
tokenizer (rollstream.inference.hf_template) implements the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from rollstream.inference.tokenizer import ASSISTANT, END, USER, ByteTokenizer


class ChatTemplate(Protocol):
    """What RUN (and its gateway) needs of a chat template: EmbeddedChatTemplate here,
    HFChatTemplate (rollstream.inference.hf_template) for real models."""

    stop_token_ids: list[int]

    def next_prompt(self, sample_ids: Sequence[int],
                    messages: Sequence[Mapping[str, str]]) -> tuple[list[int], bool]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


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
        self, sample_ids: Sequence[int], messages: Sequence[Mapping[str, str]]
    ) -> tuple[list[int], bool]:
        """The ids to append for the last message (always an append: this template never
        re-renders history, so it never starts a new sample); the whole rendering when there
        is no history yet (a system message, then the task)."""
        if not sample_ids:
            return self.render(messages, add_generation_prompt=True), False
        delta = self.observation_delta(messages[-1].get("content") or "")
        if sample_ids and sample_ids[-1] not in self.stop_token_ids:
            # Cut off before its stop token (max_tokens): close the turn so the template stays
            # well-formed (the closing token is prompt, never trained on as sampled).
            return [END, *delta], False
        return delta, False

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids as the server writes it (RUN asks for special tokens in `text`)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

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


def sample_count(turns: Sequence[Mapping[str, object]]) -> int:
    """How many training samples an episode's turns make: one, plus one per turn where the
    chat template re-rendered history (each re-sends and trains the whole context)."""
    return 1 + sum(1 for turn in turns[1:] if turn.get("new_sample"))

"""What RUN (and its gateway) needs of a chat template: `stop_token_ids`, `next_prompt` and
`decode`. The embedded policy's template is rollstream.contracts.inference.EmbeddedChatTemplate
(the embedded server renders with it too); a Hugging Face tokenizer's is
rollstream.inference.hf_template.HFChatTemplate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from rollstream.contracts.codec import Ids


class ChatTemplate(Protocol):
    """What RUN (and its gateway) needs of a chat template (see the module's docstring)."""

    stop_token_ids: list[int]

    def next_prompt(self, sample_ids: Ids,
                    messages: Sequence[Mapping[str, str]]) -> tuple[list[int], bool]: ...

    def decode(self, ids: Ids) -> str: ...


def sample_count(turns: Sequence[Mapping[str, object]]) -> int:
    """How many training samples an episode's turns make: one, plus one per turn where the
    chat template re-rendered history (each re-sends and trains the whole context)."""
    return 1 + sum(1 for turn in turns[1:] if turn.get("new_sample"))

"""The `text` an inference server writes for the ids it sampled, from the chat template's decode.

vLLM detokenizes incrementally (tokenizers' DecodeStream): a token whose text would end inside a
multi-byte UTF-8 character (a plain decode shows U+FFFD there) is held back until a later token
completes it. When the output ends first (max_tokens, or the stop token right after a partial
character), the held-back tail is never written. With byte-level BPE tokenizers (Qwen's, Llama's)
that happens to code, CJK and emoji text in every long run, so a check of `text` against the
ids has to expect it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_PARTIAL = "\ufffd"


def served_text(decode: Callable[[Sequence[int]], str], ids: Sequence[int]) -> str:
    """The decode of the longest prefix of `ids` whose text does not end in U+FFFD: what an
    incremental detokenizer has emitted when the output ends after `ids` (mid-text U+FFFD, an
    invalid byte later followed by text, is written as it is)."""
    end = len(ids)
    text = decode(ids)
    while end and text.endswith(_PARTIAL):
        end -= 1
        text = decode(ids[:end])
    return text

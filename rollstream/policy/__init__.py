"""The embedded default policy: a byte-level tokenizer, an append-only chat template, a tiny
causal LM and a vLLM-compatible HTTP server for it.

Only the torch-free parts are imported here, so `import rollstream.policy` stays cheap; the model
lives in `rollstream.policy.model` and the server in `rollstream.policy.server`.
"""

from rollstream.policy.chat import EmbeddedChatTemplate
from rollstream.policy.tokenizer import (
    ASSISTANT,
    END,
    EOS,
    PAD,
    USER,
    VOCAB_SIZE,
    ByteTokenizer,
)

__all__ = [
    "ASSISTANT",
    "END",
    "EOS",
    "PAD",
    "USER",
    "VOCAB_SIZE",
    "ByteTokenizer",
    "EmbeddedChatTemplate",
]

"""A real model's chat template, token-exact, from a local Hugging Face tokenizer directory.

The directory is what a model repository ships: `tokenizer.json` (read with the `tokenizers`
library), `tokenizer_config.json` (special tokens, and the Jinja chat template unless a
`chat_template.jinja` sits beside it) and optionally `generation_config.json` (its
`eos_token_id`s end a turn too). Nothing is downloaded. The template is rendered the way
transformers' `apply_chat_template` renders it: a sandboxed Jinja environment with
`trim_blocks`/`lstrip_blocks`, loop controls, `raise_exception`, `strftime_now` and a `tojson`
that keeps non-ASCII text.

A template file can replace the directory's (`chat_template`): rollstream/inference/templates/ has
variants of Qwen3's and DeepSeek-R1's that keep earlier reasoning, so thinking conversations
stay append-only (one sample per episode instead of one per turn).

Multi-turn without re-tokenizing (RUN's contract, see `next_prompt`): the sample's ids are kept
as sampled; the new message is rendered together with the whole conversation as text, and when
that text starts with the text of the sample's ids, only the rest is tokenized and appended.
When it does not, the template re-rendered history differently (Qwen3 drops the <think> blocks
of earlier assistant turns once a new user message follows), so appending would train on a
context the model never saw at inference and vice versa: the episode starts a new sample whose
prompt is the whole re-rendered conversation. Nothing is ever silently re-tokenized.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from rollstream.contracts.codec import Ids, id_list

_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class TemplateError(ValueError):
    """The tokenizer directory lacks what is needed, or the template refused the messages."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json spells a special token as a string or as an AddedToken object.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class HFChatTemplate:
    def __init__(self, path: str | Path, template_kwargs: Mapping[str, Any] | None = None,
                 chat_template: str | Path | None = None) -> None:
        """`template_kwargs` are passed to the template (e.g. `enable_thinking`);
        `chat_template`, a Jinja file, replaces the tokenizer directory's template."""
        root = Path(path)
        if not (root / "tokenizer.json").is_file():
            raise TemplateError(f"{root}: no tokenizer.json (a local tokenizer directory)")
        self.tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        config_path = root / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        if chat_template is not None:
            if not Path(chat_template).is_file():
                raise TemplateError(f"{chat_template}: no such chat template file")
            source = Path(chat_template).read_text()
        else:
            source = self._template_source(root, config)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template = env.from_string(source)
        self.special = {k: _token_text(config.get(k)) for k in _SPECIAL_KEYS}
        self.template_kwargs = dict(template_kwargs or {})
        self.stop_token_ids = self._stop_ids(root, self.special["eos_token"])
        # Whether the tokenizer reads text as its NFC form (Qwen's normalizer), and does nothing
        # else to it (a SentencePiece-style one rewrites spaces: not comparable as text).
        probe = " Cafe\u0301  x\n"
        normalizer = self.tokenizer.normalizer
        self._nfc = normalizer is not None and (
            normalizer.normalize_str(probe) == unicodedata.normalize("NFC", probe))

    @staticmethod
    def _template_source(root: Path, config: Mapping[str, Any]) -> str:
        if (root / "chat_template.jinja").is_file():
            return (root / "chat_template.jinja").read_text()
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = {t.get("name"): t.get("template") for t in template}.get("default")
        if not isinstance(template, str):
            raise TemplateError(f"{root}: no chat template (tokenizer_config.json "
                                "chat_template or chat_template.jinja)")
        return template

    def _stop_ids(self, root: Path, eos: str | None) -> list[int]:
        ids: list[int] = []
        if eos is not None and self.tokenizer.token_to_id(eos) is not None:
            ids.append(self.tokenizer.token_to_id(eos))
        generation = root / "generation_config.json"
        if generation.is_file():
            extra = json.loads(generation.read_text()).get("eos_token_id", [])
            ids += [i for i in (extra if isinstance(extra, list) else [extra]) if i not in ids]
        if not ids:
            raise TemplateError(f"{root}: no end-of-turn token (eos_token / eos_token_id)")
        return ids

    # -- text and ids ------------------------------------------------------------------------

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
               tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """`tools`: function definitions, passed as transformers passes them (the gateway)."""
        return self.template.render(messages=list(messages), tools=tools,
                                    add_generation_prompt=add_generation_prompt,
                                    **self.special, **self.template_kwargs)

    def encode(self, text: str) -> list[int]:
        # Special tokens written in the text (<|im_start|>) become their ids; no BOS is added:
        # the template writes whatever the model expects.
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Ids) -> str:
        # The tokenizer reads a list of Python ints (RUN's sample is an int32 array).
        return self.tokenizer.decode(id_list(ids), skip_special_tokens=False)

    def _normalize(self, text: str) -> str:
        return unicodedata.normalize("NFC", text) if self._nfc else text

    # -- RUN's interface ---------------------------------------------------------------------

    def first_prompt(self, user_text: str) -> list[int]:
        return self.encode(self.render([{"role": "user", "content": user_text}], True))

    def next_prompt(
        self, sample_ids: Ids, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[list[int], bool]:
        """(ids, new_sample): the ids to append to `sample_ids` for the conversation
        `messages` (which ends with the new message) and a generation prompt; or, where the
        template does not render the conversation as an extension of those ids, the whole
        re-rendered conversation and True (start a new sample)."""
        # Compared as the tokenizer sees text: a normalizing one (Qwen's: NFC) reads a
        # decomposed observation as its composed form, so the two spellings are one history.
        text = self._normalize(self.render(messages, add_generation_prompt=True))
        history = self._normalize(self.decode(sample_ids))
        if text.startswith(history):
            return self.encode(text[len(history):]), False
        return self.encode(text), True

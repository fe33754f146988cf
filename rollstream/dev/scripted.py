"""A scripted policy: vLLM's completions contract (the embedded server's own request and
response code, rollstream.policy_server.app) with completions read from scripts, not sampled.

RUN cannot tell it from a model: it sends token ids, gets token ids, logprobs (0.0: the script
is certain) and the stop token back. The server finds the episode's script from the prompt
itself: it decodes the messages before the first assistant turn and picks the script whose
`match` text occurs in them
(the longest match wins; "" matches everything), and the turn from the number of assistant turns
already in the prompt. Past its end a script answers with an empty completion.

Used by tests and demos to drive the pipeline deterministically: `rollstream serve-scripted
--swe-gold examples/swe/instances.jsonl` replays every task's gold patch as tool calls.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollstream.contracts.inference import ASSISTANT, EOS, VOCAB_SIZE, ByteTokenizer

DEFAULT_MAX_MODEL_LEN = 1 << 20  # a script has no context limit worth modelling


@dataclass(frozen=True)
class Script:
    match: str  # text of the first user message that selects this script
    completions: list[str]  # one per turn


class ScriptedEngine:
    """Stands in for rollstream.policy_server.engine.Engine: same interface, no model."""

    policy_version = 0
    max_batch = 1

    def __init__(self, scripts: list[Script], max_model_len: int = DEFAULT_MAX_MODEL_LEN):
        # Longest match first, so a specific script beats a catch-all.
        self.scripts = sorted(scripts, key=lambda s: len(s.match), reverse=True)
        self.max_model_len = max_model_len
        self.vocab_size = VOCAB_SIZE
        self.tokenizer = ByteTokenizer()
        self.running = 0
        self.adapters: dict[str, str] = {}  # none: no weights to load as one
        self.waiting: deque = deque()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.alive = False

    def start(self) -> None:
        self.alive = True

    async def stop(self) -> None:
        self.alive = False

    async def load_weights(self, path: str, version: int | None) -> int:
        raise ValueError("a scripted policy has no weights to load")

    async def load_adapter(self, name: str, path: str) -> int:
        raise ValueError("a scripted policy has no weights to load")

    def completion_text(self, prompt_ids: list[int]) -> str:
        # Every message before the first assistant turn (a system message may come first).
        end = prompt_ids.index(ASSISTANT) if ASSISTANT in prompt_ids else len(prompt_ids)
        question = self.tokenizer.decode(prompt_ids[:end], skip_special_tokens=True)
        turn = max(prompt_ids.count(ASSISTANT) - 1, 0)
        for script in self.scripts:
            if script.match in question:
                return script.completions[turn] if turn < len(script.completions) else ""
        return ""

    async def generate(self, seq: Any) -> int:
        """Fill `seq` (a policy.model.Sequence) as a decode would have."""
        params = seq.params
        ids = self.tokenizer.encode(self.completion_text(seq.prompt_ids))
        if len(ids) < params.max_tokens:
            stop = params.stop_token_ids[0] if params.stop_token_ids else EOS
            ids.append(stop)
            seq.finish_reason = "stop"
            seq.stop_reason = stop if params.stop_token_ids else None
        else:
            ids = ids[: params.max_tokens]
            seq.finish_reason = "length"
        seq.token_ids = ids
        seq.logprobs = [0.0] * len(ids)
        self.prompt_tokens_total += len(seq.prompt_ids)
        self.generation_tokens_total += len(ids)
        return self.policy_version


def read_scripts(path: Path) -> list[Script]:
    """A JSONL file of {"match": text, "completions": [text, ...]}."""
    scripts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            item = json.loads(line)
            if not isinstance(item.get("match"), str) or not isinstance(
                    item.get("completions"), list):
                raise ValueError(f"{path}:{number}: expected {{\"match\", \"completions\"}}")
            scripts.append(Script(item["match"], [str(c) for c in item["completions"]]))
    return scripts


def swe_scripts(path: Path, fmt: str, gold: bool) -> list[Script]:
    """Per SWE task in an instance file: its gold patch as tool calls then submit (gold), or
    submit at once."""
    from producers.publish import load_tasks
    from rollstream.envs.swe.gold import gold_script, submit_only_script
    from rollstream.envs.swe.instance import SweInstance

    scripts = []
    for task in load_tasks(path, fmt):
        instance = SweInstance.from_task(task)
        completions = gold_script(instance) if gold else submit_only_script()
        scripts.append(Script(instance.instance_id, completions))
    return scripts


def create_app(scripts: list[Script], max_model_len: int = DEFAULT_MAX_MODEL_LEN,
               model_name: str = "rollstream-scripted") -> Any:
    from rollstream.policy_server.app import build_app

    return build_app(ScriptedEngine(scripts, max_model_len), model_name, "scripted")

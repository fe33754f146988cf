"""Sampling parameters: their defaults in one place, and the checks a server applies to them.

The defaults are the Avro record's (`schemas/sampling.avsc`, a task's `sampling`): RUN's client
fills the fields a task leaves out with them, and the embedded server's `SamplingParams` takes
the same defaults for the same fields. Where vLLM's server differs, the embedded server follows
vLLM, since it must answer a request as vLLM would: a body without `max_tokens` gets 16 tokens
(`SERVER_MAX_TOKENS`, vLLM's completions default), where a task's default is 64 per turn. RUN
sends every field explicitly, so that difference never reaches a rollout.

`rollstream.contracts.events.SamplingParams` is the record's shape as a TypedDict; it has no
defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import schemas
from rollstream.contracts.events import SAMPLING_PARAMS

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

"""Tiny causal LM of the embedded policy, its checkpoints, and batched sampling.

The model is embedding → 2-layer GRU → linear head over the byte vocabulary. A recurrent state
instead of attention keeps each decode step O(1) in the context length and lets sequences of any
length share a batch without padding or masks, so continuous batching is just adding and dropping
rows of the state. `forward` scores whole sequences, for a trainer.

Sampled-token logprobs are taken from the distribution actually sampled from: after temperature,
top-k and top-p, renormalized (vLLM's `--logprobs-mode processed_logprobs`; vLLM's default
`raw_logprobs` reports the model's distribution before any of them). Greedy rows (temperature 0)
report the top-k/top-p filtered distribution at temperature 1, as vLLM's processed mode does.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence

from rollstream.contracts.inference import END, EOS, PAD, VOCAB_SIZE, SamplingParams

MAX_MODEL_LEN = 2048
GREEDY_EPS = 1e-5  # vLLM treats temperature below this as greedy
_META_VERSION = "rollstream_policy_version"
_META_CONFIG = "rollstream_model_config"


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = VOCAB_SIZE
    d_model: int = 128
    n_layers: int = 2
    max_model_len: int = MAX_MODEL_LEN


class TinyLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.gru = nn.GRU(config.d_model, config.d_model, config.n_layers, batch_first=True)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(
        self, input_ids: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, T] → logits [B, T, V] and the recurrent state [layers, B, d]."""
        out, state = self.gru(self.embed(input_ids), state)
        return self.head(out), state

    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts of any lengths → next-token logits [n, V] and state [layers, n, d]."""
        lengths = torch.tensor([len(p) for p in prompts])
        padded = pad_sequence(
            [torch.tensor(p) for p in prompts], batch_first=True, padding_value=PAD
        )
        packed = pack_padded_sequence(
            self.embed(padded), lengths, batch_first=True, enforce_sorted=False
        )
        _, state = self.gru(packed)  # h_n comes back in the prompts' order
        return self.head(state[-1]), state

    def decode(
        self, tokens: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step for a batch: tokens [B] → next-token logits [B, V], new state."""
        out, state = self.gru(self.embed(tokens[:, None]), state)
        return self.head(out[:, 0]), state


def build_model(seed: int = 0, config: ModelConfig | None = None) -> TinyLM:
    """Deterministic seed weights (version 0), built without touching the global RNG.

    The head is shaped so the untrained policy is usable in demos: it samples printable ASCII and
    newlines, and emits `<|end|>` with probability about 1/32 per token, so a turn ends after ~32
    tokens instead of always running to max_tokens.
    """
    config = config or ModelConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(config)
        with torch.no_grad():
            nn.init.normal_(model.head.weight, std=0.02)  # small noise around the biases below
            printable = [*range(32, 127), ord("\n")]
            bias = torch.full((config.vocab_size,), -8.0)
            bias[printable] = 0.0
            bias[END] = math.log(len(printable) / 31)  # p(END) = 1/32 at uniform printable
            model.head.bias.copy_(bias)
    return model.eval()


def save(model: TinyLM, path: str | Path, version: int) -> None:
    """Write a safetensors checkpoint with the policy version and config in its metadata.

    Written to a temporary name and renamed, so a server reloading `path` never reads a torn file.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    metadata = {_META_VERSION: str(int(version)), _META_CONFIG: json.dumps(asdict(model.config))}
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def load(path: str | Path) -> tuple[TinyLM, int]:
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    if _META_VERSION not in metadata or _META_CONFIG not in metadata:
        raise ValueError(f"{path} is not a Rollstream policy checkpoint (metadata missing)")
    model = TinyLM(ModelConfig(**json.loads(metadata[_META_CONFIG])))
    model.load_state_dict(tensors)
    return model.eval(), int(metadata[_META_VERSION])


class ContextLengthError(ValueError):
    """Prompt (plus max_tokens) does not fit the context; messages follow vLLM's wording."""


def check_context(prompt_len: int, max_tokens: int, max_model_len: int) -> None:
    if prompt_len >= max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. "
            "Please reduce the length of the input messages."
        )
    if prompt_len + max_tokens > max_model_len:
        raise ContextLengthError(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has {prompt_len} "
            f"input tokens ({max_tokens} > {max_model_len} - {prompt_len})."
        )


class Sequence:
    """One request's generation; a DecodeBatch owns its recurrent state row."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        # The weight set that samples it: "" the server's own, else an adapter's name (engine).
        self.adapter = ""
        self.stop_set = frozenset(params.stop_token_ids)
        # The uniform draw for each token, drawn once on joining a batch: from the request's own
        # generator when it has a seed, so it samples the same whatever shares its batch.
        self.uniforms: list[float] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        # Per token: the top `params.logprobs` (id, logprob) pairs; only kept when asked for.
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.finish_reason = ""  # "stop", "length" or "abort" once finished
        self.stop_reason: int | None = None  # the stop_token_ids entry that ended it
        self.aborted = False  # set by the owner (client went away); dropped at the next step


class DecodeBatch:
    """Sequences decoded together one token per step; rows join (`add`) and leave (finished,
    returned by `step`) between steps. Not thread-safe: one caller at a time."""

    def __init__(self, model: TinyLM, seed: int = 0, eos_token_id: int = EOS) -> None:
        self.model = model
        self.eos_token_id = eos_token_id
        self.seqs: list[Sequence] = []
        self._state: torch.Tensor | None = None  # [layers, B, d]
        self._logits: torch.Tensor | None = None  # [B, V], next-token logits per row
        self._generator = torch.Generator().manual_seed(seed)  # for requests without a seed
        self._params: dict[str, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.seqs)

    @torch.no_grad()
    def add(self, seqs: list[Sequence]) -> None:
        max_len = self.model.config.max_model_len
        for seq in seqs:
            if not seq.prompt_ids:
                raise ValueError("Prompt cannot be empty")
            check_context(len(seq.prompt_ids), seq.params.max_tokens, max_len)
        for seq in seqs:
            seed = seq.params.seed
            gen = torch.Generator().manual_seed(seed) if seed is not None else self._generator
            seq.uniforms = torch.rand(seq.params.max_tokens, generator=gen).tolist()
        logits, state = self.model.prefill([s.prompt_ids for s in seqs])
        if self.seqs:
            logits = torch.cat([self._logits, logits])
            state = torch.cat([self._state, state], dim=1)
        self.seqs = self.seqs + seqs
        self._logits, self._state = logits, state
        self._rebuild_params()

    def clear(self) -> None:
        self.seqs, self._state, self._logits = [], None, None

    @torch.no_grad()
    def step(self) -> list[Sequence]:
        """Sample one token for every row; return the sequences that finished (now removed)."""
        if not self.seqs:
            return []
        tokens, logprobs, top_ids, top_lps = self._sample()
        max_len = self.model.config.max_model_len
        finished: list[Sequence] = []
        keep: list[int] = []
        for i, (seq, token, lp) in enumerate(
            zip(self.seqs, tokens.tolist(), logprobs.tolist(), strict=True)
        ):
            if seq.aborted:
                seq.finish_reason = "abort"
                finished.append(seq)
                continue
            seq.token_ids.append(token)
            seq.logprobs.append(lp)
            if seq.params.logprobs:
                k = seq.params.logprobs
                pairs = zip(top_ids[i, :k].tolist(), top_lps[i, :k].tolist(), strict=True)
                seq.top_logprobs.append(list(pairs))
            if token == self.eos_token_id and not seq.params.ignore_eos:
                seq.finish_reason = "stop"  # EOS: vLLM leaves stop_reason None
            elif token in seq.stop_set:
                seq.finish_reason, seq.stop_reason = "stop", token
            elif (
                len(seq.token_ids) >= seq.params.max_tokens
                or len(seq.prompt_ids) + len(seq.token_ids) >= max_len
            ):
                seq.finish_reason = "length"
            else:
                keep.append(i)
                continue
            finished.append(seq)
        if len(keep) < len(self.seqs):
            if not keep:
                self.clear()
                return finished
            rows = torch.tensor(keep)
            self.seqs = [self.seqs[i] for i in keep]
            self._state = self._state.index_select(1, rows)
            tokens = tokens.index_select(0, rows)
            self._rebuild_params()
        self._logits, self._state = self.model.decode(tokens, self._state)
        return finished

    def _rebuild_params(self) -> None:
        # Per-row sampling parameters as tensors, rebuilt only when the batch changes.
        vocab = self.model.config.vocab_size
        ps = [s.params for s in self.seqs]
        temperature = torch.tensor([p.temperature for p in ps])
        # As vLLM's input batch: a top_k of 0, -1 or at least the vocabulary is no filter.
        top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in ps])
        top_p = torch.tensor([p.top_p for p in ps])
        filtered = (top_k < vocab) | (top_p < 1)
        self._params = {
            "greedy": temperature < GREEDY_EPS,
            "temperature": temperature.clamp(min=GREEDY_EPS)[:, None],
            "filtered": filtered.nonzero()[:, 0],  # rows that need the sorted top-k/top-p pass
            "top_k": top_k[filtered][:, None],
            "top_p": top_p[filtered][:, None],
        }
        self._any_top_p = bool((top_p < 1).any())
        self._max_top = max(p.logprobs for p in ps)

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        p = self._params
        logits = torch.where(p["greedy"][:, None], self._logits, self._logits / p["temperature"])
        rows = p["filtered"]
        if len(rows):  # sorting is the costliest op: only for rows that filter
            sub = logits.index_select(0, rows)
            ranked, order = sub.sort(dim=-1, descending=True, stable=True)
            drop = torch.arange(sub.shape[1]) >= p["top_k"]
            if self._any_top_p:
                probs = ranked.masked_fill(drop, -math.inf).softmax(-1)
                # Keep the smallest prefix whose mass reaches top_p (the top token always stays);
                # rows at top_p=1 are exempt, or float rounding of the cumsum could drop a tail.
                drop |= (probs.cumsum(-1) - probs >= p["top_p"]) & (p["top_p"] < 1)
            drop = torch.zeros_like(drop).scatter_(1, order, drop)  # back to token order
            logits = logits.index_copy(0, rows, sub.masked_fill(drop, -math.inf))
        logprobs = logits.log_softmax(-1)
        # Inverse-CDF sampling in token-id order, so a row's token depends only on its own
        # logits and uniform, never on which other rows share the batch.
        u = torch.tensor([s.uniforms[len(s.token_ids)] for s in self.seqs])
        cdf = logprobs.exp().cumsum(-1)
        tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
        tokens = tokens.clamp_(max=cdf.shape[1] - 1)
        tokens = torch.where(p["greedy"], logprobs.argmax(-1), tokens)
        sampled = logprobs.gather(1, tokens[:, None])[:, 0]
        top_lps, top_ids = logprobs.topk(self._max_top, dim=-1)
        return tokens, sampled, top_ids, top_lps


def generate(
    model: TinyLM,
    prompts: list[list[int]],
    max_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    seeds: list[int | None] | None = None,
    stop_token_ids: list[int] | tuple[int, ...] = (),
) -> list[tuple[list[int], list[float], str]]:
    """Sample completions for prompts of different lengths in one batch.

    Returns (token_ids, logprobs, finish_reason) per prompt; a stop token that ended a completion
    is its last id (and has a logprob), as in vLLM's `token_ids`.
    Raises ContextLengthError when a prompt plus max_tokens exceeds the model's context.
    """
    seeds = seeds if seeds is not None else [None] * len(prompts)
    seqs = [
        Sequence(
            list(prompt),
            SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                stop_token_ids=tuple(stop_token_ids),
            ),
        )
        for prompt, seed in zip(prompts, seeds, strict=True)
    ]
    batch = DecodeBatch(model)
    batch.add(seqs)
    while len(batch):
        batch.step()
    return [(s.token_ids, s.logprobs, s.finish_reason) for s in seqs]

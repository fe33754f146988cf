"""TRL 1.16's AsyncGRPOTrainer on a CPU: the two CUDA-only pieces that keep it off one, replaced
(the tests and examples/trainers/trl_async_grpo.py train with them):

- the FlashAttention-3 kernel its tree attention fetches from a model hub at run time, by
  `varlen_attention` in plain torch (TRL's tree attention around it unchanged);
- the peak-flops lookup by `torch.cuda.get_device_name`, answered "unknown", as TRL answers for
  a device it does not know (its MFU metrics are then left out).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                     cu_k: torch.Tensor, max_q: int, max_k: int, softmax_scale: float | None = None,
                     causal: bool = True, window_size: tuple[int, int] = (-1, -1),
                     **_: object) -> torch.Tensor:
    """FlashAttention's `flash_attn_varlen_func` in plain torch: each segment's queries (rows
    cu_q[s]:cu_q[s+1] of q) attend to its keys (cu_k[s]:cu_k[s+1]), causal aligned bottom-right
    as the kernel is (query i of Lq sees keys up to i + Lk - Lq), grouped-query heads shared."""
    if not causal or window_size != (-1, -1):
        raise NotImplementedError("the CPU attention covers causal, unwindowed attention only")
    out = []
    for s in range(len(cu_q) - 1):
        qs, ks, vs = (x[c[s]:c[s + 1]].transpose(0, 1)
                      for x, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        ks, vs = (x.repeat_interleave(qs.shape[0] // x.shape[0], 0) for x in (ks, vs))
        lq, lk = qs.shape[1], ks.shape[1]
        mask = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        out.append(torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=softmax_scale).transpose(0, 1))
    return torch.cat(out)


def replacements() -> list[tuple[Any, str, Callable[..., Any]]]:
    """(module, attribute, replacement) for each CUDA-only piece (for a test's monkeypatch)."""
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    return [(packing, "_flash_attn",
             lambda: types.SimpleNamespace(flash_attn_varlen_func=varlen_attention)),
            (async_grpo_trainer, "get_peak_flops_per_device", lambda *_: None)]


def use_cpu() -> None:
    """Replace them for the rest of the process."""
    for module, name, replacement in replacements():
        setattr(module, name, replacement)

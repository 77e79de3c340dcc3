"""Small problems go to PyTorch's scaled_dot_product_attention, so that `sageattn` is never meaningfully slower.

Quantized attention pays for quantizing Q, K and V with faster matrix products; with a handful of keys (text
cross-attention: 77) or a tiny problem there is nothing to win back, and PyTorch's kernels are exact. Where a
compiled family was measured slower than SDPA below some number of keys (archs.py's "sdpa_below_keys": Hopper's
short sequences), those calls go to SDPA too. Only
`sageattn` does this (the named variants always run their kernels), and only where SDPA computes the same thing:
no LSE asked for, no attention mask, no causal alignment that leaves rows without keys (SDPA gives those NaN,
sageattn 0).

`SAGEATTN_SDPA_FALLBACK=0` in the environment, or `set_sdpa_fallback(False)`, forces the quantized kernels;
`sageattention.explain(...)` and the `sageattention` logger (DEBUG) say which path a call takes.
"""
from __future__ import annotations

import os

import torch

from . import archs


MIN_KEYS = 128  # fewer keys than one quantization block of K
# B * Hq * Nq * Nk * D below this: the quantized path's fixed GPU cost (its preparation launches, ~12 µs on an H100)
# is about what SDPA needs for the whole call (B1 H16 N1k d64 = 2**30: 30 µs of GPU time against cuDNN's 13,
# docs/decisions/0001-sdpa-for-small-problems.md)
MIN_MACS = 1 << 31

_enabled = os.environ.get("SAGEATTN_SDPA_FALLBACK", "1").strip() != "0"


def is_enabled() -> bool:
    return _enabled


def set_sdpa_fallback(enabled: bool) -> None:
    """Whether `sageattn` may hand small problems to SDPA (default True; the environment's
    SAGEATTN_SDPA_FALLBACK=0 sets it False at import)."""
    global _enabled
    _enabled = bool(enabled)


def _sdpa_agrees(is_causal: bool, causal_offset: int, masked: bool, return_lse: bool) -> bool:
    """The fallback is on and SDPA computes what sageattn would."""
    return _enabled and not (return_lse or masked or (is_causal and causal_offset < 0))


def sdpa_reason(b: int, hq: int, nq: int, nk: int, d: int, *, is_causal: bool, causal_offset: int, masked: bool,
                return_lse: bool) -> str | None:
    """Why this `sageattn` call goes to SDPA, or None when it runs the quantized kernels."""
    if not _sdpa_agrees(is_causal, causal_offset, masked, return_lse):
        return None
    if nk < MIN_KEYS:
        return f"{nk} keys (fewer than {MIN_KEYS}): quantizing K and V cannot pay off"
    if b * hq * nq * nk * d < MIN_MACS:
        return f"{b * hq * nq * nk * d} multiply-adds (fewer than 2**31): too small to pay for quantization"
    return None


def slower_kernels_reason(family: str, nk: int, d: int, *, is_causal: bool, causal_offset: int,
                          return_lse: bool) -> str | None:
    """Why a `sageattn` call that the compiled `family` would run goes to SDPA instead (fewer keys than where that
    family measured faster than SDPA: archs.py's "sdpa_below_keys"), or None."""
    below = archs.FAMILIES[family].get("sdpa_below_keys", {}).get((64 if d <= 64 else 128, is_causal))
    if below is None or nk >= below or not _sdpa_agrees(is_causal, causal_offset, False, return_lse):
        return None
    kind = "causal, " if is_causal else ""
    return f"{nk} keys ({kind}head_dim {d}): the {family} kernels run slower than SDPA below {below} keys"


def sdpa(q, k, v, tensor_layout: str, is_causal: bool, causal_offset: int, sm_scale: float) -> torch.Tensor:
    """SDPA with sageattn's semantics: GQA, causal query i sees keys j <= i + causal_offset; output in q's layout
    (for NHD the same transposed view SDPA users get: copying it would cost more than the small problem itself)."""
    nhd = tensor_layout == "NHD"
    if nhd:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    mask = None
    if is_causal and causal_offset != 0:  # SDPA's is_causal is top-left (offset 0)
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(causal_offset)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal and mask is None, scale=sm_scale,
        enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2) if nhd else out

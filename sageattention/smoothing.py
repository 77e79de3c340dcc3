"""The smoothing vectors (per-channel token means) of K and V, shared by the reference and the Triton backend."""
from __future__ import annotations

import torch


def token_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of x [B, H, N, D], [B, H, 1, D] fp32 (accumulated in fp64 without a copy of x: an fp32 sum
    of bf16 values can overflow where their mean does not)."""
    return (x.sum(dim=2, keepdim=True, dtype=torch.float64) / x.shape[2]).float()


def usable_v_mean(v: torch.Tensor) -> torch.Tensor:
    """V smoothing's mean [B, H, 1, D] fp32, 0 on channels where v - mean would leave v's dtype (16-bit P·V stores
    v - mean there: fp16 V spanning +-65000 would overflow). Those channels are not smoothed, which changes only
    rounding; a NaN channel is not smoothed either, so NaN reaches the output through V itself."""
    mean = token_mean(v)
    lo, hi = torch.aminmax(v, dim=2, keepdim=True)
    fits = torch.maximum(hi.float() - mean, mean - lo.float()) <= torch.finfo(v.dtype).max
    return torch.where(fits, mean, torch.zeros_like(mean))

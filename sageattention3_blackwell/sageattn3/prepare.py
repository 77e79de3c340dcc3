"""Smoothing, padding and NVFP4 quantization of Q, K, V: the input every backend consumes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import nvfp4

Q_BLOCK = 128   # tokens per Q-smoothing block; also the query tile of the kernels
KV_TILE = 64    # keys per online-softmax step; P is two-level quantized per (row, tile)
HEAD_DIMS = (64, 128)


@dataclass
class QuantizedInputs:
    """Quantized operands in [B, H, tokens, ...] layout, tokens padded to the tile sizes.

    q_codes/k_codes: [B, H, N, D/2] uint8, scales [B, H, N, D/16] e4m3 (groups along head_dim).
    v_codes: [B, Hkv, D, Nk/2] uint8, v_scales [B, Hkv, D, Nk/16] (groups along tokens, the PV reduction dim).
    q_bias: [B, H, Nq/128, Nk] float32, the per-block Q-smoothing correction mean(Q_blk) . K_smooth, or None.
    k_mean: [B, Hkv, 1, D] float32, the token mean removed from K (softmax ignores it; the LSE does not).
    """
    q_codes: torch.Tensor
    q_scales: torch.Tensor
    k_codes: torch.Tensor
    k_scales: torch.Tensor
    v_codes: torch.Tensor
    v_scales: torch.Tensor
    q_bias: torch.Tensor | None
    k_mean: torch.Tensor
    n_q: int
    n_k: int
    head_dim: int


def padded_head_dim(d: int) -> int:
    for native in HEAD_DIMS:
        if d <= native:
            return native
    raise ValueError(f"head_dim {d} is not supported: sageattn3 handles head_dim <= {HEAD_DIMS[-1]} "
                     f"({' and '.join(map(str, HEAD_DIMS))} natively, smaller ones zero-padded)")


def _pad(x: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, extra]
    return torch.nn.functional.pad(x, pad)


def _tokens_per_block(n_padded: int, n_real: int, device) -> torch.Tensor:
    starts = torch.arange(0, n_padded, Q_BLOCK, device=device)
    return (n_real - starts).clamp(min=1, max=Q_BLOCK).float()


def quantize_inputs(q, k, v, per_block_mean: bool = True) -> QuantizedInputs:
    """q [B, H, Nq, D], k/v [B, Hkv, Nk, D] in HND layout; never modifies them."""
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    dp = padded_head_dim(d)
    qf = _pad(_pad(q.float(), 3, dp), 2, Q_BLOCK)
    kf = _pad(k.float(), 3, dp)
    vf = _pad(_pad(v.float(), 3, dp), 2, KV_TILE)

    # K smoothing: subtracting the token mean of K shifts every score of a query row by the
    # same amount, which softmax ignores, and removes the channel outliers FP4 cannot hold.
    k_mean = kf.mean(dim=2, keepdim=True)
    k_smooth = _pad(kf - k_mean, 2, KV_TILE)

    q_bias = None
    if per_block_mean:
        # Q smoothing per 128-token block; the removed part mean(Q_blk) . K_smooth is added back
        # to the scores in float32 (it differs per key, so softmax does not ignore it).
        means = qf.reshape(*qf.shape[:2], -1, Q_BLOCK, dp).sum(dim=3)
        means = means / _tokens_per_block(qf.shape[2], n_q, q.device)[:, None]
        valid = (torch.arange(qf.shape[2], device=q.device) < n_q)[:, None]
        qf = qf - means.repeat_interleave(Q_BLOCK, dim=2) * valid
        b, h, blocks = means.shape[:3]
        h_kv = k.shape[1]  # the query heads of one K/V head are consecutive: multiply them as one batch
        q_bias = (means.reshape(b, h_kv, -1, dp) @ k_smooth.transpose(2, 3)).reshape(b, h, blocks, -1)

    q_codes, q_scales = nvfp4.quantize(qf)
    k_codes, k_scales = nvfp4.quantize(k_smooth)
    v_codes, v_scales = nvfp4.quantize(vf.transpose(2, 3))
    return QuantizedInputs(q_codes, q_scales, k_codes, k_scales, v_codes.contiguous(), v_scales.contiguous(),
                           q_bias, k_mean, n_q, n_k, d)

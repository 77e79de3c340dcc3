"""Smoothing, padding and NVFP4 quantization of Q, K, V: the input every backend consumes."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import nvfp4

Q_BLOCK = 128   # tokens per Q-smoothing block; also the query tile of the kernels
KV_TILE = 64    # keys per online-softmax step; P is two-level quantized per (row, tile)
HEAD_DIMS = (64, 128)
FLOAT32_MAX = torch.finfo(torch.float32).max


@dataclass
class QuantizedInputs:
    """Quantized operands in [B, H, tokens, ...] layout, tokens padded to the tile sizes.

    q_codes/k_codes: [B, H, N, D/2] uint8, scales [B, H, N, D/16] e4m3 (groups along head_dim).
    v_codes: [B, Hkv, D, Nk/2] uint8, v_scales [B, Hkv, D, Nk/16] (groups along tokens, the PV reduction dim).
    q_bias: [B, H, Nq/128, Nk] float32, the per-block Q-smoothing correction mean(Q_blk) . K_smooth, or None.
    k_mean: [B, Hkv, 1, D] float32, the token mean removed from K (softmax ignores it; the LSE does not).
    Q, K and V are divided by a per-tensor float32 scale before NVFP4 quantization (NVFP4's second
    level): qk_scale (0-d float64) is the product of the Q and K scales, v_scale (0-d float32) V's;
    q_bias is in the units of the normalized Q and K. Use `kernel_scales` to get what the kernels read.
    """
    q_codes: torch.Tensor
    q_scales: torch.Tensor
    k_codes: torch.Tensor
    k_scales: torch.Tensor
    v_codes: torch.Tensor
    v_scales: torch.Tensor
    q_bias: torch.Tensor | None
    k_mean: torch.Tensor
    qk_scale: torch.Tensor
    v_scale: torch.Tensor
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


def _finite_mean(x: torch.Tensor, dim: int, include: torch.Tensor | bool = True) -> torch.Tensor:
    """Mean over `dim` of the finite entries that `include` selects: one NaN or inf input stays in its
    own token instead of reaching every token that smoothing subtracts the mean from."""
    counted = x.isfinite() & include
    return torch.where(counted, x, 0.0).sum(dim, keepdim=True) / counted.sum(dim, keepdim=True).clamp(min=1)


def _finite_amax(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.isfinite(), x.abs(), 0.0).amax()


def _tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor float32 scale: maps the largest finite |x| onto 6 * 448, the largest value
    an e2m1 code times an e4m3 group scale can hold, so that no group scale is clipped at 448 and
    groups far below the maximum still get e4m3 scales (tiny and huge tensors keep their values)."""
    amax = _finite_amax(x)
    return torch.where(amax > 0, amax / nvfp4.MAX_VALUE, 1.0)


def _normalize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale, with NaN for every non-finite entry: NVFP4 has no infinity, and a NaN group scale
    makes the element's group NaN (an inf would otherwise saturate to a finite 6 * 448)."""
    return torch.where(x.isfinite(), x / scale, torch.nan)


def quantize_inputs(q, k, v, per_block_mean: bool = True) -> QuantizedInputs:
    """q [B, H, Nq, D], k/v [B, Hkv, Nk, D] in HND layout; never modifies them."""
    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    dp = padded_head_dim(d)
    qf = _pad(_pad(q.float(), 3, dp), 2, Q_BLOCK)
    kf = _pad(k.float(), 3, dp)
    vf = _pad(_pad(v.float(), 3, dp), 2, KV_TILE)

    # K smoothing: subtracting the token mean of K shifts every score of a query row by the
    # same amount, which softmax ignores, and removes the channel outliers FP4 cannot hold.
    k_mean = _finite_mean(kf, dim=2)
    k_smooth = kf - k_mean
    k_scale = _tensor_scale(k_smooth)
    k_norm = _pad(_normalize(k_smooth, k_scale), 2, KV_TILE)

    q_bias, means = None, None
    if per_block_mean:
        # Q smoothing per 128-token block; the removed part mean(Q_blk) . K_smooth is added back
        # to the scores in float32 (it differs per key, so softmax does not ignore it).
        blocks = qf.reshape(*qf.shape[:2], -1, Q_BLOCK, dp)
        real = (torch.arange(qf.shape[2], device=q.device) < n_q).reshape(-1, Q_BLOCK, 1)
        means = _finite_mean(blocks, dim=3, include=real)                 # [B, H, blocks, 1, D]
        qf = (blocks - means * real).reshape(qf.shape)
    q_scale = _tensor_scale(qf)
    if per_block_mean:
        # In the units of the normalized Q and K, as the kernels add it to their products.
        b, h, blocks = means.shape[:3]
        h_kv = k.shape[1]  # the query heads of one K/V head are consecutive: multiply them as one batch
        q_bias = ((means.reshape(b, h_kv, -1, dp) / q_scale) @ k_norm.transpose(2, 3)).reshape(b, h, blocks, -1)

    v_scale = _tensor_scale(vf)
    q_codes, q_scales = nvfp4.quantize(_normalize(qf, q_scale))
    k_codes, k_scales = nvfp4.quantize(k_norm)
    v_codes, v_scales = nvfp4.quantize(_normalize(vf, v_scale).transpose(2, 3))
    return QuantizedInputs(q_codes, q_scales, k_codes, k_scales, v_codes.contiguous(), v_scales.contiguous(),
                           q_bias, k_mean, q_scale.double() * k_scale.double(), v_scale, n_q, n_k, d)


def kernel_scales(qi: QuantizedInputs, sm_scale: float) -> torch.Tensor:
    """The float32 [3] every attention backend reads: (score scale, LSE factor, V scale).

    Score scale: sm_scale * log2(e) * the Q and K tensor scales, which turns a product of the
    normalized operands into a base-2 score. It is capped so that no score, |score| <= D * (6 * 448)^2
    + max |q_bias|, exceeds half the float32 range: a larger scale would overflow to inf and give NaN
    (inf - inf) in the online softmax. The cap changes only weights that float32 cannot resolve
    anyway (it is far above any scale at which softmax is not already a hard maximum).
    LSE factor: (uncapped / capped score scale), to report the true logsumexp of a capped row.
    V scale: the output multiplier (V's tensor scale).
    """
    bound = qi.q_codes.shape[-1] * 2 * nvfp4.MAX_VALUE ** 2
    if qi.q_bias is not None:
        bound = bound + _finite_amax(qi.q_bias).double()
    wanted = qi.qk_scale * (sm_scale * math.log2(math.e))
    cap = FLOAT32_MAX / 2 / bound
    used = wanted.clamp(-cap, cap)
    lse_factor = torch.where(used == 0, 1.0, wanted / used).clamp(max=FLOAT32_MAX)
    return torch.stack((used, lse_factor, qi.v_scale.double())).float()

"""Triton quantization kernels: INT8 Q/K (grouped scales, optional smoothing) and FP8 V (per-channel).

Arithmetic mirrors `sageattention.reference` exactly (fp32, IEEE division, round half away
from zero) so the quantized tensors match the reference bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant_groups import Grouping
from .fp8 import INTERPRET, to_e4m3



@triton.jit
def _load_tile(X, stride_n, offs_n, offs_d, N, D: tl.constexpr):
    ptrs = X + offs_n[:, None] * stride_n + offs_d[None, :]
    return tl.load(ptrs, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D), other=0.0).to(tl.float32)


@triton.jit
def _quant_int8_kernel(
    X, stride_xb, stride_xh, stride_xn,
    MEAN, stride_mb, stride_mh, stride_ms, SEG,
    OUT, SCALE, N, H,
    D: tl.constexpr, D_PAD: tl.constexpr,
    G1: tl.constexpr, R1: tl.constexpr, G2: tl.constexpr, R2: tl.constexpr,
    HAS_MEAN: tl.constexpr, HAS_SEG: tl.constexpr,
):
    BLOCK: tl.constexpr = G1 * R1 * G2 * R2
    pid_n, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D_PAD)
    x = _load_tile(X + b * stride_xb + h * stride_xh, stride_xn, offs_n, offs_d, N, D)
    if HAS_MEAN:
        seg = tl.zeros([BLOCK], dtype=tl.int32)
        if HAS_SEG:
            seg = tl.load(SEG + offs_n, mask=offs_n < N, other=0)
        m_ptrs = MEAN + b * stride_mb + h * stride_mh + seg[:, None] * stride_ms + offs_d[None, :]
        mean = tl.load(m_ptrs, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D), other=0.0)
        x = x - mean
    row_max = tl.reshape(tl.max(tl.abs(x), axis=1), (G1, R1, G2, R2))
    row_bad = tl.reshape(tl.sum(x * 0.0, axis=1), (G1, R1, G2, R2))  # NaN when a row holds NaN/Inf
    gmax = tl.max(tl.max(row_max, axis=3), axis=1)
    gbad = tl.sum(tl.sum(row_bad, axis=3), axis=1)
    scale = gmax / 127.0 + gbad
    scale = tl.where(scale == 0.0, 1.0, scale)  # [G1, G2]
    tok_scale = tl.reshape(tl.broadcast_to(tl.reshape(scale, (G1, 1, G2, 1)), (G1, R1, G2, R2)), (BLOCK,))
    # One scale per token: the attention kernel then reads scales contiguously, whatever the grouping.
    tl.store(SCALE + (b * H + h) * N + offs_n, tok_scale, mask=offs_n < N)
    y = tl.math.div_rn(x, tok_scale[:, None])
    y = (y + tl.where(y >= 0, 0.5, -0.5)).to(tl.int8)
    o_ptrs = OUT + ((b * H + h) * N + offs_n[:, None]) * D + offs_d[None, :]
    tl.store(o_ptrs, y, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D))


def quantize_int8(x: torch.Tensor, g: Grouping, mean: torch.Tensor | None = None, seg: torch.Tensor | None = None):
    """x [B, H, N, D] (any strides, last dim contiguous) -> (int8 [B, H, N, D] contiguous, fp32 scales [B, H, N]).

    Tokens of one quantization group (see quant_groups) share their scale; it is stored once per token.

    mean: fp32 [B, H, S, D] subtracted before quantizing (S = 1, or the segment of each token given by
    seg: int32 [N], for packed variable-length batches)."""
    b, h, n, d = x.shape
    out = torch.empty((b, h, n, d), dtype=torch.int8, device=x.device)
    scale = torch.empty((b, h, n), dtype=torch.float32, device=x.device)
    m = mean if mean is not None else scale  # dummy pointer when unused
    m_strides = mean.stride()[:3] if mean is not None else (0, 0, 0)
    grid = (triton.cdiv(n, g.block), h, b)
    _quant_int8_kernel[grid](
        x, x.stride(0), x.stride(1), x.stride(2),
        m, *m_strides, seg if seg is not None else scale,
        out, scale, n, h,
        D=d, D_PAD=max(16, triton.next_power_of_2(d)),
        G1=g.g1, R1=g.r1, G2=g.g2, R2=g.r2,
        HAS_MEAN=mean is not None, HAS_SEG=seg is not None, num_warps=8,
    )
    return out, scale


@triton.jit
def _v_channel_stats_kernel(
    V, stride_vb, stride_vh, stride_vn, MEAN, PART, N, H,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, HAS_MEAN: tl.constexpr,
):
    """Per token-block partial per-channel absmax of v - mean: PART [B, H, nblk, D]."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D_PAD)
    v = _load_tile(V + b * stride_vb + h * stride_vh, stride_vn, offs_n, offs_d, N, D)
    if HAS_MEAN:
        mean = tl.load(MEAN + (b * H + h) * D + offs_d, mask=offs_d < D, other=0.0)
        v = tl.where(offs_n[:, None] < N, v - mean[None, :], 0.0)
    part = tl.max(tl.abs(v), axis=0)
    nblk = tl.num_programs(0)
    tl.store(PART + ((b * H + h) * nblk + pid_n) * D + offs_d, part, mask=offs_d < D)


@triton.jit
def _v_fp8_kernel(
    V, stride_vb, stride_vh, stride_vn, MEAN, AMAX, SCALE, OUT, N, N_PAD, H,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, HAS_MEAN: tl.constexpr, EXACT_ROUND: tl.constexpr,
):
    """OUT [B, H, D, N_PAD] fp8 = (v - mean) / scale, transposed so tokens (the PV reduction) are contiguous;
    scale = absmax / 448 per channel (1 for an all-zero channel), also written to SCALE by the first block."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D_PAD)
    v = _load_tile(V + b * stride_vb + h * stride_vh, stride_vn, offs_n, offs_d, N, D)
    if HAS_MEAN:
        v = v - tl.load(MEAN + (b * H + h) * D + offs_d, mask=offs_d < D, other=0.0)[None, :]
    amax = tl.load(AMAX + (b * H + h) * D + offs_d, mask=offs_d < D, other=0.0)
    scale = tl.where(amax == 0.0, 1.0, amax / 448.0)
    if pid_n == 0:
        tl.store(SCALE + (b * H + h) * D + offs_d, scale, mask=offs_d < D)
    y = to_e4m3(tl.math.div_rn(v, scale[None, :]), EXACT_ROUND)
    o_ptrs = OUT + ((b * H + h) * D + offs_d[None, :]) * N_PAD + offs_n[:, None]
    tl.store(o_ptrs, y, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D))


def quantize_v_fp8(v: torch.Tensor, mean: torch.Tensor | None = None, block: int = 128):
    """v [B, H, N, D] -> (fp8 e4m3 V^T [B, H, D, N_PAD] with N_PAD a multiple of 16, fp32 scales [B, H, D]).

    mean: fp32 [B, H, D] (V smoothing) or None. Padding tokens are never read unmasked."""
    b, h, n, d = v.shape
    d_pad = max(16, triton.next_power_of_2(d))
    nblk = triton.cdiv(n, block)
    part = torch.empty((b, h, nblk, d), dtype=torch.float32, device=v.device)
    m = mean if mean is not None else part
    grid = (nblk, h, b)
    _v_channel_stats_kernel[grid](v, v.stride(0), v.stride(1), v.stride(2), m, part, n, h,
                                  D=d, D_PAD=d_pad, BLOCK=block, HAS_MEAN=mean is not None)
    amax = part.amax(dim=2)
    scale = torch.empty((b, h, d), dtype=torch.float32, device=v.device)
    n_pad = triton.cdiv(n, 16) * 16
    out = torch.empty((b, h, d, n_pad), dtype=torch.float8_e4m3fn, device=v.device)
    _v_fp8_kernel[grid](v, v.stride(0), v.stride(1), v.stride(2), m, amax, scale, out, n, n_pad, h,
                        D=d, D_PAD=d_pad, BLOCK=block, HAS_MEAN=mean is not None, EXACT_ROUND=INTERPRET)
    return out, scale

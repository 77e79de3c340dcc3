"""Triton quantization kernels: INT8 Q/K (grouped scales, optional smoothing) and FP8 V (per-channel).

Arithmetic mirrors `sageattention.reference` exactly (fp32; each group's reciprocal scale by IEEE
division, then one multiply per element; round half away from zero) so the quantized tensors match the
reference bit for bit.

Launch widths are module constants so `python -m bench.quant --sweep` can tune them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant_groups import Grouping
from .fp8 import INTERPRET, to_e4m3

INT8_WARPS = 4
V_WARPS = 4
STATS_WARPS = 8
STATS_CHUNK = 512  # tokens per program of the statistics pass, read STATS_ROWS at a time
STATS_ROWS = 32
V_BLOCK = 128  # tokens per program of the FP8 V pass

@triton.jit
def _load_tile(X, stride_n, offs_n, offs_d, N, D: tl.constexpr):
    ptrs = X + offs_n[:, None] * stride_n + offs_d[None, :]
    return tl.load(ptrs, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D), other=0.0).to(tl.float32)


@triton.jit
def int8_tile(x, G1: tl.constexpr, R1: tl.constexpr, G2: tl.constexpr, R2: tl.constexpr):
    """x fp32 [G1*R1*G2*R2, D] (tokens in the grouping's order) -> (int8 values, fp32 scale per token)."""
    BLOCK: tl.constexpr = G1 * R1 * G2 * R2
    row_max = tl.reshape(tl.max(tl.abs(x), axis=1), (G1, R1, G2, R2))
    row_bad = tl.reshape(tl.sum(x * 0.0, axis=1), (G1, R1, G2, R2))  # NaN when a row holds NaN/Inf
    gmax = tl.max(tl.max(row_max, axis=3), axis=1)
    gbad = tl.sum(tl.sum(row_bad, axis=3), axis=1)
    scale = gmax / 127.0 + gbad
    scale = tl.where(scale == 0.0, 1.0, scale)  # [G1, G2]
    tok_scale = tl.reshape(tl.broadcast_to(tl.reshape(scale, (G1, 1, G2, 1)), (G1, R1, G2, R2)), (BLOCK,))
    # One IEEE division per group, then a multiply per element: same values as the reference, less ALU work.
    inv = tl.reshape(tl.broadcast_to(tl.reshape(tl.math.div_rn(1.0, scale), (G1, 1, G2, 1)), (G1, R1, G2, R2)), (BLOCK,))
    y = x * inv[:, None]
    # Round half away from zero as trunc(|y| + 0.5) with the sign put back: the abs between the multiply and the
    # add keeps the compiler from fusing them into one FMA (which would round once, unlike the reference).
    t = (tl.abs(y) + 0.5).to(tl.int8)
    return tl.where(y < 0, -t, t), tok_scale


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
        if HAS_SEG:  # packed varlen keys: each token subtracts the mean of its own sequence
            seg = tl.load(SEG + offs_n, mask=offs_n < N, other=0)
            m_ptrs = MEAN + b * stride_mb + h * stride_mh + seg[:, None] * stride_ms + offs_d[None, :]
            x = x - tl.load(m_ptrs, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D), other=0.0)
        else:
            mean = tl.load(MEAN + b * stride_mb + h * stride_mh + offs_d, mask=offs_d < D, other=0.0)
            x = tl.where(offs_n[:, None] < N, x - mean[None, :], 0.0)  # padding rows stay 0: no say in the scale
    y, tok_scale = int8_tile(x, G1, R1, G2, R2)
    # One scale per token: the attention kernel then reads scales contiguously, whatever the grouping.
    tl.store(SCALE + (b * H + h) * N + offs_n, tok_scale, mask=offs_n < N)
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
        HAS_MEAN=mean is not None, HAS_SEG=seg is not None, num_warps=INT8_WARPS,
    )
    return out, scale


@triton.jit
def _kv_stats_kernel(
    K, stride_kb, stride_kh, stride_kn, V, stride_vb, stride_vh, stride_vn, VMEAN, KSUM, VMAX, N, H,
    D: tl.constexpr, D_PAD: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr,
    DO_K: tl.constexpr, DO_V: tl.constexpr, HAS_VMEAN: tl.constexpr,
):
    """One read of a CHUNK of tokens of K and V, ROWS at a time: partial per-channel sums of K (for its mean)
    and partial per-channel absmax of v - mean (for the FP8 V scales), into KSUM / VMAX [B, H, nchunk, D]."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_d = tl.arange(0, D_PAD)
    k_acc = tl.zeros([ROWS, D_PAD], dtype=tl.float32)
    v_acc = tl.zeros([ROWS, D_PAD], dtype=tl.float32)
    if HAS_VMEAN:
        mean = tl.load(VMEAN + (b * H + h) * D + offs_d, mask=offs_d < D, other=0.0)
    for start in range(pid_n * CHUNK, tl.minimum(pid_n * CHUNK + CHUNK, N), ROWS):
        offs_n = start + tl.arange(0, ROWS)
        if DO_K:
            k_acc += _load_tile(K + b * stride_kb + h * stride_kh, stride_kn, offs_n, offs_d, N, D)
        if DO_V:
            v = _load_tile(V + b * stride_vb + h * stride_vh, stride_vn, offs_n, offs_d, N, D)
            if HAS_VMEAN:
                v = tl.where(offs_n[:, None] < N, v - mean[None, :], 0.0)
            v_acc = tl.maximum(v_acc, tl.abs(v))
    part = ((b * H + h) * tl.num_programs(0) + pid_n) * D + offs_d
    if DO_K:
        tl.store(KSUM + part, tl.sum(k_acc, axis=0), mask=offs_d < D)
    if DO_V:
        tl.store(VMAX + part, tl.max(v_acc, axis=0), mask=offs_d < D)


@triton.jit
def _stats_finalize_kernel(KSUM, VMAX, KMEAN, VAMAX, NPART, N, H, D: tl.constexpr, D_PAD: tl.constexpr,
                           PARTS: tl.constexpr, DO_K: tl.constexpr, DO_V: tl.constexpr):
    """Reduce the per-chunk partials of one head: KMEAN = sum / N, VAMAX = max."""
    h, b = tl.program_id(0), tl.program_id(1)
    offs_d = tl.arange(0, D_PAD)
    k_acc = tl.zeros([PARTS, D_PAD], dtype=tl.float32)
    v_acc = tl.zeros([PARTS, D_PAD], dtype=tl.float32)
    for start in range(0, NPART, PARTS):
        offs_p = start + tl.arange(0, PARTS)
        ptrs = ((b * H + h) * NPART + offs_p[:, None]) * D + offs_d[None, :]
        valid = (offs_p[:, None] < NPART) & (offs_d[None, :] < D)
        if DO_K:
            k_acc += tl.load(KSUM + ptrs, mask=valid, other=0.0)
        if DO_V:
            v_acc = tl.maximum(v_acc, tl.load(VMAX + ptrs, mask=valid, other=0.0))
    if DO_K:
        tl.store(KMEAN + (b * H + h) * D + offs_d, tl.sum(k_acc, axis=0) / N, mask=offs_d < D)
    if DO_V:
        tl.store(VAMAX + (b * H + h) * D + offs_d, tl.max(v_acc, axis=0), mask=offs_d < D)


def token_stats(k: torch.Tensor | None, v: torch.Tensor | None, v_mean: torch.Tensor | None = None):
    """One pass over k and v [B, H, N, D] (last dim contiguous; either may be None):
    (k token mean fp32 [B, H, 1, D] or None, absmax over tokens of v - v_mean fp32 [B, H, D] or None)."""
    x = k if k is not None else v
    b, h, n, d = x.shape
    d_pad = max(16, triton.next_power_of_2(d))
    nblk = triton.cdiv(n, STATS_CHUNK)
    parts = torch.empty((2, b, h, nblk, d), dtype=torch.float32, device=x.device)
    stats = torch.empty((2, b, h, d), dtype=torch.float32, device=x.device)  # k mean, v absmax
    ks = k.stride()[:3] if k is not None else (0, 0, 0)
    vs = v.stride()[:3] if v is not None else (0, 0, 0)
    flags = dict(DO_K=k is not None, DO_V=v is not None)
    _kv_stats_kernel[(nblk, h, b)](
        x, *ks, v if v is not None else x, *vs, v_mean if v_mean is not None else parts, parts[0], parts[1],
        n, h, D=d, D_PAD=d_pad, CHUNK=STATS_CHUNK, ROWS=STATS_ROWS, HAS_VMEAN=v_mean is not None,
        num_warps=STATS_WARPS, **flags,
    )
    _stats_finalize_kernel[(h, b)](parts[0], parts[1], stats[0], stats[1], nblk, n, h, D=d, D_PAD=d_pad,
                                   PARTS=min(16, triton.next_power_of_2(nblk)), num_warps=4, **flags)
    return (stats[0].unsqueeze(2) if k is not None else None), (stats[1] if v is not None else None)


@triton.jit
def _v_fp8_kernel(
    V, stride_vb, stride_vh, stride_vn, MEAN, AMAX, SCALE, OUT, N, N_PAD, H,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, HAS_MEAN: tl.constexpr, EXACT_ROUND: tl.constexpr,
):
    """OUT [B, H, D, N_PAD] fp8 = (v - mean) * (1 / scale), transposed so tokens (the PV reduction) are contiguous;
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
    y = to_e4m3(v * tl.math.div_rn(1.0, scale)[None, :], EXACT_ROUND)
    o_ptrs = OUT + ((b * H + h) * D + offs_d[None, :]) * N_PAD + offs_n[:, None]
    tl.store(o_ptrs, y, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D))


def quantize_v_fp8(v: torch.Tensor, mean: torch.Tensor | None = None, amax: torch.Tensor | None = None):
    """v [B, H, N, D] -> (fp8 e4m3 V^T [B, H, D, N_PAD] with N_PAD a multiple of 16, fp32 scales [B, H, D]).

    mean: fp32 [B, H, D] (V smoothing) or None. amax: absmax over tokens of v - mean [B, H, D] from
    `token_stats`, computed here when not given. Padding tokens are never read unmasked."""
    b, h, n, d = v.shape
    if amax is None:
        amax = token_stats(None, v, mean)[1]
    scale = torch.empty((b, h, d), dtype=torch.float32, device=v.device)
    n_pad = triton.cdiv(n, 16) * 16
    out = torch.empty((b, h, d, n_pad), dtype=torch.float8_e4m3fn, device=v.device)
    _v_fp8_kernel[(triton.cdiv(n, V_BLOCK), h, b)](
        v, v.stride(0), v.stride(1), v.stride(2), mean if mean is not None else scale, amax, scale, out, n, n_pad, h,
        D=d, D_PAD=max(16, triton.next_power_of_2(d)), BLOCK=V_BLOCK, HAS_MEAN=mean is not None,
        EXACT_ROUND=INTERPRET, num_warps=V_WARPS,
    )
    return out, scale

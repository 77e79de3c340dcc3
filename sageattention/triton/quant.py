"""Triton quantization kernels: INT8 Q/K (grouped scales, optional smoothing) and FP8 V (per-channel).

Arithmetic mirrors `sageattention.reference` exactly (fp32; each group's reciprocal scale by IEEE
division, then one multiply per element; round half to even) so the quantized tensors match the
reference bit for bit.

One kernel runs up to two jobs per launch (`launch`): sageattn quantizes Q while reading the K/V statistics,
then K while writing FP8 V^T, so its quantization is two bandwidth-bound launches (and a tiny reduction), not five.
Launch widths are module constants so `python -m sageattention.bench.quant --sweep` can tune them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import quant_groups
from ..quant_groups import Grouping
from .fp8 import INTERPRET, to_e4m3
from .sizes import cdiv, next_pow2

NUM_WARPS = 4
STATS_CHUNK = 512  # tokens per program of the statistics job, read STATS_ROWS at a time
STATS_ROWS = 32
V_BLOCK = 128  # tokens per program of the FP8 V job
MIN_SCALE = tl.constexpr(quant_groups.MIN_SCALE)  # the scales' floor (quant_groups.py says why)


@triton.jit
def _usable_scale(scale, all_zero):
    """1 for an all-zero group, else at least MIN_SCALE; NaN stays NaN."""
    return tl.where(all_zero, 1.0, tl.where(scale < MIN_SCALE, MIN_SCALE, scale))


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
    scale = tl.math.div_rn(gmax, 127.0) + gbad  # IEEE division, as the reference (a plain / is approximate on GPUs)
    scale = _usable_scale(scale, scale == 0.0)  # [G1, G2]
    tok_scale = tl.reshape(tl.broadcast_to(tl.reshape(scale, (G1, 1, G2, 1)), (G1, R1, G2, R2)), (BLOCK,))
    # One IEEE division per group, then a multiply per element: same values as the reference, less ALU work.
    inv = tl.reshape(tl.broadcast_to(tl.reshape(tl.math.div_rn(1.0, scale), (G1, 1, G2, 1)), (G1, R1, G2, R2)), (BLOCK,))
    y = x * inv[:, None]
    # Round half to even: |y| + 1.5 * 2**23 has an ulp of 1, so the add rounds, and the sign is put back after (half
    # to even is symmetric). The abs between the multiply and the add keeps the compiler from fusing them into one
    # FMA (which would round once, unlike the reference).
    t = ((tl.abs(y) + 12582912.0) - 12582912.0).to(tl.int8)
    return tl.where(y < 0, -t, t), tok_scale


@triton.jit
def _int8_block(
    X, stride_xb, stride_xh, stride_xn, MEAN, stride_mb, stride_mh, stride_ms, SEG, OUT, SCALE, N, H, pid_n, h, b,
    D: tl.constexpr, D_PAD: tl.constexpr, G1: tl.constexpr, R1: tl.constexpr, G2: tl.constexpr, R2: tl.constexpr,
    HAS_MEAN: tl.constexpr, HAS_SEG: tl.constexpr,
):
    """One period of tokens of X [B, H, N, D] to INT8 OUT [B, H, N, D] and per-token SCALE [B, H, N]."""
    BLOCK: tl.constexpr = G1 * R1 * G2 * R2
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


@triton.jit
def _stats_chunk(
    K, stride_kb, stride_kh, stride_kn, V, stride_vb, stride_vh, stride_vn, VMEAN, KSUM, VMAX, N, H, pid_n, n_chunk,
    h, b, D: tl.constexpr, D_PAD: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr,
    DO_K: tl.constexpr, DO_V: tl.constexpr, HAS_VMEAN: tl.constexpr,
):
    """One read of a CHUNK of tokens of K and V, ROWS at a time: partial per-channel sums of K / N (for its mean:
    the sum of K itself can overflow fp32 where the mean does not) and partial per-channel absmax of v - mean (for
    the FP8 V scales), into KSUM / VMAX [B, H, n_chunk, D]."""
    offs_d = tl.arange(0, D_PAD)
    k_acc = tl.zeros([ROWS, D_PAD], dtype=tl.float32)
    v_acc = tl.zeros([ROWS, D_PAD], dtype=tl.float32)
    if HAS_VMEAN:
        mean = tl.load(VMEAN + (b * H + h) * D + offs_d, mask=offs_d < D, other=0.0)
    for start in range(pid_n * CHUNK, tl.minimum(pid_n * CHUNK + CHUNK, N), ROWS):
        offs_n = start + tl.arange(0, ROWS)
        if DO_K:
            k_acc += _load_tile(K + b * stride_kb + h * stride_kh, stride_kn, offs_n, offs_d, N, D) * (1.0 / N)
        if DO_V:
            v = _load_tile(V + b * stride_vb + h * stride_vh, stride_vn, offs_n, offs_d, N, D)
            if HAS_VMEAN:
                v = tl.where(offs_n[:, None] < N, v - mean[None, :], 0.0)
            v_acc = tl.maximum(v_acc, tl.abs(v))
    part = ((b * H + h) * n_chunk + pid_n) * D + offs_d
    if DO_K:
        tl.store(KSUM + part, tl.sum(k_acc, axis=0), mask=offs_d < D)
    if DO_V:
        tl.store(VMAX + part, tl.max(v_acc, axis=0), mask=offs_d < D)


@triton.jit
def _v_fp8_block(
    V, stride_vb, stride_vh, stride_vn, VMEAN, AMAX, VSCALE, VOUT, N, N_PAD, H, pid_n, h, b,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, HAS_VMEAN: tl.constexpr, EXACT_ROUND: tl.constexpr,
):
    """VOUT [B, H, D, N_PAD] fp8 = (v - mean) * (1 / scale), transposed so tokens (the PV reduction) are contiguous;
    scale = absmax / 448 per channel (1 for an all-zero channel; at least MIN_SCALE), also written to VSCALE by the
    first block."""
    offs_n = pid_n * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D_PAD)
    v = _load_tile(V + b * stride_vb + h * stride_vh, stride_vn, offs_n, offs_d, N, D)
    if HAS_VMEAN:
        v = v - tl.load(VMEAN + (b * H + h) * D + offs_d, mask=offs_d < D, other=0.0)[None, :]
    amax = tl.load(AMAX + (b * H + h) * D + offs_d, mask=offs_d < D, other=0.0)
    scale = tl.math.div_rn(amax, 448.0)
    scale = _usable_scale(scale, amax == 0.0)
    if pid_n == 0:
        tl.store(VSCALE + (b * H + h) * D + offs_d, scale, mask=offs_d < D)
    y = to_e4m3(v * tl.math.div_rn(1.0, scale)[None, :], EXACT_ROUND)
    o_ptrs = VOUT + ((b * H + h) * D + offs_d[None, :]) * N_PAD + offs_n[:, None]
    tl.store(o_ptrs, y, mask=(offs_n[:, None] < N) & (offs_d[None, :] < D))


@triton.jit
def _quant_kernel(
    X, stride_xb, stride_xh, stride_xn, XMEAN, stride_mb, stride_mh, stride_ms, SEG, XOUT, XSCALE, n_x, h_x,
    K, stride_kb, stride_kh, stride_kn, V, stride_vb, stride_vh, stride_vn, VMEAN, KSUM, VMAX, AMAX, VSCALE, VOUT,
    n_kv, h_kv, n_pad, kv_programs,
    D: tl.constexpr, D_PAD: tl.constexpr, G1: tl.constexpr, R1: tl.constexpr, G2: tl.constexpr, R2: tl.constexpr,
    HAS_XMEAN: tl.constexpr, HAS_SEG: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr, V_BLOCK: tl.constexpr,
    STATS_K: tl.constexpr, STATS_V: tl.constexpr, V_FP8: tl.constexpr, HAS_VMEAN: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    """Two quantization jobs in one launch (one wave of programs over all their bytes): programs [0, kv_programs)
    run the K/V job (statistics, one chunk of tokens each; or FP8 V^T), the rest quantize X to INT8."""
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if pid < kv_programs:
        if h < h_kv:
            if STATS_K or STATS_V:
                _stats_chunk(K, stride_kb, stride_kh, stride_kn, V, stride_vb, stride_vh, stride_vn, VMEAN, KSUM, VMAX,
                             n_kv, h_kv, pid, kv_programs, h, b, D, D_PAD, CHUNK, ROWS, STATS_K, STATS_V, HAS_VMEAN)
            if V_FP8:
                _v_fp8_block(V, stride_vb, stride_vh, stride_vn, VMEAN, AMAX, VSCALE, VOUT, n_kv, n_pad, h_kv, pid,
                             h, b, D, D_PAD, V_BLOCK, HAS_VMEAN, EXACT_ROUND)
    elif h < h_x:
        _int8_block(X, stride_xb, stride_xh, stride_xn, XMEAN, stride_mb, stride_mh, stride_ms, SEG, XOUT, XSCALE,
                    n_x, h_x, pid - kv_programs, h, b, D, D_PAD, G1, R1, G2, R2, HAS_XMEAN, HAS_SEG)


@triton.jit
def _stats_finalize_kernel(KSUM, VMAX, KMEAN, VAMAX, NPART, H, D: tl.constexpr, D_PAD: tl.constexpr,
                           PARTS: tl.constexpr, DO_K: tl.constexpr, DO_V: tl.constexpr):
    """Reduce the per-chunk partials of one head: KMEAN = sum (of K / N), VAMAX = max."""
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
        tl.store(KMEAN + (b * H + h) * D + offs_d, tl.sum(k_acc, axis=0), mask=offs_d < D)
    if DO_V:
        tl.store(VAMAX + (b * H + h) * D + offs_d, tl.max(v_acc, axis=0), mask=offs_d < D)


def _d_pad(d: int) -> int:
    return max(16, next_pow2(d))


def _strides(t: torch.Tensor | None) -> tuple:
    return t.stride()[:3] if t is not None else (0, 0, 0)


@dataclass
class Int8Job:
    """x [B, H, N, D] (any strides, last dim contiguous) -> int8 [B, H, N, D] contiguous and fp32 scales [B, H, N]
    (one per token; the tokens of a quantization group share it). mean: fp32 [B, H, S, D] subtracted first (S = 1,
    or the segment of each token given by seg: int32 [N], for packed variable-length batches)."""

    x: torch.Tensor
    grouping: Grouping
    mean: torch.Tensor | None = None
    seg: torch.Tensor | None = None

    def __post_init__(self):
        self.out = torch.empty(self.x.shape, dtype=torch.int8, device=self.x.device)
        self.scale = torch.empty(self.x.shape[:3], dtype=torch.float32, device=self.x.device)
        self.programs = cdiv(self.x.shape[2], self.grouping.block)

    def args(self, dummy) -> tuple:
        """The kernel's X ... h_x arguments."""
        return (self.x, *_strides(self.x), self.mean if self.mean is not None else dummy, *_strides(self.mean),
                self.seg if self.seg is not None else dummy, self.out, self.scale, self.x.shape[2], self.x.shape[1])

    def flags(self) -> dict:
        g = self.grouping
        return dict(G1=g.g1, R1=g.r1, G2=g.g2, R2=g.r2, HAS_XMEAN=self.mean is not None, HAS_SEG=self.seg is not None)


@dataclass
class KVJob:
    """A job over k and v [B, HK, N, D] (either may be None). Without `amax`: statistics, the K token sums and the
    absmax of v - v_mean per chunk of tokens (`finalize` reduces them). With `amax` (the finalized absmax): v - v_mean
    as FP8 e4m3 V^T [B, HK, D, N_PAD] (N_PAD a multiple of 16) with per-channel scales [B, HK, D]."""

    k: torch.Tensor | None
    v: torch.Tensor | None
    v_mean: torch.Tensor | None = None
    amax: torch.Tensor | None = None

    def __post_init__(self):
        x = self.k if self.k is not None else self.v
        self.b, self.h, self.n, self.d = x.shape
        dev = x.device
        if self.amax is None:
            self.programs = cdiv(self.n, STATS_CHUNK)
            self.parts = torch.empty((2, self.b, self.h, self.programs, self.d), dtype=torch.float32, device=dev)
        else:
            self.programs = cdiv(self.n, V_BLOCK)
            self.out = torch.empty((self.b, self.h, self.d, cdiv(self.n, 16) * 16), dtype=torch.float8_e4m3fn,
                                   device=dev)
            self.scale = torch.empty((self.b, self.h, self.d), dtype=torch.float32, device=dev)

    def args(self, dummy) -> tuple:
        """The kernel's K ... n_pad arguments."""
        k, v, mean = (t if t is not None else dummy for t in (self.k, self.v, self.v_mean))
        outs = (self.parts[0], self.parts[1], dummy, dummy, dummy) if self.amax is None else \
            (dummy, dummy, self.amax, self.scale, self.out)
        n_pad = self.out.shape[-1] if self.amax is not None else 0
        return (k, *_strides(self.k), v, *_strides(self.v), mean, *outs, self.n, self.h, n_pad)

    def flags(self) -> dict:
        stats = self.amax is None
        return dict(STATS_K=stats and self.k is not None, STATS_V=stats and self.v is not None, V_FP8=not stats,
                    HAS_VMEAN=self.v_mean is not None)

    def finalize(self):
        """(k token mean fp32 [B, HK, 1, D] or None, v absmax fp32 [B, HK, D] or None) from the partials."""
        stats = torch.empty((2, self.b, self.h, self.d), dtype=torch.float32, device=self.parts.device)
        _stats_finalize_kernel[(self.h, self.b)](
            self.parts[0], self.parts[1], stats[0], stats[1], self.programs, self.h, D=self.d,
            D_PAD=_d_pad(self.d), PARTS=min(16, next_pow2(self.programs)), DO_K=self.k is not None,
            DO_V=self.v is not None, num_warps=4,
        )
        return (stats[0].unsqueeze(2) if self.k is not None else None), (stats[1] if self.v is not None else None)


_NO_INT8 = dict(G1=1, R1=16, G2=1, R2=1, HAS_XMEAN=False, HAS_SEG=False)
_NO_KV = dict(STATS_K=False, STATS_V=False, V_FP8=False, HAS_VMEAN=False)


def launch(x: Int8Job | None, kv: KVJob | None) -> None:
    """Run an INT8 job and a K/V job (either may be None) in one launch; results land in the jobs' tensors.
    The K/V programs come first: statistics programs read long chunks, so they should not be the last to start."""
    first = x.x if x is not None else (kv.k if kv.k is not None else kv.v)
    dummy = x.scale if x is not None else first
    x_args = x.args(dummy) if x is not None else (dummy, 0, 0, 0, dummy, 0, 0, 0, dummy, dummy, dummy, 0, 0)
    kv_args = kv.args(dummy) if kv is not None else (dummy, 0, 0, 0, dummy, 0, 0, 0, *(dummy,) * 6, 0, 0, 0)
    kv_programs = kv.programs if kv is not None else 0
    heads = max(x.x.shape[1] if x is not None else 0, kv.h if kv is not None else 0)
    _quant_kernel[(kv_programs + (x.programs if x is not None else 0), heads, first.shape[0])](
        *x_args, *kv_args, kv_programs, D=first.shape[3], D_PAD=_d_pad(first.shape[3]), CHUNK=STATS_CHUNK,
        ROWS=STATS_ROWS, V_BLOCK=V_BLOCK, EXACT_ROUND=INTERPRET, num_warps=NUM_WARPS,
        **(x.flags() if x is not None else _NO_INT8), **(kv.flags() if kv is not None else _NO_KV),
    )


def quantize_int8(x: torch.Tensor, g: Grouping, mean: torch.Tensor | None = None, seg: torch.Tensor | None = None):
    """x [B, H, N, D] -> (int8 [B, H, N, D], fp32 scales [B, H, N]); see `Int8Job`."""
    job = Int8Job(x, g, mean, seg)
    launch(job, None)
    return job.out, job.scale


def token_stats(k: torch.Tensor | None, v: torch.Tensor | None, v_mean: torch.Tensor | None = None):
    """One pass over k and v [B, H, N, D] (last dim contiguous; either may be None):
    (k token mean fp32 [B, H, 1, D] or None, absmax over tokens of v - v_mean fp32 [B, H, D] or None)."""
    job = KVJob(k, v, v_mean)
    launch(None, job)
    return job.finalize()


def quantize_v_fp8(v: torch.Tensor, mean: torch.Tensor | None = None, amax: torch.Tensor | None = None):
    """v [B, H, N, D] -> (fp8 e4m3 V^T [B, H, D, N_PAD] with N_PAD a multiple of 16, fp32 scales [B, H, D]).

    mean: fp32 [B, H, D] (V smoothing) or None. amax: absmax over tokens of v - mean [B, H, D] from
    `token_stats`, computed here when not given. Padding tokens are never read unmasked."""
    if amax is None:
        amax = token_stats(None, v, mean)[1]
    job = KVJob(None, v, mean, amax)
    launch(None, job)
    return job.out, job.scale

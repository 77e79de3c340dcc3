"""Triton implementation: both matmuls are block-scaled NVFP4 products.

NATIVE=True (where the installed Triton can, see dispatch.TRITON_NATIVE: sm_100 with Triton 3.3 or
>= 3.5, sm_120 with >= 3.6; and the CPU interpreter): `tl.dot_scaled`, which Triton lowers to the
block-scaled FP4 tensor-core MMA (tcgen05.mma / mma.sync kind::mxf4nvf4).
NATIVE=False (everywhere else: sm_121, older Triton, and other GPUs for testing): Triton cannot lower
NVFP4 `tl.dot_scaled` there, so the operands are decoded in the kernel instead. Every
e2m1 x e4m3 value is exact in float16, so an fp16 `tl.dot` with float32 accumulation gives the
same products; only the speed differs.
"""
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from . import nvfp4
from . import dispatch
from .prepare import KV_TILE, Q_BLOCK, QuantizedInputs, kernel_scales

E2M1 = tl.constexpr("e2m1")  # a constexpr object, as the interpreter requires for formats


@triton.jit
def _quantize_rows_nvfp4(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """x [ROWS, COLS] float32 >= 0 -> (packed e2m1 codes [ROWS, COLS/2] uint8, e4m3 scales [ROWS, COLS/16])."""
    groups = tl.reshape(x, [ROWS, COLS // 16, 16])
    scale = (tl.max(groups, axis=2) / 6.0).to(tl.float8e4nv, fp_downcast_rounding="rtne")
    s = scale.to(tl.float32)[:, :, None]
    a = tl.where(s > 0, tl.math.div_rn(groups, tl.where(s > 0, s, 1.0)), 0.0)
    # Round to nearest even on the e2m1 grid, see nvfp4.encode_e2m1 (x >= 0 here: no sign bit).
    code = ((a > 0.25).to(tl.uint8) + (a >= 0.75).to(tl.uint8) + (a > 1.25).to(tl.uint8)
            + (a >= 1.75).to(tl.uint8) + (a > 2.5).to(tl.uint8) + (a >= 3.5).to(tl.uint8) + (a > 5.0).to(tl.uint8))
    lo, hi = tl.split(tl.reshape(code, [ROWS, COLS // 2, 2]))
    return lo | (hi << 4), scale


@triton.jit
def _dequantize_rows(packed, scales, ROWS: tl.constexpr, K: tl.constexpr):
    """packed e2m1 [ROWS, K/2] uint8 and e4m3 scales [ROWS, K/16] -> float16 [ROWS, K] (exact: at most 6 significant bits, |x| <= 2688)."""
    code = tl.reshape(tl.join(packed & 15, packed >> 4), [ROWS, K])
    e = ((code >> 1) & 3).to(tl.int32)
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, (1 << e).to(tl.float32) * 0.5 * (1.0 + 0.5 * m))
    value = tl.where((code & 8) != 0, -mag, mag)
    s = tl.reshape(tl.broadcast_to(scales.to(tl.float32)[:, :, None], [ROWS, K // 16, 16]), [ROWS, K])
    return (value * s).to(tl.float16)


@triton.jit
def _nvfp4_dot(a, a_scales, b, b_scales, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               NATIVE: tl.constexpr):
    """a [M, K/2], b [K/2, N] packed e2m1 (along K); scales [M, K/16], [N, K/16] -> float32 [M, N]."""
    if NATIVE:
        return tl.dot_scaled(a, a_scales, E2M1, b, b_scales, E2M1)
    else:
        b_rows = _dequantize_rows(tl.trans(b), b_scales, N, K)
        return tl.dot(_dequantize_rows(a, a_scales, M, K), tl.trans(b_rows), out_dtype=tl.float32)


@triton.jit
def _sage3_fwd(q_codes, q_scales, k_codes, k_scales, v_codes, v_scales, q_bias, out, lse,
               heads, kv_group, n_q_pad, n_k, n_k_pad, scales, causal_offset,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_BIAS: tl.constexpr, FP4_MAX: tl.constexpr,
               NATIVE: tl.constexpr):
    # scales: prepare.kernel_scales (score scale, LSE factor, V scale); a causal row i sees keys j <= i + causal_offset.
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bkv = (bh // heads) * (heads // kv_group) + (bh % heads) // kv_group
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d_half = tl.arange(0, HEAD_DIM // 2)
    d_grp = tl.arange(0, HEAD_DIM // 16)
    d_all = tl.arange(0, HEAD_DIM)
    n_grp = tl.arange(0, BLOCK_N // 16)
    n_half = tl.arange(0, BLOCK_N // 2)

    q_row = bh * n_q_pad + rows
    q = tl.load(q_codes + q_row[:, None] * (HEAD_DIM // 2) + d_half[None, :])
    qs = tl.load(q_scales + q_row[:, None] * (HEAD_DIM // 16) + d_grp[None, :])

    scale_log2 = tl.load(scales)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # A causal program skips the tiles past its diagonal (fully masked). The bound stays the same
    # for every program because the interpreter cannot take a loop bound from program_id.
    last = (pid_m + 1) * BLOCK_M + causal_offset if CAUSAL else n_k_pad
    for start in range(0, n_k_pad, BLOCK_N):
        if start < last:
            cols = start + tl.arange(0, BLOCK_N)
            k_row = bkv * n_k_pad + cols
            k_t = tl.load(k_codes + k_row[None, :] * (HEAD_DIM // 2) + d_half[:, None])        # [D/2, N]
            ks = tl.load(k_scales + k_row[:, None] * (HEAD_DIM // 16) + d_grp[None, :])         # [N, D/16]
            s = _nvfp4_dot(q, qs, k_t, ks, BLOCK_M, BLOCK_N, HEAD_DIM, NATIVE)
            if HAS_BIAS:
                s += tl.load(q_bias + (bh * (n_q_pad // BLOCK_M) + pid_m) * n_k_pad + cols)[None, :]
            s = s * scale_log2
            keep = cols[None, :] < n_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None] + causal_offset)
            s = tl.where(keep, s, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet: avoid -inf - -inf
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)

            # Two-level P quantization (reference.quantize_p): row max -> FP4_MAX = 6 * 448, then NVFP4 per 16 keys.
            row_max = tl.max(p, axis=1)
            s1 = tl.where(row_max > 0, row_max / FP4_MAX, 1.0)
            p_codes, p_scales = _quantize_rows_nvfp4(tl.math.div_rn(p, s1[:, None]), BLOCK_M, BLOCK_N)

            v_ch = bkv * HEAD_DIM + d_all
            v = tl.load(v_codes + v_ch[None, :] * (n_k_pad // 2) + start // 2 + n_half[:, None])          # [N/2, D]
            vs = tl.load(v_scales + v_ch[:, None] * (n_k_pad // 16) + start // 16 + n_grp[None, :])     # [D, N/16]
            pv = _nvfp4_dot(p_codes, p_scales, v, vs, BLOCK_M, HEAD_DIM, BLOCK_N, NATIVE)
            acc = acc * alpha[:, None] + pv * s1[:, None]
            m_i = m_new

    # reference.attention_reference's epilogue: 0 for a row without visible keys, else the output clamped
    # to V's range (NaN kept) times V's tensor scale.
    o = acc / l_i[:, None]
    o = tl.where(o > FP4_MAX, FP4_MAX, tl.where(o < -FP4_MAX, -FP4_MAX, o))
    o = tl.where(l_i[:, None] == 0, 0.0, o) * tl.load(scales + 2)
    o_row = bh * n_q_pad + rows
    tl.store(out + o_row[:, None] * HEAD_DIM + d_all[None, :], o)
    tl.store(lse + o_row, (m_i * tl.load(scales + 1) + tl.math.log2(l_i)) * 0.6931471805599453)


def has_native_nvfp4_mma(device: torch.device) -> bool:
    """Whether the installed Triton lowers NVFP4 `tl.dot_scaled` to the FP4 tensor cores of this GPU."""
    return dispatch.triton_native(device)


def attention_triton(qi: QuantizedInputs, is_causal: bool, sm_scale: float, causal_offset: int = 0,
                     native: Optional[bool] = None):
    """Same contract as reference.attention_reference. native=None picks `tl.dot_scaled` where it compiles."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        from . import interpreter
        interpreter.install()
    if native is None:
        native = qi.q_codes.device.type != "cuda" or has_native_nvfp4_mma(qi.q_codes.device)
    b, heads, n_q_pad, half_d = qi.q_codes.shape
    kv_heads, n_k_pad = qi.k_codes.shape[1], qi.k_codes.shape[2]
    head_dim = 2 * half_d
    out = torch.empty(b, heads, n_q_pad, head_dim, device=qi.q_codes.device, dtype=torch.float32)
    lse = torch.empty(b, heads, n_q_pad, device=out.device, dtype=torch.float32)
    has_bias = qi.q_bias is not None
    grid = (n_q_pad // Q_BLOCK, b * heads)
    _sage3_fwd[grid](
        qi.q_codes, qi.q_scales, qi.k_codes, qi.k_scales, qi.v_codes, qi.v_scales,
        qi.q_bias if has_bias else out, out, lse,
        heads, heads // kv_heads, n_q_pad, qi.n_k, n_k_pad, kernel_scales(qi, sm_scale), causal_offset,
        HEAD_DIM=head_dim, BLOCK_M=Q_BLOCK, BLOCK_N=KV_TILE, CAUSAL=is_causal, HAS_BIAS=has_bias,
        FP4_MAX=nvfp4.MAX_VALUE, NATIVE=native, num_warps=8, num_stages=2)
    return out[:, :, :qi.n_q, :qi.head_dim], lse[:, :, :qi.n_q]

"""Triton attention kernel over pre-quantized operands: INT8 Q·K^T, 16-bit or FP8 P·V, online softmax.

Scores live in the exp2 domain: the Q scale is pre-multiplied by sm_scale * log2(e), so
softmax is exp2(s - rowmax) and the LSE is converted back to natural log at the end.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import dispatch
from .fp8 import INTERPRET, to_e4m3
from .quant import MIN_SCALE
from .sizes import cdiv, next_pow2

LOG2E = 1.4426950408889634
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2


@triton.jit
def _load_k(K, k_row0, kv_bh, start_n, offs_n, in_n, offs_d,
            D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """The K tile [BLOCK_N, D_PAD] of keys offs_n; k_row0: the row of this sequence's first key in K [rows, D]."""
    if TMA:  # descriptor over [B * HK, Nk, D]: rows past this head's Nk and columns past D come back as 0
        k = K.load([kv_bh, start_n, 0]).reshape(BLOCK_N, D_PAD)
    else:
        k = tl.load(K + (k_row0 + offs_n[:, None]) * D + offs_d[None, :],
                    mask=in_n[:, None] & (offs_d[None, :] < D), other=0)
    return k


@triton.jit
def _load_v_half(V, v_off, stride_vn, stride_vd, bb, hk, kv_bh, start_n, offs_n, in_n, HALF: tl.constexpr,
                 D: tl.constexpr, DH: tl.constexpr, BLOCK_N: tl.constexpr,
                 PV_FP8: tl.constexpr, TMA: tl.constexpr):
    """Columns [HALF * DH, (HALF + 1) * DH) of the V tile [BLOCK_N, D]; v_off: where this sequence starts in V."""
    if TMA:
        if PV_FP8:  # descriptor over V^T [B * HK, D, Nk]
            v = tl.trans(V.load([kv_bh, HALF * DH, start_n]).reshape(DH, BLOCK_N))
        else:  # over V [B, HK, Nk, D]
            v = V.load([bb, hk, start_n, HALF * DH]).reshape(BLOCK_N, DH)
    else:
        offs_d = HALF * DH + tl.arange(0, DH)
        # For FP8 the strides read V^T, whose contiguous axis is the tokens.
        v = tl.load(V + v_off + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=in_n[:, None] & (offs_d[None, :] < D), other=0.0)
    return v


@triton.jit
def _pv(acc, alpha, p_lo, v, PV_TWO_LEVEL: tl.constexpr, PV_INNER_FP16: tl.constexpr):
    if PV_TWO_LEVEL:
        # Two-level accumulation: this block's P·V in its own accumulator, then added in fp32.
        if PV_INNER_FP16:
            pv = tl.dot(p_lo, v, out_dtype=tl.float16).to(tl.float32)
        else:
            pv = tl.dot(p_lo, v)
        acc = acc * alpha[:, None] + pv
    else:
        acc = tl.dot(p_lo, v, acc * alpha[:, None])
    return acc


@triton.jit
def _attn_block(
    acc0, acc1, l_i, m_i, e_i, bad, q, q_scale, K, k_row0, KS_base, V, v_off, stride_vn, stride_vd, bb, hk,
    kv_bh, M_base, stride_mm, stride_mn, offs_m, offs_d, start_n, k_off, nq, nk, causal_offset, redo_above,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PV_FP8: tl.constexpr, PV_TWO_LEVEL: tl.constexpr,
    PV_INNER_FP16: tl.constexpr, EXACT_ROUND: tl.constexpr, LOG2_P_SCALE: tl.constexpr, K_SCALAR: tl.constexpr,
    ONE_FMA: tl.constexpr, TMA: tl.constexpr,
):
    """One key tile. m_i: running row max of the scores; e_i: the exponent offset P was computed with
    (p = exp2(s - e), e about m - LOG2_P_SCALE); bad: rows whose offset could not be set finely (ONE_FMA)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    in_n = offs_n < nk
    k = _load_k(K, k_row0, kv_bh, start_n, offs_n, in_n, offs_d, D, D_PAD, BLOCK_N, TMA)
    qk = tl.dot(q, tl.trans(k), out_dtype=tl.int32)
    # Exact int32 -> fp32 for |x| < 2**22 (always true: |x| <= 127 * 127 * 256): the integer add puts x in the
    # mantissa of 1.5 * 2**23, which the dequantization subtracts again; no conversion instruction, which
    # would share the slow pipe with exp2.
    f = (qk + 0x4B400000).to(tl.float32, bitcast=True)
    if K_SCALAR:  # one K scale for the whole tile: dequantize with one FMA and per-row factors
        c = q_scale * tl.load(KS_base + k_off + start_n)
        if ONE_FMA:
            # The max is taken on the raw f below, which needs c > 0: `attention` folds sm_scale's sign into q, and a
            # c that underflowed (tiny |q|, |k| or sm_scale) rises to fp32's least normal, where exp2 still sees every
            # score as 0 (|x| * c < 2**-104) but a masked -inf stays -inf (-inf * 0 is NaN).
            c = tl.maximum(c, MIN_SCALE, propagate_nan=tl.PropagateNan.ALL)
        # c cut to 22 significant bits (a relative change under 2**-21) makes h = 1.5 * 2**23 * c exact, so the FMA
        # rounds only its small result; a rounded product would shift each tile's scores by up to c / 2.
        c = (c.to(tl.int32, bitcast=True) & -4).to(tl.float32, bitcast=True)
        h = 12582912.0 * c
        if ONE_FMA:  # keep the raw f: the max is taken on it (c > 0) and exp2 gets f * c - (h + e) in one FMA
            s = f
        else:
            # f - 1.5 * 2**23 is x exactly, so this rounds once, as the FMA f * c - h would, but needs no h, which
            # overflows fp32 for c > 2**103 (bf16 |q|, |k| ~1e17, or a huge sm_scale)
            s = (f - 12582912.0) * c[:, None]
    else:
        k_scale = tl.load(KS_base + k_off + offs_n, mask=in_n, other=0.0)
        s = (f - 12582912.0) * (q_scale[:, None] * k_scale[None, :])
    if MASK_KIND != 0:
        mptr = M_base + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn
        mval = tl.load(mptr, mask=(offs_m[:, None] < nq) & in_n[None, :], other=0)
        if MASK_KIND == 1:
            s = tl.where(mval != 0, s, float("-inf"))
        else:
            s = s + mval.to(tl.float32) * 1.4426950408889634
    if MASKED:
        keep = in_n[None, :]
        if IS_CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
        s = tl.where(keep, s, float("-inf"))
    tile_max = tl.max(s, axis=1)
    if ONE_FMA:
        tile_max = tile_max * c - h
    m_new = tl.maximum(m_i, tile_max)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked so far: keep p = 0, not NaN
    # p = P_SCALE * exp2(s - m): the stretch of P to e4m3's range rides in the exponent offset e.
    e_new = m_use - LOG2_P_SCALE
    if LOG2_P_SCALE != 0.0:
        # P's peak exp2(m - e) must stay <= 448 (e4m3 saturates there; its rounding takes P up to 464 to 448). Where
        # m's ulp is coarse (|m| >= 2**20) the subtraction can round e down past that: step e up one ulp, toward m.
        # (m - e is exact there; finer ulps round by far less than the margin 8.85 - log2(448).)
        up = tl.where(e_new > 0.0, 1, -1)
        e_new = tl.where(m_use - e_new > 8.85, (e_new.to(tl.int32, bitcast=True) + up).to(tl.float32, bitcast=True),
                         e_new)
    if ONE_FMA:
        # b = h + e rounds to b's grid (about c apart), so the offset really used is b - h (exact: b and h are
        # within a factor 2 once h is large). Where rounding went down, P would pass 448: step b up one ulp.
        b = h + e_new
        b = tl.where((b - h < e_new) & (b > 0.0), (b.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), b)
        e_new = b - h
        # Where b's grid is too coarse, P's peak could drop binades below 448: REDO_ABOVE says where. b is inf or NaN
        # where h overflowed (c > 2**103): the two-step exponent does without h.
        bad = bad | ~(b < redo_above)
        p = tl.math.exp2(s * c[:, None] - b[:, None])
    else:
        p = tl.math.exp2(s - e_new[:, None])
    alpha = tl.math.exp2(e_i - e_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # P·V in two column halves: each half's block product needs half the registers of the whole, which
    # keeps the two-level accumulation from spilling.
    DH: tl.constexpr = acc0.shape[1]
    v = _load_v_half(V, v_off, stride_vn, stride_vd, bb, hk, kv_bh, start_n, offs_n, in_n, 0, D, DH, BLOCK_N,
                     PV_FP8, TMA)
    if PV_FP8:
        p_lo = to_e4m3(p, EXACT_ROUND)
    else:
        p_lo = p.to(v.dtype)
    acc0 = _pv(acc0, alpha, p_lo, v, PV_TWO_LEVEL, PV_INNER_FP16)
    v = _load_v_half(V, v_off, stride_vn, stride_vd, bb, hk, kv_bh, start_n, offs_n, in_n, 1, D, DH, BLOCK_N,
                     PV_FP8, TMA)
    acc1 = _pv(acc1, alpha, p_lo, v, PV_TWO_LEVEL, PV_INNER_FP16)
    return acc0, acc1, l_i, m_new, e_new, bad


@triton.jit
def _key_loops(
    q, q_scale, K, k_row0, KS_base, V, v_off, stride_vn, stride_vd, bb, hk, kv_bh, M_base, stride_mm, stride_mn,
    offs_m, offs_d, k_off, nq, nk, causal_offset, full, hi, redo_above,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr, PV_FP8: tl.constexpr, PV_TWO_LEVEL: tl.constexpr, PV_INNER_FP16: tl.constexpr,
    EXACT_ROUND: tl.constexpr, LOG2_P_SCALE: tl.constexpr, K_SCALAR: tl.constexpr, ONE_FMA: tl.constexpr,
    TMA: tl.constexpr,
):
    """All key tiles of one block of query rows: keys [0, full) need no causal or bounds mask, [full, hi) do."""
    DH: tl.constexpr = D_PAD // 2
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    e_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    bad = tl.zeros([BLOCK_M], dtype=tl.int1)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_M, DH], dtype=tl.float32)  # output columns [0, DH)
    acc1 = tl.zeros([BLOCK_M, DH], dtype=tl.float32)  # and [DH, D_PAD)
    for start_n in range(0, full, BLOCK_N):
        acc0, acc1, l_i, m_i, e_i, bad = _attn_block(
            acc0, acc1, l_i, m_i, e_i, bad, q, q_scale, K, k_row0, KS_base, V, v_off, stride_vn, stride_vd, bb,
            hk, kv_bh, M_base, stride_mm, stride_mn, offs_m, offs_d, start_n, k_off, nq, nk, causal_offset, redo_above,
            D, D_PAD, BLOCK_N, False, IS_CAUSAL, MASK_KIND, PV_FP8, PV_TWO_LEVEL, PV_INNER_FP16, EXACT_ROUND,
            LOG2_P_SCALE, K_SCALAR, ONE_FMA, TMA)
    for start_n in range(full, hi, BLOCK_N):
        acc0, acc1, l_i, m_i, e_i, bad = _attn_block(
            acc0, acc1, l_i, m_i, e_i, bad, q, q_scale, K, k_row0, KS_base, V, v_off, stride_vn, stride_vd, bb,
            hk, kv_bh, M_base, stride_mm, stride_mn, offs_m, offs_d, start_n, k_off, nq, nk, causal_offset, redo_above,
            D, D_PAD, BLOCK_N, True, IS_CAUSAL, MASK_KIND, PV_FP8, PV_TWO_LEVEL, PV_INNER_FP16, EXACT_ROUND,
            LOG2_P_SCALE, K_SCALAR, ONE_FMA, TMA)
    return acc0, acc1, l_i, e_i, bad


@triton.jit
def _store_half(acc, l_i, VS, VM, O_rows, vs_off, in_m, HALF: tl.constexpr, D: tl.constexpr,
                PV_FP8: tl.constexpr, HAS_VM: tl.constexpr):
    DH: tl.constexpr = acc.shape[1]
    offs_d = HALF * DH + tl.arange(0, DH)
    in_d = offs_d < D
    out = tl.where(l_i[:, None] == 0.0, 0.0, acc / l_i[:, None])
    if PV_FP8:
        # Exact attention is a weighted mean of V, so |out| <= max|V| = 448 V scales per channel; e4m3's rounding of P
        # (up to 1/16) can carry the quantized mean past that, to inf in fp16 for |V| near 65504. Clamping to the
        # bound only moves it toward the exact value. (NaN stays NaN.)
        out = tl.minimum(tl.maximum(out, -448.0, propagate_nan=tl.PropagateNan.ALL), 448.0,
                         propagate_nan=tl.PropagateNan.ALL)
        out = out * tl.load(VS + vs_off + offs_d, mask=in_d, other=0.0)[None, :]
    if HAS_VM:  # V smoothing: softmax rows sum to 1, so the subtracted mean comes back as a constant
        vm = tl.load(VM + vs_off + offs_d, mask=in_d, other=0.0)
        out = tl.where(l_i[:, None] == 0.0, 0.0, out + vm[None, :])
    tl.store(O_rows[:, None] + offs_d[None, :], out.to(O_rows.dtype.element_ty), mask=in_m[:, None] & in_d[None, :])


def _set_block_shapes(nargs):
    """Autotune pre-hook: TMA descriptors copy tiles of the config's block sizes."""
    if isinstance(nargs["K"], TensorDescriptor):
        dh = nargs["D_PAD"] // 2
        nargs["K"].block_shape = [1, nargs["BLOCK_N"], nargs["D_PAD"]]
        nargs["V"].block_shape = [1, dh, nargs["BLOCK_N"]] if nargs["PV_FP8"] else [1, 1, nargs["BLOCK_N"], dh]


def _configs():
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=1, pre_hook=_set_block_shapes)]
    # maxnreg caps registers per thread so that 3 (168) or 4 (128) programs of 4 warps share an SM: on sm90 the
    # kernel waits on latency more than on any one unit, and more resident programs hide it (d128 N=4k: +13 %).
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s, maxnreg=r, pre_hook=_set_block_shapes)
        for bm, bn, w, s, r in [
            (128, 64, 4, 3, None), (128, 64, 8, 3, None), (128, 128, 8, 3, None), (128, 128, 8, 2, None),
            (64, 64, 4, 3, None), (64, 128, 4, 3, None), (64, 128, 4, 4, None), (128, 32, 4, 3, None),
            (64, 128, 4, 2, 168), (64, 128, 4, 3, 128),
        ]
    ]


# One-FMA rows whose offset b = 1.5 * 2**23 * c + e reaches 2**25 (c above about 2, |q|, |k| in the hundreds) are
# redone: from there b's grid is 4 or more apart, and P's peak could sit 4+ binades under 448.
REDO_ABOVE = 2.0**25
ONE_FMA = True  # False: the two-step exponent everywhere (for benchmarks: the before of the one-FMA change)


_TUNE_KEY = ["N_BUCKET", "D", "IS_CAUSAL", "MASK_KIND", "PV_FP8", "PV_TWO_LEVEL", "VARLEN", "K_SCALAR", "ONE_FMA", "TMA"]
# The config the autotuner picked per key (its key plus the dtypes it also keys on). Its own launch path keys on
# every argument, tens of microseconds per call; once a key is tuned, `attention` launches that config directly.
_tuned: dict = {}


@triton.autotune(configs=_configs(), key=_TUNE_KEY)
@triton.jit
def _attn_fwd(
    Q, QS, K, KS, V, stride_vb, stride_vh, stride_vn, stride_vd, VS, VM,
    M, stride_mb, stride_mh, stride_mm, stride_mn,
    O, stride_ob, stride_oh, stride_on, LSE, redo_above,
    CU_Q, CU_K, nq_all, nk_all, kv_group, sm_scale_log2, causal_offset,
    N_BUCKET, H: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PV_FP8: tl.constexpr,
    PV_TWO_LEVEL: tl.constexpr, PV_INNER_FP16: tl.constexpr, HAS_VM: tl.constexpr,
    RETURN_LSE: tl.constexpr, VARLEN: tl.constexpr, EXACT_ROUND: tl.constexpr, K_SCALAR: tl.constexpr,
    ONE_FMA: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """K and V are TMA descriptors when TMA, else pointers (see `attention`).

    ONE_FMA: exp2 takes the raw scores in one FMA (per-tile K scales, no additive mask); a program that finds the
    exponent offset of one of its rows too coarse (`redo_above`) recomputes its rows in two steps."""
    # FP8 P·V stretches P in [0, 1] by 448 to fill e4m3's range, unless an fp16 accumulator could overflow.
    LOG2_P_SCALE: tl.constexpr = 8.807354922057604 if (PV_FP8 and not PV_INNER_FP16) else 0.0
    start_m, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = h // kv_group
    if VARLEN:  # packed sequences: batch index b selects a slice of one long token axis
        q_off = tl.load(CU_Q + b)
        nq = tl.load(CU_Q + b + 1) - q_off
        k_off = tl.load(CU_K + b)
        nk = tl.load(CU_K + b + 1) - k_off
        bb = 0
    else:
        q_off, nq, k_off, nk, bb = 0, nq_all, 0, nk_all, b
    if start_m * BLOCK_M >= nq:
        return
    tl.static_assert(not (ONE_FMA and (MASK_KIND == 2 or not K_SCALAR)))
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    in_m = offs_m < nq
    q_rows = (bb * H + h) * nq_all + q_off + offs_m
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=in_m[:, None] & (offs_d[None, :] < D), other=0)
    q_scale = tl.load(QS + q_rows, mask=in_m, other=0.0) * sm_scale_log2
    kv_bh = bb * HK + hk  # this K/V head's index in [B * HK]
    k_row0 = kv_bh * nk_all + k_off
    KS_base = KS + kv_bh * nk_all
    v_off = bb * stride_vb + hk * stride_vh + k_off * stride_vn
    M_base = M + b * stride_mb + h * stride_mh

    if IS_CAUSAL:  # query i sees keys j <= i + causal_offset
        hi = tl.minimum(tl.maximum((start_m + 1) * BLOCK_M + causal_offset, 0), nk)
        full = tl.minimum(tl.maximum(start_m * BLOCK_M + causal_offset + 1, 0), hi)
    else:
        hi = nk
        full = nk
    full = (full // BLOCK_N) * BLOCK_N
    acc0, acc1, l_i, e_i, bad = _key_loops(
        q, q_scale, K, k_row0, KS_base, V, v_off, stride_vn, stride_vd, bb, hk, kv_bh, M_base, stride_mm, stride_mn,
        offs_m, offs_d, k_off, nq, nk, causal_offset, full, hi, redo_above, D, D_PAD, BLOCK_M, BLOCK_N, IS_CAUSAL,
        MASK_KIND, PV_FP8, PV_TWO_LEVEL, PV_INNER_FP16, EXACT_ROUND, LOG2_P_SCALE, K_SCALAR, ONE_FMA, TMA)
    if ONE_FMA:
        if tl.max(bad.to(tl.int32), axis=0) != 0:
            # Rare (|q|, |k| in the hundreds): redo this program's rows with the two-step exponent. The branch holds
            # a second copy of the loops; the first stays outside it, where Triton software-pipelines it.
            acc0, acc1, l_i, e_i, bad = _key_loops(
                q, q_scale, K, k_row0, KS_base, V, v_off, stride_vn, stride_vd, bb, hk, kv_bh, M_base, stride_mm,
                stride_mn, offs_m, offs_d, k_off, nq, nk, causal_offset, full, hi, redo_above, D, D_PAD, BLOCK_M,
                BLOCK_N, IS_CAUSAL, MASK_KIND, PV_FP8, PV_TWO_LEVEL, PV_INNER_FP16, EXACT_ROUND, LOG2_P_SCALE,
                K_SCALAR, False, TMA)

    o_rows = O + bb * stride_ob + h * stride_oh + (q_off + offs_m) * stride_on
    vs_off = kv_bh * D
    _store_half(acc0, l_i, VS, VM, o_rows, vs_off, in_m, 0, D, PV_FP8, HAS_VM)
    _store_half(acc1, l_i, VS, VM, o_rows, vs_off, in_m, 1, D, PV_FP8, HAS_VM)
    if RETURN_LSE:
        lse = (e_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + (b * H + h) * nq_all + offs_m, lse, mask=in_m)


def _aligned(t: torch.Tensor) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte multiples for every stride but the last."""
    return t.data_ptr() % 16 == 0 and all(st * t.element_size() % 16 == 0 for st in t.stride()[:-1])


def _descriptors(k_i8: torch.Tensor, v: torch.Tensor, pv_fp8: bool):
    """TMA descriptors for K [B * HK, Nk, D] and V ([B * HK, D, Nk] over the FP8 V^T, else [B, HK, Nk, D]), or
    None where TMA cannot read them. Block shapes are set per config by `_set_block_shapes`."""
    b, hk, n, d = k_i8.shape
    k3 = k_i8.view(b * hk, n, d)
    # V^T [B, HK, D, N_PAD]: the descriptor stops at Nk, so TMA zero-fills the padding tokens.
    v_view, v_shape = (v.view(b * hk, d, v.shape[3]), [b * hk, d, n]) if pv_fp8 else (v, list(v.shape))
    # TMA needs 16-byte aligned bases and strides (all but the last). The quantizers' fresh int8 K and padded FP8 V^T
    # have them whenever d is a multiple of 16; a caller's 16-bit V is checked.
    if d % 16 or not (pv_fp8 or _aligned(v)):
        return None
    return (TensorDescriptor(k3, list(k3.shape), list(k3.stride()), [1, 1, 1]),
            TensorDescriptor(v_view, v_shape, list(v_view.stride()), [1] * v_view.dim()))


def _use_tma(device: torch.device) -> bool:
    """Hopper and newer copy tiles with TMA; the interpreter runs the same path on CPU."""
    cap = dispatch.capability(device)
    return cap is None or cap >= dispatch.TMA_MIN


def attention(
    q_i8, q_scale, k_i8, k_scale, v, *, v_scale=None, v_mean=None,
    out_layout_view, sm_scale: float, is_causal: bool, causal_offset: int = 0, mask=None, pv_two_level: bool,
    pv_inner_fp16: bool, return_lse: bool, k_scalar: bool, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
):
    """Run the kernel. q_i8 [B, H, Nq, D] / k_i8 [B, HK, Nk, D] int8 contiguous with per-token scales;
    v: 16-bit [B, HK, Nk, D] (any strides, last dim contiguous) or FP8 V^T [B, HK, D, N_PAD] (v_scale set).
    out_layout_view: the output tensor viewed as [B, H, N, D] (last dim contiguous), written in place.
    is_causal: query i sees keys j <= i + causal_offset (0: top-left, as SDPA; Nk - Nq: bottom-right); rows that
    see no key give 0 (LSE -inf). Packed varlen batches take 0 (per sequence).
    mask: None, bool or additive tensor already expanded to [B, H, Nq, Nk].
    k_scalar: K scales are constant over runs of K_BLOCK keys (per-block/per-warp), so each key tile of at most
    K_BLOCK keys has one scale (not so for packed varlen batches, whose tiles start anywhere).
    K and V are read through TMA descriptors on sm90+ (and under the interpreter) where the batch is dense and the
    strides are 16-byte multiples, else through pointers. Packed varlen batches use pointers: their tiles may run
    into the next sequence, which must read as 0.
    With per-tile K scales the kernel computes exp2 in one FMA per score; a program whose rows would get too coarse
    an exponent offset that way (|q|, |k| in the hundreds) recomputes them in two steps, decided on the device.
    Returns lse [B, H, Nq] or None."""
    b, h, nq_all, d = q_i8.shape
    hk, nk_all = k_i8.shape[1], k_i8.shape[2]
    if sm_scale < 0:
        # q·k * scale = (-q)·k * |scale|: with the sign in q (|q_i8| <= 127), the dequantization factors stay >= 0, as
        # the one-FMA exponent needs (it takes each row's max on the raw INT8 products). In the kernel it cost 5 %.
        q_i8, sm_scale = -q_i8, -sm_scale
    pv_fp8 = v_scale is not None
    if pv_fp8:  # V^T: tokens are the last (contiguous) axis
        sv = (v.stride(0), v.stride(1), 1, v.stride(2))
    else:
        sv = (v.stride(0), v.stride(1), v.stride(2), 1)
    varlen = cu_seqlens_q is not None
    descriptors = _descriptors(k_i8, v, pv_fp8) if _use_tma(q_i8.device) and not varlen else None
    k_arg, v_arg = descriptors or (k_i8, v)
    n_batch = cu_seqlens_q.numel() - 1 if varlen else b
    max_q = max_seqlen_q if varlen else nq_all
    lse = torch.empty((n_batch, h, nq_all), dtype=torch.float32, device=q_i8.device) if return_lse else None
    if mask is None:
        mask_kind, m, ms = MASK_NONE, q_scale, (0, 0, 0, 0)
    else:
        mask_kind = MASK_BOOL if mask.dtype == torch.bool else MASK_ADD
        m, ms = mask, mask.stride()
    o = out_layout_view
    dummy = q_scale
    k_scalar = k_scalar and not varlen
    # The one-FMA exponent needs one K scale per tile and no additive mask; an fp16 inner P·V accumulator keeps
    # P <= 1, where a coarser offset would push small P into e4m3's subnormals, so it stays on two steps.
    one_fma = ONE_FMA and k_scalar and mask_kind != MASK_ADD and not pv_inner_fp16

    def grid(meta):
        return (cdiv(max_q, meta["BLOCK_M"]), h, n_batch)

    n_bucket = next_pow2(max(max_q, 16))
    args = (
        q_i8, q_scale, k_arg, k_scale, v_arg, *sv,
        v_scale if pv_fp8 else dummy, v_mean if v_mean is not None else dummy,
        m, *ms, o, o.stride(0), o.stride(1), o.stride(2), lse if return_lse else dummy, REDO_ABOVE,
        cu_seqlens_q if varlen else dummy, cu_seqlens_k if varlen else dummy,
        nq_all, nk_all, h // hk, sm_scale * LOG2E, causal_offset, n_bucket,
    )
    consts = dict(
        H=h, HK=hk, D=d, D_PAD=max(32, next_pow2(d)), IS_CAUSAL=is_causal, MASK_KIND=mask_kind, PV_FP8=pv_fp8,
        PV_TWO_LEVEL=pv_two_level, PV_INNER_FP16=pv_inner_fp16, HAS_VM=v_mean is not None, RETURN_LSE=return_lse,
        VARLEN=varlen, EXACT_ROUND=INTERPRET, K_SCALAR=k_scalar, ONE_FMA=one_fma, TMA=descriptors is not None,
    )
    tuned_on = {"N_BUCKET": n_bucket, **consts}
    key = (*(tuned_on[name] for name in _TUNE_KEY), v_arg.dtype if descriptors is None else None, m.dtype, o.dtype)
    config = _tuned.get(key)
    if config is None:
        _attn_fwd[grid](*args, **consts)
        _tuned[key] = _attn_fwd.best_config
    else:
        if descriptors is not None:
            _set_block_shapes({"K": k_arg, "V": v_arg, **consts, **config.kwargs})
        _attn_fwd.fn[grid](*args, **consts, **config.all_kwargs())
    return lse

"""PyTorch reference of the quantized algorithm, tile by tile as the kernels run it.

Scores S = deq(Q) deq(K)^T (+ Q-smoothing bias) times the score scale, online softmax in base 2 over
KV_TILE-key tiles, P two-level quantized per tile, O accumulated in float32, divided by the softmax sum,
clamped to V's range and multiplied by V's tensor scale (prepare.kernel_scales). Slow; meant for tests
and for checking the kernels, not for production.
"""
import math

import torch

from . import nvfp4
from .prepare import KV_TILE, Q_BLOCK, QuantizedInputs, kernel_scales

P_ROW_MAX = nvfp4.MAX_VALUE  # a row max of P maps onto the top e4m3 scale times 6


def quantize_p(p: torch.Tensor):
    """Two-level quantization of a softmax tile p [..., rows, KV_TILE] with values in [0, 1].

    Level 1: each row is divided by s1 = rowmax / 2688, so that its largest element becomes 6 * 448.
    Level 2: per-16 NVFP4 quantization of the rescaled row, whose e4m3 scales then use the whole range.
    Returns (codes, e4m3 scales, s1 [..., rows]); p ~= s1 * dequantize(codes, scales).
    """
    row_max = p.amax(dim=-1)
    s1 = torch.where(row_max > 0, row_max / P_ROW_MAX, 1.0)
    codes, scales = nvfp4.quantize(p / s1[..., None])
    return codes, scales, s1


def attention_reference(qi: QuantizedInputs, is_causal: bool, sm_scale: float, causal_offset: int = 0):
    """Returns (out [B, H, Nq, D] float32, lse [B, H, Nq] natural-log, without the K-smoothing shift).

    is_causal hides key j from query i when j > i + causal_offset (0: top-left aligned, as torch's
    SDPA; Nk - Nq: bottom-right). A query that sees no key gets 0 and an LSE of -inf.
    """
    heads = qi.q_codes.shape[1]
    group = heads // qi.k_codes.shape[1]
    q = nvfp4.dequantize(qi.q_codes, qi.q_scales)
    k = nvfp4.dequantize(qi.k_codes, qi.k_scales).repeat_interleave(group, dim=1)
    v = nvfp4.dequantize(qi.v_codes, qi.v_scales).repeat_interleave(group, dim=1)  # [B, H, D, Nk]
    n_q_pad, n_k_pad = q.shape[2], k.shape[2]
    score_scale, lse_factor, v_scale = kernel_scales(qi, sm_scale)

    rows = torch.arange(n_q_pad, device=q.device)[:, None]
    m = torch.full(q.shape[:3], -math.inf, device=q.device)
    l = torch.zeros(q.shape[:3], device=q.device)
    acc = torch.zeros(*q.shape[:3], v.shape[2], device=q.device)
    for start in range(0, n_k_pad, KV_TILE):
        cols = torch.arange(start, start + KV_TILE, device=q.device)[None, :]
        s = q @ k[:, :, start:start + KV_TILE].transpose(2, 3)
        if qi.q_bias is not None:
            s = s + qi.q_bias[..., start:start + KV_TILE].repeat_interleave(Q_BLOCK, dim=2)
        s = s * score_scale
        masked = cols >= qi.n_k
        if is_causal:
            masked = masked | (cols > rows + causal_offset)
        s = s.masked_fill(masked, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        # A row that has seen no visible key yet keeps m = -inf; subtract 0 there, not -inf (NaN).
        m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
        alpha = torch.exp2(m - m_safe)
        p = torch.exp2(s - m_safe[..., None])
        l = l * alpha + p.sum(dim=-1)
        codes, scales, s1 = quantize_p(p)
        pv = nvfp4.dequantize(codes, scales) @ v[..., start:start + KV_TILE].transpose(2, 3)
        acc = acc * alpha[..., None] + pv * s1[..., None]
        m = m_new
    out = torch.where(l[..., None] == 0, 0.0, clamp_to_v_range(acc / l[..., None])) * v_scale
    lse = (m * lse_factor + torch.log2(l)) / math.log2(math.e)
    return out[:, :, :qi.n_q, :qi.head_dim], lse[:, :, :qi.n_q]


def clamp_to_v_range(o: torch.Tensor) -> torch.Tensor:
    """An attention output is a convex combination of V rows, so |o| <= max |V| = 6 * 448 in the units of
    the normalized V. Rounding of P can overshoot by a few percent; the clamp keeps V near the fp16 maximum
    finite. NaN stays NaN."""
    return o.clamp(-nvfp4.MAX_VALUE, nvfp4.MAX_VALUE)

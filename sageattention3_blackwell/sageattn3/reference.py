"""PyTorch reference of the quantized algorithm, tile by tile as the kernels run it.

Scores S = deq(Q) deq(K)^T (+ Q-smoothing bias), online softmax in base 2 over KV_TILE-key tiles,
P two-level quantized per tile, O accumulated in float32. Slow; meant for tests and for checking
the kernels, not for production.
"""
import math

import torch

from . import nvfp4
from .prepare import KV_TILE, Q_BLOCK, QuantizedInputs

P_ROW_MAX = nvfp4.E4M3_MAX * nvfp4.E2M1_MAX  # 2688: a row max of P maps onto the top e4m3 scale times 6


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


def attention_reference(qi: QuantizedInputs, is_causal: bool, sm_scale: float):
    """Returns (out [B, H, Nq, D] float32, lse [B, H, Nq] natural-log, without the K-smoothing shift)."""
    heads = qi.q_codes.shape[1]
    group = heads // qi.k_codes.shape[1]
    q = nvfp4.dequantize(qi.q_codes, qi.q_scales)
    k = nvfp4.dequantize(qi.k_codes, qi.k_scales).repeat_interleave(group, dim=1)
    v = nvfp4.dequantize(qi.v_codes, qi.v_scales).repeat_interleave(group, dim=1)  # [B, H, D, Nk]
    n_q_pad, n_k_pad = q.shape[2], k.shape[2]
    scale_log2 = sm_scale * math.log2(math.e)

    rows = torch.arange(n_q_pad, device=q.device)[:, None]
    m = torch.full(q.shape[:3], -math.inf, device=q.device)
    l = torch.zeros(q.shape[:3], device=q.device)
    acc = torch.zeros(*q.shape[:3], v.shape[2], device=q.device)
    for start in range(0, n_k_pad, KV_TILE):
        cols = torch.arange(start, start + KV_TILE, device=q.device)[None, :]
        s = q @ k[:, :, start:start + KV_TILE].transpose(2, 3)
        if qi.q_bias is not None:
            s = s + qi.q_bias[..., start:start + KV_TILE].repeat_interleave(Q_BLOCK, dim=2)
        s = s * scale_log2
        masked = cols >= qi.n_k
        if is_causal:
            masked = masked | (cols > rows)
        s = s.masked_fill(masked, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s - m_new[..., None])
        l = l * alpha + p.sum(dim=-1)
        codes, scales, s1 = quantize_p(p)
        pv = nvfp4.dequantize(codes, scales) @ v[..., start:start + KV_TILE].transpose(2, 3)
        acc = acc * alpha[..., None] + pv * s1[..., None]
        m = m_new
    out = acc / l[..., None]
    lse = (m + torch.log2(l)) / math.log2(math.e)
    return out[:, :, :qi.n_q, :qi.head_dim], lse[:, :, :qi.n_q]

"""PyTorch reference of the quantized attention algorithm; runs on CPU; the oracle for kernel tests.

All tensors here are HND: [batch, heads, tokens, head_dim]. The quantizers reproduce the Triton
kernels' arithmetic operation for operation (fp32; x * (1 / s) with the reciprocal an IEEE
division; round half to even), so quantized values must match the kernels bit for bit. The
attention itself is evaluated in float64 from the quantized operands, with P rounded the way the
kernel rounds it.

Algorithm (SageAttention / SageAttention2):
  K smoothing   k' = k - mean_tokens(k)          (softmax is invariant to a per-row constant)
  INT8 Q, K     x_i8 = round(x / s), s = absmax(group) / 127 per quantization group (at least 2**-126)
  scores        S = (q_i8 @ k_i8^T) * s_q * s_k * sm_scale   (+ mask)
  softmax       P = exp(S - rowmax(S)), l = rowsum(P)
  P·V (16-bit)  O = (P in V's dtype) @ V / l
  P·V (FP8)     V smoothing (optional) v' = v - mean_tokens(v) (on channels where v' fits V's dtype);
                per-channel s_v = absmax / 448 (at least 2**-126);
                O = clamp(fp8(P * 448) @ fp8(v' / s_v) / 448 / l, +-v_max) * s_v  (+ mean_tokens(v)): exact
                attention is a weighted mean of V, within +-v_max quantized units; e4m3's rounding of P could carry
                the quantized mean past it (inf in fp16 for |V| near 65504), the clamp only moves it toward exact
  LSE           logsumexp(S) + sm_scale * q · mean_tokens(k)   (undoes the smoothing shift)
"""
from __future__ import annotations

import math

import torch

from .quant_groups import MIN_SCALE, Grouping, k_grouping, q_grouping
from .smoothing import token_mean, usable_v_mean

FP8_MAX = 448.0  # largest finite float8_e4m3fn
F16_ACCUM_V_MAX = 2.25  # |quantized V| whose 64-key sums of P * 448 * V an fp16 accumulator holds (compiled fp32+fp16)
INT8_MAX = 127.0


def _usable_scale(scale: torch.Tensor, all_zero: torch.Tensor) -> torch.Tensor:
    """1 for an all-zero group, else at least MIN_SCALE; NaN stays NaN."""
    return torch.where(all_zero, 1.0, torch.where(scale < MIN_SCALE, MIN_SCALE, scale))


def _grouped_scale(x32: torch.Tensor, g: Grouping) -> torch.Tensor:
    """Per-group scale (absmax / 127, at least MIN_SCALE) of x32 [B, H, N, D]; NaN if the group holds NaN/Inf; 1 if
    all zero."""
    b, h, n, d = x32.shape
    pad = (-n) % g.block
    xp = torch.nn.functional.pad(x32, (0, 0, 0, pad))
    row_max = xp.abs().amax(dim=-1)
    row_bad = (xp * 0).sum(dim=-1)  # 0, or NaN when the row holds NaN or Inf
    shape = (b, h, -1, g.g1, g.r1, g.g2, g.r2)
    gmax = row_max.view(shape).amax(dim=(4, 6))
    gbad = row_bad.view(shape).sum(dim=(4, 6))
    scale = gmax / INT8_MAX + gbad
    return _usable_scale(scale, scale == 0).reshape(b, h, -1)


def expand_groups(scale: torch.Tensor, g: Grouping, n: int) -> torch.Tensor:
    """Per-token scale [B, H, n] from per-group scale [B, H, G]."""
    b, h, _ = scale.shape
    s = scale.view(b, h, -1, g.g1, 1, g.g2, 1).expand(b, h, -1, g.g1, g.r1, g.g2, g.r2)
    return s.reshape(b, h, -1)[:, :, :n]


def round_to_int8(y: torch.Tensor) -> torch.Tensor:
    return torch.round(y).to(torch.int8)  # half to even


def quantize_int8(x: torch.Tensor, g: Grouping, mean: torch.Tensor | None = None):
    """INT8 symmetric quantization of x [B, H, N, D] (optionally minus mean [B, H, 1, D] fp32).

    Returns (int8 values [B, H, N, D], fp32 scales [B, H, G])."""
    x32 = x.float()
    if mean is not None:
        x32 = x32 - mean
    scale = _grouped_scale(x32, g)
    tok_scale = expand_groups(scale, g, x.shape[2])
    return round_to_int8(x32 * (1.0 / tok_scale)[..., None]), scale


def quantize_v_fp8(v: torch.Tensor, mean: torch.Tensor | None = None, v_max: float = FP8_MAX):
    """FP8 e4m3 quantization of v [B, H, N, D] with one scale per channel (absmax over tokens / v_max;
    the compiled kernels use v_max 2.25 where an fp16 accumulator sums 64 keys of P * 448 * V).

    Returns (fp8 values [B, H, N, D], fp32 scales [B, H, D])."""
    v32 = v.float()
    if mean is not None:
        v32 = v32 - mean
    scale = v32.abs().amax(dim=2) / v_max
    scale = _usable_scale(scale, scale == 0)
    return (v32 * (1.0 / scale)[:, :, None, :]).to(torch.float8_e4m3fn), scale


def causal_mask(nq: int, nk: int, device=None, offset: int = 0) -> torch.Tensor:
    """Causal mask (True = attend): query i sees keys j <= i + offset (0: top-left, as SDPA's is_causal;
    nk - nq: bottom-right)."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + offset


def _additive(mask: torch.Tensor | None, shape, device) -> torch.Tensor:
    """attn_mask (bool: True = attend, or additive float) as a float64 additive bias of `shape`."""
    if mask is None:
        return torch.zeros(shape, dtype=torch.float64, device=device)
    if mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=torch.float64, device=device)
        return bias.masked_fill(~mask, -math.inf).expand(shape)
    return mask.to(torch.float64).expand(shape)


def _softmax_parts(s: torch.Tensor):
    """exp(S - rowmax) with fully masked rows giving zeros instead of NaN; returns (P, rowmax, rowsum)."""
    m = s.amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe)
    return p, m_safe, p.sum(dim=-1, keepdim=True)


def _repeat_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    return x.repeat_interleave(hq // x.shape[1], dim=1)


def attention_fp64(q, k, v, *, is_causal=False, sm_scale=None, attn_mask=None, causal_offset=0):
    """Plain attention in float64 (HND, GQA by head repetition). Returns (out fp64, lse fp64 [B, H, Nq])."""
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    sm_scale = d**-0.5 if sm_scale is None else sm_scale
    k64, v64 = _repeat_kv(k.double(), hq), _repeat_kv(v.double(), hq)
    s = q.double() @ k64.transpose(-1, -2) * sm_scale + _additive(attn_mask, (b, hq, nq, nk), q.device)
    if is_causal:
        s = s.masked_fill(~causal_mask(nq, nk, q.device, causal_offset), -math.inf)
    p, m, l = _softmax_parts(s)
    out = torch.where(l == 0, torch.zeros((), dtype=torch.float64), (p @ v64) / l)  # NaN stays NaN
    return out, (m + torch.log(l)).squeeze(-1)


def sage_attention_reference(
    q, k, v, *, is_causal=False, causal_offset=0, sm_scale=None, qk_quant_gran="per_thread", pv_dtype="fp16",
    smooth_k=True, smooth_v=False, attn_mask=None, p_scale=FP8_MAX, v_max=FP8_MAX, compiled=False,
):
    """The quantized algorithm on HND tensors. Returns (out in q's dtype, lse fp32 [B, H, Nq]).

    p_scale: FP8 P·V only: the factor P in [0, 1] is stretched by before its FP8 cast (448 fills
    e4m3's range; the Triton kernels use 1 when the per-block accumulator is fp16, which 448 could overflow;
    the compiled ones keep 448 and scale V to +-v_max = 2.25 instead). compiled: the quantization groups of the
    compiled kernels (quant_groups)."""
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    sm_scale = d**-0.5 if sm_scale is None else sm_scale
    km = token_mean(k) if smooth_k else None
    qg, kg = q_grouping(qk_quant_gran, compiled), k_grouping(qk_quant_gran, compiled)
    q_i8, q_s = quantize_int8(q, qg)
    k_i8, k_s = quantize_int8(k, kg, km)
    q_deq = q_i8.double() * expand_groups(q_s, qg, nq)[..., None].double()
    k_deq = k_i8.double() * expand_groups(k_s, kg, nk)[..., None].double()
    s = q_deq @ _repeat_kv(k_deq, hq).transpose(-1, -2) * sm_scale
    s = s + _additive(attn_mask, (b, hq, nq, nk), q.device)
    if is_causal:
        s = s.masked_fill(~causal_mask(nq, nk, q.device, causal_offset), -math.inf)
    p, m, l = _softmax_parts(s)
    if pv_dtype == "fp8":
        vm = usable_v_mean(v) if smooth_v else None
        v_q, v_s = quantize_v_fp8(v, vm, v_max)
        p_q = (p * p_scale).to(torch.float8_e4m3fn).double() / p_scale
        o_q = (p_q @ _repeat_kv(v_q.double(), hq) / l).clamp(-v_max, v_max)  # NaN stays NaN
        pv = o_q * l * _repeat_kv(v_s[:, :, None, :].double(), hq)
        if vm is not None:
            pv = pv + l * _repeat_kv(vm.double(), hq)
    elif pv_dtype == "fp16":
        p_q = p.to(v.dtype).double()
        pv = p_q @ _repeat_kv(v.double(), hq)
    else:
        raise ValueError(f"pv_dtype={pv_dtype!r}; use 'fp16' or 'fp8'")
    out = torch.where(l == 0, torch.zeros((), dtype=torch.float64), pv / l)  # NaN stays NaN
    lse = (m + torch.log(l)).squeeze(-1)
    if km is not None:
        lse = lse + sm_scale * (q.double() @ _repeat_kv(km.double(), hq).transpose(-1, -2)).squeeze(-1)
    return out.to(q.dtype), lse.float()


def error_metrics(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Cosine similarity and relative L1 of out against ref, flattened, in float64 on their device (the tests'
    and bench.accuracy's measure). Identical tensors (e.g. both all zero: every row masked) count as a perfect match."""
    a, r = out.double().flatten(), ref.double().flatten()
    cos = 1.0 if torch.equal(a, r) else torch.nn.functional.cosine_similarity(a, r, dim=0).item()
    return dict(cos=cos, rel_l1=((a - r).abs().sum() / r.abs().sum().clamp_min(1e-30)).item())

"""Quantize, then attend: the Triton backend's two steps on HND views ([B, H, N, D], last dim contiguous)."""
from __future__ import annotations

import torch

from ..plan import Plan, Quantized
from ..quant_groups import k_grouping, q_grouping
from ..smoothing import usable_v_mean
from . import attention as attn_kernel
from . import quant


def _segment_mean(x: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """Per-sequence token mean of a packed x [1, H, total, D] -> [1, H, n_seg, D] fp32."""
    _, h, _, d = x.shape
    seg = seg.long()
    # each token enters divided by its sequence's length: a sum of bf16 K itself can overflow fp32
    weight = 1.0 / torch.bincount(seg, minlength=n_seg).clamp_min(1).to(torch.float32)
    means = torch.zeros((n_seg, h, d), dtype=torch.float32, device=x.device)
    means.index_add_(0, seg, x[0].transpose(0, 1).float().mul_(weight[seg][:, None, None]))
    return means.permute(1, 0, 2).unsqueeze(0)


def quantize(q, k, v, plan: Plan, seg_k: torch.Tensor | None = None, n_seg: int = 1) -> Quantized:
    """seg_k: for packed varlen batches, the sequence index of every key token (int32 [total_k])."""
    v_mean = usable_v_mean(v)[:, :, 0].contiguous() if plan.smooth_v else None
    # Two launches: INT8 Q with one read of K and V for the K mean (dense batches) and the FP8 V scales' absmax;
    # then INT8 K (smoothed) with FP8 V^T.
    dense_mean = plan.smooth_k and seg_k is None
    q_job = quant.Int8Job(q, q_grouping(plan.qk_quant_gran))
    stats = quant.KVJob(k if dense_mean else None, v if plan.pv_fp8 else None, v_mean) \
        if dense_mean or plan.pv_fp8 else None
    quant.launch(q_job, stats)
    k_mean, v_amax = stats.finalize() if stats is not None else (None, None)
    if plan.smooth_k and seg_k is not None:
        k_mean = _segment_mean(k, seg_k, n_seg)
    k_job = quant.Int8Job(k, k_grouping(plan.qk_quant_gran), k_mean, seg_k)
    v_job = quant.KVJob(None, v, v_mean, v_amax) if plan.pv_fp8 else None
    quant.launch(k_job, v_job)
    v_scale = None
    if plan.pv_fp8:
        v, v_scale = v_job.out, v_job.scale
    elif v_mean is not None:
        v = (v.float() - v_mean[:, :, None, :]).to(v.dtype)
    return Quantized(q_job.out, q_job.scale, k_job.out, k_job.scale, v, v_scale, v_mean, k_mean)


def attend(x: Quantized, plan: Plan, out_view, *, sm_scale, is_causal, causal_offset=0, mask=None,
           return_lse=False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None):
    return attn_kernel.attention(
        x.q_i8, x.q_scale, x.k_i8, x.k_scale, x.v,
        v_scale=x.v_scale, v_mean=x.v_mean, out_layout_view=out_view, sm_scale=sm_scale, is_causal=is_causal,
        causal_offset=causal_offset, mask=mask, pv_two_level=plan.pv_two_level, pv_inner_fp16=plan.pv_inner_fp16,
        return_lse=return_lse,
        k_scalar=k_grouping(plan.qk_quant_gran).groups_per_block == 1,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
    )


def lse_smoothing_correction(q: torch.Tensor, k_mean: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """sm_scale * q · mean(k) [B, H, Nq]: what K smoothing subtracted from every score of a row."""
    b, h, n, d = q.shape
    hk = k_mean.shape[1]
    qg = q.reshape(b, hk, (h // hk) * n, d).float()
    return (qg @ k_mean.transpose(-1, -2)).reshape(b, h, n) * sm_scale

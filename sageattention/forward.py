"""The real implementations behind the registered ops: layouts in, quantize, attend, layouts out."""
from __future__ import annotations

import warnings

import torch

from .dispatch import capability, cuda_extension_archs
from .inputs import to_hnd
from .triton import pipeline
from .triton.pipeline import Plan

_warned: set = set()


def note_cuda_fallback(variant: str, device: torch.device) -> None:
    """The `_cuda` variants run on Triton until the CUDA extension serves this GPU: say so once."""
    if not variant or variant in _warned:
        return
    cap = capability(device)
    if cap is None or cap in cuda_extension_archs():
        return
    _warned.add(variant)
    warnings.warn(
        f"{variant}: the compiled CUDA kernels are not available for sm{cap[0]}{cap[1]} in this build; "
        "running the same algorithm with the Triton kernels", RuntimeWarning, stacklevel=3,
    )


def dense(q, k, v, attn_mask, tensor_layout: str, is_causal: bool, sm_scale: float, plan: Plan, return_lse: bool):
    """Returns (out in q's layout and dtype, lse [B, H, Nq] fp32 or an empty tensor)."""
    qh, kh, vh = (to_hnd(t, tensor_layout) for t in (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    x = pipeline.quantize(qh, kh, vh, plan)
    lse = pipeline.attend(x, plan, to_hnd(out, tensor_layout), sm_scale=sm_scale, is_causal=is_causal,
                          mask=attn_mask, return_lse=return_lse)
    if not return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    if x.k_mean is not None:
        lse = lse + pipeline.lse_smoothing_correction(qh, x.k_mean, sm_scale)
    return out, lse


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, is_causal: bool, sm_scale: float, plan: Plan):
    """Packed sequences: q [total_q, H, D], k/v [total_k, HK, D]; returns out like q."""
    n_seq = cu_seqlens_k.numel() - 1
    seg_k = None
    if plan.smooth_k:
        lengths = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        seg_k = torch.repeat_interleave(torch.arange(n_seq, device=k.device, dtype=torch.int32), lengths,
                                        output_size=k.shape[0])
    qh, kh, vh = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))  # [1, H, total, D] views
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    x = pipeline.quantize(qh, kh, vh, plan, seg_k=seg_k, n_seg=n_seq)
    pipeline.attend(x, plan, out.unsqueeze(0).transpose(1, 2), sm_scale=sm_scale, is_causal=is_causal,
                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q)
    return out

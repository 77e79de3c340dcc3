"""The real implementations behind the registered ops: layouts in, quantize, attend, layouts out."""
from __future__ import annotations

import functools
import warnings

import torch

from .compiled_call import CompiledCall
from .dispatch import capability, compiled_family, compiled_module
from .inputs import to_hnd
from .plan import Plan

_warned: set = set()


def note_cuda_fallback(variant: str, device: torch.device, pv_fp8: bool) -> None:
    """A `_cuda` variant runs on Triton where this build has no compiled kernels for the GPU: say so once."""
    if not variant or variant in _warned:
        return
    cap = capability(device)
    if cap is None or compiled_family(cap, pv_fp8, device) is not None:
        return
    _warned.add(variant)
    warnings.warn(
        f"{variant}: the compiled CUDA kernels are not available for sm{cap[0]}{cap[1]} in this build; "
        "running the same algorithm with the Triton kernels", RuntimeWarning, stacklevel=3,
    )


def compiled(q, k, v, call: CompiledCall):
    """The compiled kernels: quantization and attention in one extension call."""
    out, lse = compiled_module(call.family).attention(q, k, v, *call.kernel_args())
    return out, lse  # the extension returns a list; the op's schema is a tuple


@functools.cache
def _import_triton_pipeline():
    from .triton import pipeline
    return pipeline


def triton_pipeline(device: torch.device):
    """The Triton backend, imported on first use (then a cached lookup): `import sageattention` and the compiled
    path work without Triton, which conda-forge lacks on win-64."""
    try:
        return _import_triton_pipeline()
    except ImportError as e:
        if e.name != "triton":
            raise
        cap = capability(device)
        gpu = f"sm{cap[0]}{cap[1]}" if cap else str(device)
        raise RuntimeError(
            f"sageattention: the compiled CUDA kernels of this build are not available for {gpu}, and the Triton "
            "kernels that serve it instead need Triton, which is not installed. Install it with "
            "`pip install triton` (Linux) or `pip install triton-windows` (Windows)."
        ) from e


def dense(q, k, v, attn_mask, tensor_layout: str, is_causal: bool, causal_offset: int, sm_scale: float, plan: Plan,
          return_lse: bool):
    """Returns (out in q's layout and dtype, lse [B, H, Nq] fp32 or an empty tensor)."""
    qh, kh, vh = (to_hnd(t, tensor_layout) for t in (q, k, v))
    pipeline = triton_pipeline(q.device)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    x = pipeline.quantize(qh, kh, vh, plan)
    lse = pipeline.attend(x, plan, to_hnd(out, tensor_layout), sm_scale=sm_scale, is_causal=is_causal,
                          causal_offset=causal_offset, mask=attn_mask, return_lse=return_lse)
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
    pipeline = triton_pipeline(q.device)
    qh, kh, vh = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))  # [1, H, total, D] views
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    x = pipeline.quantize(qh, kh, vh, plan, seg_k=seg_k, n_seg=n_seq)
    pipeline.attend(x, plan, out.unsqueeze(0).transpose(1, 2), sm_scale=sm_scale, is_causal=is_causal,
                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q)
    return out

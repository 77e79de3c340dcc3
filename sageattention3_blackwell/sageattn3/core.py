"""`sageattn3_blackwell`: the public entry point."""
from __future__ import annotations

import math

import torch

from . import dispatch
from .prepare import padded_head_dim, quantize_inputs

LAYOUTS = ("HND", "NHD")
DTYPES = (torch.float16, torch.bfloat16)


def _check_inputs(q, k, v, attn_mask, tensor_layout):
    if attn_mask is not None:
        raise ValueError("attn_mask is not supported by sageattn3_blackwell (only is_causal); pass attn_mask=None")
    if tensor_layout not in LAYOUTS:
        raise ValueError(f"tensor_layout must be 'HND' ([batch, heads, tokens, head_dim]) or 'NHD' "
                         f"([batch, tokens, heads, head_dim]), got {tensor_layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ({tensor_layout}), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    b, h, _, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim (layout HND)")
    if h % k.shape[1]:
        raise ValueError(f"q heads ({h}) must be a multiple of k/v heads ({k.shape[1]}) for grouped-query attention")
    padded_head_dim(d)


def sageattn3_blackwell(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None, is_causal: bool = False,
                        per_block_mean: bool = True, *, sm_scale: float | None = None, tensor_layout: str = "HND",
                        return_lse: bool = False, backend: str = "auto", allow_emulation: bool = False):
    """FP4 (NVFP4) attention for Blackwell GPUs; a drop-in for scaled_dot_product_attention.

    q [B, H, Nq, D], k/v [B, Hkv, Nk, D] ("HND"; "NHD" swaps tokens and heads); H a multiple of Hkv.
    D <= 128 (64 and 128 natively, others zero-padded). is_causal masks key j > query i (top-left
    aligned, as torch SDPA). Returns the output in q's dtype and layout, plus the natural-log
    logsumexp [B, H, Nq] (float32) of the scaled scores when return_lse.
    backend: "auto" (Triton on sm_100/sm_120/sm_121), "cuda", "triton" or "reference" (PyTorch).
    On other GPUs this raises "Unsupported GPU" unless allow_emulation=True or SAGEATTN3_ALLOW_EMULATION=1.
    """
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) if isinstance(t, torch.Tensor) else t for t in (q, k, v))
    _check_inputs(q, k, v, attn_mask, tensor_layout)
    chosen = dispatch.choose_backend(q.device, backend, allow_emulation)
    scale = 1.0 / math.sqrt(q.shape[3]) if sm_scale is None else float(sm_scale)

    qi = quantize_inputs(q, k, v, per_block_mean)
    if chosen == "reference":
        from .reference import attention_reference as run
    elif chosen == "triton":
        from .triton_attn import attention_triton as run
    else:
        from .cuda_attn import attention_cuda as run
    out, lse = run(qi, is_causal, scale)

    out = out.to(q.dtype)
    if tensor_layout == "NHD":
        out = out.transpose(1, 2)
    if not return_lse:
        return out
    # K smoothing removed q . mean(K) from every score of a row; the logsumexp must include it.
    b, h, n, d = q.shape
    h_kv = k.shape[1]  # the query heads of one K/V head are consecutive: multiply them as one batch
    shift = (q.reshape(b, h_kv, -1, d).float() @ qi.k_mean[..., :d].transpose(2, 3)).reshape(b, h, n)
    return out, lse + scale * shift

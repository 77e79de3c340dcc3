"""`sageattn3_blackwell`: the public entry point."""
from __future__ import annotations

import math
import numbers

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from . import dispatch
from .prepare import FLOAT32_MAX, padded_head_dim, quantize_inputs

# layout -> (heads dim, tokens dim), and how its shape reads in messages
LAYOUTS = {"HND": (1, 2), "NHD": (2, 1)}
LAYOUT_SHAPES = {"HND": "[batch, heads, tokens, head_dim]", "NHD": "[batch, tokens, heads, head_dim]"}
DTYPES = (torch.float16, torch.bfloat16)
NO_BACKWARD = ("sageattn3_blackwell has no backward pass (inference only): the gradient of its FP4-quantized "
               "forward is not the gradient of attention, so it refuses rather than return a wrong one. Run it "
               "under torch.no_grad() or torch.inference_mode(), or train with "
               "torch.nn.functional.scaled_dot_product_attention.")


def _check_inputs(q, k, v, tensor_layout):
    """Checks q, k, v as the caller passed them; messages show the caller's shapes and layout."""
    if tensor_layout not in LAYOUTS:
        raise ValueError(f"tensor_layout must be 'HND' ({LAYOUT_SHAPES['HND']}) or 'NHD' "
                         f"({LAYOUT_SHAPES['NHD']}), got {tensor_layout!r}")
    layout = f"{tensor_layout} {LAYOUT_SHAPES[tensor_layout]}"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ({layout}), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim ({layout})")
    heads, kv_heads = q.shape[LAYOUTS[tensor_layout][0]], k.shape[LAYOUTS[tensor_layout][0]]
    if (kv_heads == 0 and heads > 0) or (kv_heads > 0 and heads % kv_heads):
        raise ValueError(f"q heads ({heads}) must be a multiple of k/v heads ({kv_heads}) for grouped-query "
                         f"attention; got q {tuple(q.shape)} and k {tuple(k.shape)} ({layout})")
    if q.shape[3] == 0:
        raise ValueError(f"head_dim must be at least 1, got q {tuple(q.shape)} ({layout})")
    padded_head_dim(q.shape[3])


def _softmax_scale(sm_scale, head_dim: int) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        hint = " (for a one-element tensor pass float(t))" if isinstance(sm_scale, torch.Tensor) else ""
        raise TypeError(f"sm_scale must be a real number (float or int) or None, got {type(sm_scale).__name__}{hint}")
    scale = float(sm_scale)
    # The kernels take the scale in float32; a larger or non-finite one has no float32 meaning.
    if not (math.isfinite(scale) and abs(scale) <= FLOAT32_MAX):
        raise ValueError(f"sm_scale must be finite and at most {FLOAT32_MAX:.6g} in magnitude (float32), "
                         f"got {sm_scale!r}")
    return scale


def _causal_offset(attn_mask, is_causal: bool, n_q: int, n_k: int) -> int | None:
    """None without a mask; else the offset c such that query i sees keys j <= i + c."""
    if attn_mask is None:
        return 0 if is_causal else None
    if not isinstance(attn_mask, CausalBias):
        raise ValueError("attn_mask must be None or a causal mask from torch.nn.attention.bias "
                         "(causal_upper_left or causal_lower_right); sageattn3_blackwell has no general masks, "
                         f"got {type(attn_mask).__name__}")
    if is_causal:
        raise ValueError("pass either is_causal=True or a causal attn_mask, not both")
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (n_q, n_k):
        raise ValueError(f"the causal attn_mask is for {attn_mask.seq_len_q} queries and {attn_mask.seq_len_kv} "
                         f"keys, but q has {n_q} tokens and k {n_k}")
    return 0 if attn_mask.variant == CausalVariant.UPPER_LEFT else n_k - n_q


def _attention(q, k, v, causal_offset, per_block_mean, scale, backend, return_lse):
    """HND q, k, v -> out (q's dtype), or (out, lse) when return_lse."""
    b, h, n_q, _ = q.shape
    if q.numel() == 0 or k.shape[2] == 0:
        # Nothing to compute, or no keys: as scaled_dot_product_attention, zeros (LSE -inf).
        out, lse = torch.zeros_like(q), torch.full((b, h, n_q), -math.inf, device=q.device)
        return (out, lse) if return_lse else out
    qi = quantize_inputs(q, k, v, per_block_mean)
    if backend == "reference":
        from .reference import attention_reference as run
    elif backend == "triton":
        from .triton_attn import attention_triton as run
    else:
        from .cuda_attn import attention_cuda as run
    out, lse = run(qi, causal_offset is not None, scale, causal_offset or 0)
    out = out.to(q.dtype)
    if not return_lse:
        return out
    # K smoothing removed q . mean(K) from every score of a row; the logsumexp must include it.
    d = q.shape[3]
    h_kv = k.shape[1]  # the query heads of one K/V head are consecutive: multiply them as one batch
    shift = (q.reshape(b, h_kv, -1, d).float() @ qi.k_mean[..., :d].transpose(2, 3)).reshape(b, h, n_q)
    return out, lse + scale * shift


@torch.library.custom_op("sageattn3_autograd::refuse_backward", mutates_args=())
def _refuse_backward(grad: torch.Tensor) -> torch.Tensor:
    """Raises when run. An op rather than a plain raise so that torch.compile can trace the backward
    (through the fake below) and the error comes when backward runs, in compiled code as in eager."""
    raise RuntimeError(NO_BACKWARD)


@_refuse_backward.register_fake
def _(grad):
    return torch.empty_like(grad)


class _NoBackward(torch.autograd.Function):
    """The forward as is; any backward through it (output or LSE) raises NO_BACKWARD."""

    @staticmethod
    def forward(ctx, q, k, v, *args):
        return _attention(q, k, v, *args)

    @staticmethod
    def backward(ctx, grad_out, *_):
        return (_refuse_backward(grad_out),) + (None,) * (len(ctx.needs_input_grad) - 1)


def sageattn3_blackwell(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None, is_causal: bool = False,
                        per_block_mean: bool = True, *, sm_scale: float | None = None, tensor_layout: str = "HND",
                        return_lse: bool = False, backend: str = "auto", allow_emulation: bool = False):
    """FP4 (NVFP4) attention for Blackwell GPUs; a drop-in for scaled_dot_product_attention (forward only).

    q [B, H, Nq, D], k/v [B, Hkv, Nk, D] ("HND"; "NHD" swaps tokens and heads); H a multiple of Hkv.
    D <= 128 (64 and 128 natively, others zero-padded). is_causal masks key j > query i (top-left
    aligned, as torch SDPA); attn_mask may instead be torch.nn.attention.bias.causal_lower_right(Nq, Nk)
    (bottom-right: query i sees keys j <= i + Nk - Nq, as for decoding with a KV cache) or
    causal_upper_left(Nq, Nk). A query that sees no key gets 0 (LSE -inf). sm_scale: any finite float
    (default 1/sqrt(D)). Returns the output in q's dtype and layout, plus the natural-log logsumexp
    [B, H, Nq] (float32) of the scaled scores when return_lse. Backward raises (inference only).
    backend: "auto" (the compiled kernels after a one-time self-check, else Triton: dispatch.py), "cuda",
    "triton" or "reference" (PyTorch).
    On other GPUs this raises "Unsupported GPU" unless allow_emulation=True or SAGEATTN3_ALLOW_EMULATION=1.
    """
    _check_inputs(q, k, v, tensor_layout)
    tokens = LAYOUTS[tensor_layout][1]
    causal_offset = _causal_offset(attn_mask, is_causal, q.shape[tokens], k.shape[tokens])
    scale = _softmax_scale(sm_scale, q.shape[3])
    chosen = dispatch.choose_backend(q.device, backend, allow_emulation)
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    args = (causal_offset, per_block_mean, scale, chosen, return_lse)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        result = _NoBackward.apply(q, k, v, *args)
    else:
        result = _attention(q, k, v, *args)
    out, lse = result if return_lse else (result, None)
    if tensor_layout == "NHD":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out

"""Argument checking and layout handling shared by every public function.

Every check raises a TypeError/ValueError that names the problem and what is supported.
"""
from __future__ import annotations

import os

import torch

DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("HND", "NHD")
MAX_HEAD_DIM = 256


def interpreting() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1) lets the kernels run on CPU tensors, for testing."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; sageattention supports torch.float16 and torch.bfloat16")
    if t.numel() == 0:
        raise ValueError(f"{name} has a zero-size dimension (shape {tuple(t.shape)}); every dimension must be >= 1")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension; got strides {t.stride()} "
                         "(call .contiguous() first)")


def check_qkv(q, k, v, ndim: int) -> None:
    """Common checks: types, dtypes, devices, ranks, head_dim."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
        if t.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"sageattention runs on CUDA GPUs; the inputs are on {q.device}. Move them with .cuda() "
                         "(CPU tensors run only under Triton's interpreter, TRITON_INTERPRET=1, for testing)")
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"head_dim differs: q {d}, k {k.shape[-1]}, v {v.shape[-1]}; all must be equal")
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} is not supported; sageattention supports head_dim <= {MAX_HEAD_DIM}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")


def check_heads(hq: int, hk: int) -> None:
    if hq % hk != 0:
        raise ValueError(f"q has {hq} heads and k/v have {hk}: the k/v heads must divide the q heads (GQA/MQA)")


def to_hnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A [B, H, N, D] view of x (no copy)."""
    return x if layout == "HND" else x.transpose(1, 2)


def check_layout(tensor_layout) -> str:
    if tensor_layout not in LAYOUTS:
        raise ValueError(f"tensor_layout={tensor_layout!r} is not supported; use 'HND' ([B, H, N, D]) or 'NHD' ([B, N, H, D])")
    return tensor_layout


def check_dense(q, k, v, tensor_layout) -> tuple[int, int, int, int, int]:
    """Checks 4-D inputs; returns (batch, q heads, kv heads, q len, kv len)."""
    check_layout(tensor_layout)
    check_qkv(q, k, v, 4)
    qh, kh = to_hnd(q, tensor_layout), to_hnd(k, tensor_layout)
    if qh.shape[0] != kh.shape[0]:
        raise ValueError(f"batch size differs: q {qh.shape[0]}, k/v {kh.shape[0]}")
    check_heads(qh.shape[1], kh.shape[1])
    return qh.shape[0], qh.shape[1], kh.shape[1], qh.shape[2], kh.shape[2]


def resolve_sm_scale(sm_scale, head_dim: int) -> float:
    if sm_scale is None:
        return head_dim**-0.5
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__}")
    return float(sm_scale)


def check_dropout(dropout_p) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p={dropout_p} is not supported: sageattention is an inference kernel (use dropout_p=0.0)")


def expand_mask(attn_mask, q: torch.Tensor, shape) -> torch.Tensor | None:
    """attn_mask (None, bool, or additive float) broadcast to [B, H, Nq, Nk] as a view."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
        raise TypeError(f"attn_mask has dtype {attn_mask.dtype}; use torch.bool (True = attend) or an additive float mask")
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but q is on {q.device}")
    try:
        return attn_mask.expand(shape)
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to [B, H, Nq, Nk] = {list(shape)}") from None


def check_kwargs(fn_name: str, kwargs: dict, allowed) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(f"{fn_name}() got unexpected keyword argument(s) {unknown}; accepted: {sorted(allowed)}")

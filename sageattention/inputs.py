"""Argument checking and layout handling shared by every public function.

Every check raises a TypeError/ValueError that names the problem and what is supported.
"""
from __future__ import annotations

import math
import numbers
import os
import sys

import torch

DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("HND", "NHD")
MAX_HEAD_DIM = 256


# read once, as Triton's kernels read it when they are defined (reading the environment costs microseconds per call)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def interpreting() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1) lets the kernels run on CPU tensors, for testing."""
    return _INTERPRET


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
    if not _pass_all(q, k, v, ndim):
        _check_each(q, k, v, ndim)


def _pass_all(q, k, v, ndim: int) -> bool:
    """True only where every check of _check_each passes, in one expression: a third of their host time, which
    small calls feel. Anything unusual (a tensor subclass included) is left to _check_each."""
    return (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor
            and q.dtype in DTYPES and q.dtype == k.dtype == v.dtype and q.dim() == ndim and k.dim() == ndim
            and k.shape == v.shape and q.shape[-1] == k.shape[-1] <= MAX_HEAD_DIM and q.numel() and k.numel()
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
            and q.device == k.device == v.device and (q.device.type == "cuda" or interpreting()))


def _check_each(q, k, v, ndim: int) -> None:
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
    (b, *q_hn), (bk, *k_hn) = q.shape[:3], k.shape[:3]  # [B, H, N] or [B, N, H]
    if b != bk:
        raise ValueError(f"batch size differs: q {b}, k/v {bk}")
    (hq, nq), (hk, nk) = (q_hn, k_hn) if tensor_layout == "HND" else (q_hn[::-1], k_hn[::-1])
    check_heads(hq, hk)
    return b, hq, hk, nq, nk


# The kernels work with sm_scale * log2(e) in fp32, so |sm_scale| must stay below fp32's max / log2(e).
MAX_SM_SCALE = 3.4028234663852886e38 / 1.4426950408889634


def resolve_sm_scale(sm_scale, head_dim: int) -> float:
    """sm_scale as a float (None: 1 / sqrt(head_dim)). Any finite value of magnitude <= MAX_SM_SCALE (~2.4e38) is
    served, negative and zero included."""
    if sm_scale is None:
        return head_dim**-0.5
    if isinstance(sm_scale, torch.Tensor):
        raise TypeError("sm_scale must be a Python float or None, got a torch.Tensor; pass float(t) (reading a GPU "
                        "tensor synchronizes with the device)")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__}")
    scale = float(sm_scale)
    if not math.isfinite(scale):
        raise ValueError(f"sm_scale={scale} is not supported; it must be finite")
    if abs(scale) > MAX_SM_SCALE:
        raise ValueError(f"sm_scale={scale:g} is not supported: the kernels compute in fp32 with sm_scale * log2(e), "
                         f"which needs |sm_scale| <= {MAX_SM_SCALE:.3g}")
    return scale


def check_dropout(dropout_p) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p={dropout_p} is not supported: sageattention is an inference kernel (use dropout_p=0.0)")


def causal_alignment(attn_mask, is_causal, nq: int, nk: int):
    """(attn_mask, is_causal, causal_offset): query i sees keys j <= i + causal_offset. is_causal=True is top-left
    (offset 0), as scaled_dot_product_attention; attn_mask=torch.nn.attention.bias.causal_lower_right(Nq, Nk) is
    bottom-right (Nk - Nq: the last query sees every key, as in KV-cache decoding), causal_upper_left(Nq, Nk)
    top-left. Other masks pass through."""
    # a CausalBias exists only once its module is imported (importing it loads Triton, which `import sageattention`
    # must not: the compiled path works without it)
    bias = sys.modules.get("torch.nn.attention.bias")
    if bias is None or not isinstance(attn_mask, bias.CausalBias):
        return attn_mask, bool(is_causal), 0
    if is_causal:
        raise ValueError("pass either is_causal=True or a causal attn_mask (causal_upper_left / causal_lower_right), "
                         "not both")
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (nq, nk):
        raise ValueError(f"the causal attn_mask is for {attn_mask.seq_len_q} queries and {attn_mask.seq_len_kv} keys, "
                         f"but q has {nq} tokens and k {nk}")
    return None, True, 0 if attn_mask.variant == bias.CausalVariant.UPPER_LEFT else nk - nq


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
    unknown = sorted(key for key in kwargs if key not in allowed)  # (no set difference: dynamo cannot trace it)
    if unknown:
        raise TypeError(f"{fn_name}() got unexpected keyword argument(s) {unknown}; accepted: {sorted(allowed)}")


CU_DTYPES = (torch.int32, torch.int64)


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q, max_seqlen_k,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks sageattn_varlen's packed-batch description; returns (cu_seqlens_q, cu_seqlens_k) as int32 on `device`.

    The value checks read the offsets on the host: CPU tensors are read for free and then copied to `device`
    without waiting (non_blocking); tensors on `device` are read back together in one small copy (one sync).
    While torch.compile traces, reading values would break the graph: the op checks them (check_cu_seqlens_values)."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of cumulative sequence lengths, got {type(cu).__name__}")
        if cu.dtype not in CU_DTYPES:
            raise TypeError(f"{name} has dtype {cu.dtype}; use torch.int32 (or torch.int64)")
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{name} must be a 1-D tensor of batch+1 cumulative lengths starting at 0 (at least 2 "
                             f"entries); got shape {tuple(cu.shape)}")
        if cu.device not in (device, torch.device("cpu")):
            raise ValueError(f"{name} is on {cu.device} but q is on {device}; pass it on q's device or on the CPU")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k describe {cu_seqlens_q.numel() - 1} and "
                         f"{cu_seqlens_k.numel() - 1} sequences; they must have the same number of entries (batch+1)")
    if cu_seqlens_q.device != cu_seqlens_k.device:  # one copy reads both back
        raise ValueError(f"cu_seqlens_q is on {cu_seqlens_q.device} and cu_seqlens_k on {cu_seqlens_k.device}; "
                         f"pass both on q's device ({device}) or both on the CPU")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)):  # SymInt: torch.compile's dynamic ints
            raise TypeError(f"{name} must be an int, got {type(n).__name__} ({n!r})")
        if n < 1:
            raise ValueError(f"{name} must be a positive int, got {n}")
    if not torch.compiler.is_compiling():
        check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k)
    return (cu_seqlens_q.to(device=device, dtype=torch.int32, non_blocking=True),
            cu_seqlens_k.to(device=device, dtype=torch.int32, non_blocking=True))


def check_cu_seqlens_values(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                            max_seqlen_q: int, max_seqlen_k: int | None = None) -> None:
    """The checks that read the offsets (both tensors in one copy to the host): each starts at 0, never decreases
    and ends at its token count, so the kernel stays inside q/k/v and writes every output row; no sequence is
    longer than max_seqlen (None: not checked). Equal consecutive entries (empty sequences) are fine."""
    n = cu_seqlens_q.numel()
    host = torch.cat((cu_seqlens_q, cu_seqlens_k)).cpu().long()  # int64: differences of int32 offsets can overflow
    for name, cu, total, what, max_name, max_len in (
        ("cu_seqlens_q", host[:n], total_q, ("q", "queries"), "max_seqlen_q", max_seqlen_q),
        ("cu_seqlens_k", host[n:], total_k, ("k", "keys"), "max_seqlen_k", max_seqlen_k),
    ):
        if cu[0] != 0:
            raise ValueError(f"{name}[0] is {int(cu[0])}; it must be 0 (the first sequence starts at token 0)")
        lengths = cu[1:] - cu[:-1]
        if (lengths < 0).any():
            i = int((lengths < 0).nonzero()[0]) + 1
            raise ValueError(f"{name} must be non-decreasing (sequence i spans {name}[i]:{name}[i+1]); "
                             f"{name}[{i}] = {int(cu[i])} is less than {name}[{i - 1}] = {int(cu[i - 1])}")
        if cu[-1] != total:
            raise ValueError(f"{name}[{n - 1}] (the last entry) is {int(cu[-1])}, but {what[0]} has {total} tokens; "
                             f"the last entry must equal {what[0]}.shape[0]")
        longest = int(lengths.argmax())
        if max_len is not None and lengths[longest] > max_len:
            raise ValueError(f"{max_name}={max_len} is less than the longest sequence: sequence {longest} has "
                             f"{int(lengths[longest])} {what[1]} ({name}[{longest + 1}] - {name}[{longest}]); "
                             f"{max_name} must be at least {int(lengths[longest])}")

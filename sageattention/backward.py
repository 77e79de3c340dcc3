"""Gradients for sageattention's ops: the gradient of exact attention at the same inputs.

The forward is quantized, so the gradient of what it computes is not useful (and its INT8 rounding has none); what
fine-tuning through `sageattn` needs is the gradient of the attention it approximates. Backward recomputes exact
attention in fp32, a block of query rows at a time (memory bounded by CHUNK_ELEMENTS scores), and applies the
softmax backward. It runs inside custom ops (plain tensor math, no autograd inside), so eager and `torch.compile`
run the same code. It is not a fused kernel: a training step spends more time here than in SDPA's backward.

Gradients through the returned LSE are refused (a clear error when one is nonzero), not silently dropped.
"""
from __future__ import annotations

from typing import Optional

import torch

from .inputs import to_hnd

NO_LSE_GRAD = ("sageattention: gradients through the returned LSE are not supported (only through the attention "
               "output); detach the LSE (lse.detach()) before using it in a loss")
CHUNK_ELEMENTS = 1 << 25  # fp32 scores per block of query rows (128 MiB; the block's temporaries are a few of these)


def exact_grads(grad_out, q, k, v, attn_mask, is_causal: bool, causal_offset: int, sm_scale: float):
    """dq, dk, dv of softmax(sm_scale * q k^T + mask) v at HND q, k, v (GQA: k/v heads divide q heads). attn_mask:
    None, bool (True = attend) or additive, [B, Hq, Nq, Nk] (an expanded view); causal: query i sees keys
    j <= i + causal_offset. Rows that see no key have output 0 and no gradient, as in the forward."""
    b, hq, nq, _ = q.shape
    hk, nk = k.shape[1], k.shape[2]
    kf, vf = (t.float().repeat_interleave(hq // hk, dim=1) for t in (k, v))
    dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
    rows = max(1, CHUNK_ELEMENTS // (b * hq * nk))
    keys = torch.arange(nk, device=q.device)
    for i0 in range(0, nq, rows):
        i1 = min(nq, i0 + rows)
        qi, go = q[:, :, i0:i1].float(), grad_out[:, :, i0:i1].float()
        s = qi @ kf.transpose(-1, -2) * sm_scale
        if attn_mask is not None:
            m = attn_mask[:, :, i0:i1]
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
        if is_causal:
            hidden = keys[None, :] > torch.arange(i0, i1, device=q.device)[:, None] + causal_offset
            s = s.masked_fill(hidden, float("-inf"))
        row_max = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isneginf(row_max), 0.0, row_max))
        total = p.sum(-1, keepdim=True)
        p = torch.where(total > 0, p / total, 0.0)  # a row without keys: p = 0, so output 0 and no gradient
        o = p @ vf
        ds = p * (go @ vf.transpose(-1, -2) - (go * o).sum(-1, keepdim=True))
        dq[:, :, i0:i1] = ds @ kf * sm_scale
        dk += ds.transpose(-1, -2) @ qi * sm_scale
        dv += p.transpose(-1, -2) @ go
    dk, dv = (t.view(b, hk, hq // hk, nk, -1).sum(2) for t in (dk, dv))
    return tuple(t.to(q.dtype) for t in (dq, dk, dv))


def _refuse_lse_grad(grad_lse: torch.Tensor) -> None:
    if grad_lse.numel() and bool(grad_lse.ne(0).any()):
        raise RuntimeError(NO_LSE_GRAD)


def _dense_backward(
    grad_out: torch.Tensor, grad_lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    attn_mask: Optional[torch.Tensor], tensor_layout: str, is_causal: bool, causal_offset: int, sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _refuse_lse_grad(grad_lse)
    hnd = [to_hnd(t, tensor_layout) for t in (grad_out, q, k, v)]
    grads = exact_grads(*hnd, attn_mask, is_causal, causal_offset, sm_scale)
    return tuple(to_hnd(g, tensor_layout).contiguous() for g in grads)


dense_backward = torch.library.custom_op("sageattention::dense_backward", _dense_backward, mutates_args=())


@dense_backward.register_fake
def _dense_backward_fake(grad_out, grad_lse, q, k, v, attn_mask, tensor_layout, is_causal, causal_offset, sm_scale):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _varlen_backward(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor, is_causal: bool, sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed q [total_q, H, D], k/v [total_k, HK, D]: sequence by sequence (host syncs for the bounds)."""
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for q0, q1, k0, k1 in zip(cq, cq[1:], ck, ck[1:]):
        if q1 == q0 or k1 == k0:  # no queries, or no keys (those rows are 0): no gradient
            continue
        seq = [t[a:b].transpose(0, 1).unsqueeze(0) for t, a, b in
               ((grad_out, q0, q1), (q, q0, q1), (k, k0, k1), (v, k0, k1))]  # [1, H, n, D] views
        for g, dst, a, b in zip(exact_grads(*seq, None, is_causal, 0, sm_scale), (dq, dk, dv),
                                (q0, k0, k0), (q1, k1, k1)):
            dst[a:b] = g[0].transpose(0, 1)
    return dq, dk, dv


varlen_backward = torch.library.custom_op("sageattention::varlen_backward", _varlen_backward, mutates_args=())


@varlen_backward.register_fake
def _varlen_backward_fake(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, sm_scale):
    return tuple(torch.empty_like(t) for t in (q, k, v))

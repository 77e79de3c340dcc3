"""Accuracy metrics shared by the sageattn3 tests, and the NaN-filled `torch.empty` that checks coverage."""
import torch


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def rel_l1(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).abs().sum() / ref.double().abs().sum()).item()


def rmse(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double() - ref.double()).pow(2).mean().sqrt().item()


def sdpa_float64(q, k, v, is_causal=False, sm_scale=None, attn_mask=None):
    """Exact attention in float64, HND, with GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k, v, attn_mask=attn_mask,
                                                            is_causal=is_causal, scale=sm_scale)


def poisoned_empty(*shape, **kwargs):
    """Stands in for torch.empty: every output element a kernel fails to write stays NaN and fails the comparison."""
    return torch.full(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape,
                      float("nan"), **kwargs)

"""The LSE contract, through the merge functions of the sequence-parallel engines that rely on it.

Ring attention runs the local queries against one block of K/V at a time and merges the partial outputs by their
LSE (natural log, fp32, [B, Hq, Nq], corrected for K smoothing). Here the key blocks get different per-channel biases,
so an LSE without the smoothing correction would weigh the blocks wrongly. Mergers: PyTorch's ring merger (what
xDiT's ring path, torch's `_templated_ring_attention`, uses) and yunchang's `update_out_and_lse` (skipped unless
yunchang is installed). The merged result must match attention over all keys at one call's accuracy. No process
group is involved: the ring's steps run one after another in this process.
"""
import functools
import importlib

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

import sageattention as sa
from sageattention.flash_attn_compat import flash_attn_forward
from tests.sageattention.helpers import (
    DEVICE, TOL, assert_close, assert_lse_close, lse_tol, make_qkv, sageattn_pv, sdpa_fp32,
)

_TORCH_MERGER_HOMES = ("torch.distributed.tensor.experimental._context_parallel._attention",  # torch >= 2.9
                       "torch.distributed.tensor.experimental._attention")


def merge_torch(parts):
    """PyTorch's ring merger over [(out [B, H, N, D], lse [B, H, N])]; returns (out, lse)."""
    for home in _TORCH_MERGER_HOMES:
        merger_cls = getattr(importlib.import_module(home), "_SDPAMerger", None)
        if merger_cls is not None:
            break
    else:
        pytest.skip("this torch has no _SDPAMerger")
    merger = merger_cls(True, seq_dim=2)
    for out, lse in parts:
        merger.step(out, lse, False)
    return merger.results()


def merge_yunchang(parts):
    """yunchang's update_out_and_lse, which takes out [B, N, H, D] (NHD) and lse [B, H, N]; returns HND (out, lse)."""
    ring = pytest.importorskip("yunchang.ring.utils")
    out = lse = None
    for block_out, block_lse in parts:
        out, lse = ring.update_out_and_lse(out, lse, block_out.transpose(1, 2), block_lse)
    return out.transpose(1, 2), lse.squeeze(-1).transpose(1, 2)


MERGERS = {"torch": merge_torch, "yunchang": merge_yunchang}


def blocked_keys(q, k, v, blocks, seed=0):
    """k with a different per-channel bias on each of `blocks` key blocks (HND)."""
    gen = torch.Generator().manual_seed(seed)
    bias = [4 * torch.randn(k.shape[-1], generator=gen).to(k) for _ in range(blocks)]
    k = torch.cat([kb + b for kb, b in zip(k.chunk(blocks, dim=2), bias)], dim=2)
    return q, k, v


def ring_parts(q, k, v, world, causal, attend):
    """What each rank of a `world`-way ring computes, in one process (HND): rank r's queries attend to its own K/V
    block (causal on the diagonal, where Nq == Nk), then to the blocks of the other ranks (all keys; a causal mask
    skips the later ones). Returns per rank the [(out, lse)] of its steps, in ring order."""
    qs, ks, vs = (t.chunk(world, dim=2) for t in (q, k, v))
    ranks = []
    for r in range(world):
        steps = [attend(qs[r], ks[r], vs[r], causal)]
        for step in range(1, world):
            src = (r - step) % world
            if not (causal and src > r):
                steps.append(attend(qs[r], ks[src], vs[src], False))
        ranks.append(steps)
    return ranks


def check_merged(ranks, merge, q, k, v, causal, tol):
    """Each rank's merged steps against fp32 attention over all keys, at one call's thresholds."""
    out, lse = (torch.cat(x, dim=2) for x in zip(*(merge(steps) for steps in ranks)))
    ref, ref_lse = sdpa_fp32(q, k, v, is_causal=causal)
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    assert_close(out.float(), ref, cos=tol["cos"], rel_l1=tol["l1"], what="merged out")
    assert_lse_close(lse, ref_lse, atol=lse_tol(ref_lse), what="merged lse")


def sageattn_step(q, k, v, causal):
    """xDiT's ring step: sageattn(query, key, value, is_causal=..., return_lse=True) on [B, H, N, D]."""
    return sa.sageattn(q, k, v, is_causal=causal, return_lse=True)


@functools.lru_cache(maxsize=None)
def _cpu_ring(causal):
    q, k, v = blocked_keys(*make_qkv(b=1, hq=4, hk=2, nq=96, d=64, seed=11), blocks=2)
    return (q, k, v), ring_parts(q, k, v, 2, causal, sageattn_step)


@pytest.mark.parametrize("merger", MERGERS)
@pytest.mark.parametrize("causal", [False, True])
def test_ring_merge_equals_full_attention(merger, causal):
    """A 2-way ring with GQA (4 q heads on 2 kv heads), causal or not, merged by each engine's merge function."""
    (q, k, v), ranks = _cpu_ring(causal)
    check_merged(ranks, MERGERS[merger], q, k, v, causal, TOL[sageattn_pv()])


@pytest.mark.parametrize("merger", MERGERS)
def test_merge_with_rows_that_see_no_key(merger):
    """Causal attention over all keys from its two key halves: the first half top-left (query i sees keys j <= i),
    the second bottom-right (causal_lower_right(96, 48): query i sees key 48 + j for j <= i - 48), where the first 48
    rows see no key: out 0 and LSE -inf there, which the merge must leave to the first half."""
    q, k, v = blocked_keys(*make_qkv(b=1, hq=4, hk=2, nq=96, d=64, seed=12), blocks=2)
    (k1, k2), (v1, v2) = k.chunk(2, dim=2), v.chunk(2, dim=2)
    first = sa.sageattn(q, k1, v1, is_causal=True, return_lse=True)
    second = sa.sageattn(q, k2, v2, attn_mask=causal_lower_right(96, 48), return_lse=True)
    assert torch.isneginf(second[1][:, :, :48]).all() and (second[0][:, :, :48] == 0).all()
    assert torch.isfinite(second[1][:, :, 48:]).all()
    check_merged([[first, second]], MERGERS[merger], q, k, v, True, TOL[sageattn_pv()])


# yunchang's SAGE_FP16 and SAGE_FP8 kernels (with its pv_accum_dtype), and sageattn, through the flash-attn ring step
RING_KERNELS = {
    "sageattn": (sa.sageattn, {}, None),
    "fp16_cuda": (sa.sageattn_qk_int8_pv_fp16_cuda, {"pv_accum_dtype": "fp32"}, "fp16"),
    "fp8_cuda": (sa.sageattn_qk_int8_pv_fp8_cuda, {"pv_accum_dtype": "fp32+fp32"}, "fp8"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("merger", MERGERS)
@pytest.mark.parametrize("kernel", RING_KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_ring_merge_on_gpu(kernel, merger, causal):
    """A 4-way ring of 1k-token blocks, bf16, d128, GQA 8/2, each step through flash_attn_forward (yunchang's call)."""
    fn, kwargs, pv = RING_KERNELS[kernel]

    def step(q, k, v, causal):
        out, lse = flash_attn_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, None,
                                      causal=causal, kernel=fn, **kwargs)
        return out.transpose(1, 2), lse

    q, k, v = blocked_keys(*make_qkv(b=1, hq=8, hk=2, nq=4096, d=128, dtype=torch.bfloat16, seed=13,
                                     device=DEVICE), blocks=4)
    check_merged(ring_parts(q, k, v, 4, causal, step), MERGERS[merger], q, k, v, causal, TOL[pv or sageattn_pv()])

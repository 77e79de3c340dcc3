"""Kernel-vs-reference cases shared by the interpreter run (CPU) and the GPU tests."""
import math

import torch

from sage3_metrics import cosine, rel_l1

CASES = [
    dict(shape=(1, 2, 2, 128, 192, 128), causal=False, per_block_mean=True),
    dict(shape=(1, 4, 2, 130, 100, 64), causal=True, per_block_mean=True),    # GQA, ragged lengths
    dict(shape=(2, 1, 1, 256, 256, 64), causal=True, per_block_mean=False),   # two query tiles
]
# Hostile input (issue 18). Under the interpreter only the tl.dot_scaled branch runs these: the decoded
# branch differs in the products alone.
EXTREMES = [
    dict(shape=(1, 2, 1, 200, 70, 64), causal=True, causal_offset=70 - 200),  # bottom-right: 130 rows see no key
    dict(shape=(1, 2, 2, 16, 150, 64), causal=True, causal_offset=150 - 16),  # bottom-right, decoding-like
    dict(shape=(1, 2, 2, 128, 128, 64), causal=False, sm_scale=-0.3),
    dict(shape=(1, 2, 2, 128, 128, 64), causal=False, sm_scale=1e38),         # capped score scale
    dict(shape=(1, 2, 2, 128, 128, 64), causal=False, v_mult=1e-6),
    dict(shape=(1, 2, 2, 128, 128, 64), causal=False, v_mult=6e4),
    dict(shape=(1, 2, 2, 130, 100, 64), causal=True, nan_q=[1, 37]),          # one NaN query row
]


def case_inputs(case, seed, device="cpu"):
    """Gaussian q, k, v (float32); optional: v times v_mult, a NaN in query row nan_q = [head, row]."""
    b, h, h_kv, n_q, n_k, d = case["shape"]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, heads, n, d, generator=g) for heads, n in ((h, n_q), (h_kv, n_k), (h_kv, n_k)))
    if "nan_q" in case:
        q[0, case["nan_q"][0], case["nan_q"][1], 0] = math.nan
    return tuple(t.to(device) for t in (q, k, v * case.get("v_mult", 1.0)))


def case_args(case):
    """(is_causal, sm_scale, causal_offset) as every backend takes them."""
    return case["causal"], case.get("sm_scale", 1 / math.sqrt(case["shape"][-1])), case.get("causal_offset", 0)


def compare(out, lse, ref, ref_lse) -> dict:
    """NaN where the reference has NaN, -inf LSE where it has -inf; metrics over the rest."""
    ok, lse_ok = ~ref.isnan(), ref_lse.isfinite()
    lse_err = ((lse - ref_lse).abs() / ref_lse.abs().clamp(min=1))[lse_ok]
    return dict(cos=cosine(out[ok], ref[ok]), rel_l1=rel_l1(out[ok], ref[ok]),
                lse_err=lse_err.max().item() if lse_err.numel() else 0.0, finite=bool(out[ok].isfinite().all()),
                same_nan=torch.equal(out.isnan(), ref.isnan()) and torch.equal(lse.isnan(), ref_lse.isnan())
                and torch.equal(lse == -math.inf, ref_lse == -math.inf))


def check(r: dict) -> None:
    """Not bit-equal: float32 sums in another order flip a few FP4 roundings of P. A layout or scale bug
    gives a cosine near 0, not 0.999. lse_err is relative above |LSE| = 1."""
    assert r["finite"] and r["same_nan"]
    assert r["cos"] >= 0.999 and r["rel_l1"] <= 0.02 and r["lse_err"] <= 1e-4

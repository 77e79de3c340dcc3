"""The PyTorch reference of the quantized algorithm against exact float64 attention, and the API contract."""
import math

import pytest
import torch

from sage3_metrics import cosine, rel_l1, rmse, sdpa_float64
from sageattn3 import nvfp4, sageattn3_blackwell
from sageattn3.reference import P_ROW_MAX


def _inputs(b, h, h_kv, n_q, n_k, d, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, heads, n, d, generator=g).to(dtype) for heads, n in ((h, n_q), (h_kv, n_k), (h_kv, n_k)))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("b, h, h_kv, n_q, n_k, d", [
    (1, 2, 2, 256, 256, 128),
    (2, 4, 2, 200, 333, 64),   # GQA, lengths off the tile sizes
    (1, 3, 1, 77, 150, 80),    # MQA, head_dim padded to 128
])
def test_reference_vs_float64_attention(b, h, h_kv, n_q, n_k, d, is_causal):
    q, k, v = _inputs(b, h, h_kv, n_q, n_k, d)
    out = sageattn3_blackwell(q, k, v, is_causal=is_causal, backend="reference")
    ref = sdpa_float64(q, k, v, is_causal=is_causal)
    cos, l1 = cosine(out, ref), rel_l1(out, ref)
    print(f"reference vs float64 {b, h, h_kv, n_q, n_k, d} causal={is_causal}: cos={cos:.4f} relL1={l1:.3f} "
          f"rmse={rmse(out, ref):.4f}")
    # Measured 0.980-0.989 on iid N(0, 1) inputs: the NVFP4 rounding of Q and K alone costs ~0.01
    # (see README "Accuracy"); a wrong scale, layout or mask drops the cosine far below this.
    assert cos >= 0.975 and l1 <= 0.25


def test_q_smoothing_recovers_accuracy_on_offset_inputs():
    # Large per-channel offsets shared by all tokens, as real Q and K have.
    q, k, v = _inputs(1, 2, 2, 256, 256, 64, torch.float32)
    g = torch.Generator().manual_seed(1)
    q, k = q + 4 * torch.randn(1, 2, 1, 64, generator=g), k + 4 * torch.randn(1, 2, 1, 64, generator=g)
    q, k, v = (t.half() for t in (q, k, v))
    ref = sdpa_float64(q, k, v)
    smoothed = cosine(sageattn3_blackwell(q, k, v, backend="reference"), ref)
    unsmoothed = cosine(sageattn3_blackwell(q, k, v, per_block_mean=False, backend="reference"), ref)
    print(f"offset inputs: cos with per-block Q mean {smoothed:.4f}, without {unsmoothed:.4f}")
    assert smoothed >= 0.99 and smoothed > unsmoothed + 0.01


def _best_scale_nvfp4(x: torch.Tensor) -> torch.Tensor:
    """NVFP4 round trip of x along its last dim with the best float32 scale per 16 elements, searched over
    amax/6 * 2^(i/8) for i in -11..1: a bound on what any choice of group scales could reach."""
    amax = x.reshape(*x.shape[:-1], -1, nvfp4.GROUP).abs().amax(dim=-1)
    best, best_err = None, None
    for i in range(-11, 2):
        scale = amax / nvfp4.E2M1_MAX * 2 ** (i / 8)
        y = nvfp4.dequantize(nvfp4.encode(x, scale), scale)
        err = (y - x).pow(2).reshape(scale.shape + (nvfp4.GROUP,)).sum(dim=-1).repeat_interleave(nvfp4.GROUP, dim=-1)
        best = y if best is None else torch.where(err < best_err, y, best)
        best_err = err if best_err is None else torch.minimum(err, best_err)
    return best


def test_gaussian_accuracy_is_at_the_nvfp4_bound():
    """The issue asks for cosine >= 0.99 on random inputs. On iid N(0, 1) inputs no choice of NVFP4 group scales
    gets there: quantizing Q, K, P and V with the best float32 scale per group (searched) gives 0.985. Our
    quantizers (amax / 6 in e4m3) must stay within 0.005 of that bound; model-like random inputs (per-channel
    offsets, test_q_smoothing_recovers_accuracy_on_offset_inputs) do reach >= 0.99."""
    q, k, v = (t.float() for t in _inputs(1, 4, 4, 256, 512, 128))
    ref = sdpa_float64(q, k, v)
    p = torch.softmax(_best_scale_nvfp4(q) @ _best_scale_nvfp4(k).transpose(2, 3) / math.sqrt(128), dim=-1)
    row_max = p.amax(dim=-1, keepdim=True) / P_ROW_MAX
    v_q = _best_scale_nvfp4(v.transpose(2, 3)).transpose(2, 3)
    bound = cosine(_best_scale_nvfp4(p / row_max) * row_max @ v_q, ref)
    ours = cosine(sageattn3_blackwell(q.half(), k.half(), v.half(), backend="reference"), ref)
    print(f"iid N(0, 1): ours {ours:.4f}, NVFP4 with searched float32 group scales {bound:.4f}")
    assert bound < 0.99 and ours >= bound - 0.005


def test_lse_is_the_logsumexp_of_the_scaled_scores():
    q, k, v = _inputs(1, 2, 1, 100, 130, 64, torch.bfloat16)
    k = k + 3  # the K-smoothing shift must be added back to the LSE
    scale = 0.1
    _, lse = sageattn3_blackwell(q, k, v, is_causal=True, sm_scale=scale, return_lse=True, backend="reference")
    s = scale * (q.double() @ k.double().repeat_interleave(2, dim=1).transpose(2, 3))
    s = s.masked_fill(torch.ones(100, 130, dtype=torch.bool).triu(1), -math.inf)
    err = (lse - torch.logsumexp(s, dim=-1)).abs()
    assert lse.shape == (1, 2, 100) and lse.dtype == torch.float32
    assert err.mean() < 0.05 and err.max() < 0.5


def test_inputs_are_not_modified_and_layouts_agree():
    q, k, v = _inputs(1, 2, 2, 64, 64, 64)
    copies = [t.clone() for t in (q, k, v)]
    hnd = sageattn3_blackwell(q, k, v, backend="reference")
    nhd = sageattn3_blackwell(*(t.transpose(1, 2) for t in (q, k, v)), tensor_layout="NHD", backend="reference")
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), copies))
    assert hnd.dtype == q.dtype and hnd.shape == q.shape
    assert torch.equal(nhd.transpose(1, 2), hnd)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(attn_mask=torch.ones(64, 64, dtype=torch.bool)), ValueError, "attn_mask must be None or a causal mask"),
    (dict(tensor_layout="BHSD"), ValueError, "tensor_layout must be"),
    (dict(backend="fast"), ValueError, "backend must be one of"),
    (dict(), ValueError, "need CUDA tensors"),  # backend="auto" on CPU
])
def test_bad_arguments_raise_clear_errors(kwargs, error, match):
    q, k, v = _inputs(1, 2, 2, 64, 64, 64)
    with pytest.raises(error, match=match):
        sageattn3_blackwell(q, k, v, **kwargs)


@pytest.mark.parametrize("shapes, dtype, error, match", [
    (((1, 2, 8, 256),) * 3, torch.float16, ValueError, "head_dim 256 is not supported"),
    (((1, 2, 8, 64),) * 3, torch.float32, TypeError, "float16 or bfloat16"),
    (((1, 3, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), torch.float16, ValueError, "multiple of k/v heads"),
    (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 9, 64)), torch.float16, ValueError, "same shape"),
    (((2, 8, 64),) * 3, torch.float16, ValueError, "must be 4-D"),
])
def test_bad_tensors_raise_clear_errors(shapes, dtype, error, match):
    q, k, v = (torch.zeros(s, dtype=dtype) for s in shapes)
    with pytest.raises(error, match=match):
        sageattn3_blackwell(q, k, v, backend="reference")

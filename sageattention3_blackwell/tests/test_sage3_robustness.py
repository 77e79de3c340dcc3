"""Hostile input to sageattn3_blackwell (issue 18): sm_scale of any size, gradients, numeric extremes,
NaN/inf, degenerate shapes and causal alignment. The PyTorch reference backend runs here; the Triton
kernel runs the same cases under the interpreter (test_sage3_triton_interpreter.py) and on a GPU."""
import math

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from sage3_metrics import cosine, sdpa_float64
from sageattn3 import sageattn3_blackwell
from sageattn3.core import NO_BACKWARD
from sageattn3.prepare import kernel_scales, quantize_inputs


def _randn(*shape, seed=0, scale=1.0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _qkv(n_q=200, n_k=150, d=64, h=2, dtype=torch.float16, seed=0):
    return _randn(1, h, n_q, d, seed=seed, dtype=dtype), _randn(1, h, n_k, d, seed=seed + 1, dtype=dtype), \
        _randn(1, h, n_k, d, seed=seed + 2, dtype=dtype)


def _argmax_qkv(magnitude=1.0, dtype=torch.float16, n_q=130, n_k=100, d=64):
    """Every query is a copy of one key, so its score against that key (|k|^2 ~ d) stands far above the
    others (~N(0, d)): at a huge scale exact attention returns V of that key, whatever the FP4 rounding."""
    k = _randn(1, 1, n_k, d, seed=3, dtype=torch.float32)
    pick = torch.randint(0, n_k, (n_q,), generator=torch.Generator().manual_seed(4))
    q = k[:, :, pick]
    v = _randn(1, 1, n_k, d, seed=5, dtype=dtype)
    return (q * magnitude).to(dtype), (k * magnitude).to(dtype), v, v[:, :, pick]


def _run(q, k, v, **kwargs):
    return sageattn3_blackwell(q, k, v, backend="reference", **kwargs)


# ---- sm_scale: any finite value gives exact attention's result ----

@pytest.mark.parametrize("sm_scale", [-0.125, -1 / 3, 1e-30, 0.0])
def test_negative_tiny_and_zero_sm_scale_match_exact_attention(sm_scale):
    q, k, v = _qkv()
    out = _run(q, k, v, sm_scale=sm_scale)
    cos = cosine(out, sdpa_float64(q, k, v, sm_scale=sm_scale))
    print(f"sm_scale={sm_scale}: cos={cos:.4f}")
    # |sm_scale| = 1/3 sharpens the softmax, which costs FP4 accuracy at either sign (0.971 at +1/3).
    assert out.isfinite().all() and cos >= (0.975 if abs(sm_scale) <= 0.125 else 0.96)


@pytest.mark.parametrize("sm_scale", [-0.125, -2.0])
def test_negative_sm_scale_is_the_mirror_of_a_positive_one(sm_scale):
    # NVFP4 rounding and smoothing are odd functions, so scale -s on q equals scale s on -q bit for bit.
    q, k, v = _qkv()
    assert torch.equal(_run(q, k, v, sm_scale=sm_scale), _run(-q, k, v, sm_scale=-sm_scale))


def test_an_int_sm_scale_is_a_float_one():
    q, k, v = _qkv()
    assert torch.equal(_run(q, k, v, sm_scale=1), _run(q, k, v, sm_scale=1.0))


@pytest.mark.parametrize("sm_scale", [1e30, 1e38, torch.finfo(torch.float32).max])
def test_huge_sm_scale_gives_hard_attention_not_nan(sm_scale):
    q, k, v, expected = _argmax_qkv()
    out = _run(q, k, v, sm_scale=sm_scale)
    assert out.isfinite().all()
    assert cosine(out, expected) >= 0.98 and cosine(out, sdpa_float64(q, k, v, sm_scale=sm_scale)) >= 0.98


def test_lse_stays_exact_when_the_score_scale_is_capped():
    # At sm_scale 1e36 the scaled scores would exceed what the online softmax can hold in float32: the
    # scale is capped (prepare.kernel_scales) and the LSE multiplied back. At 1e30 nothing is capped.
    # Both are hard attention, where the LSE is sm_scale times the row's largest score.
    q, k, v, _ = _argmax_qkv()
    qi = quantize_inputs(q, k, v)
    assert kernel_scales(qi, 1e36)[1] > 5 and kernel_scales(qi, 1e30)[1] == 1
    _, capped = _run(q, k, v, sm_scale=1e36, return_lse=True)
    _, uncapped = _run(q, k, v, sm_scale=1e30, return_lse=True)
    assert capped.isfinite().all()
    assert torch.allclose(capped / 1e36, uncapped / 1e30, rtol=1e-5)
    exact = torch.logsumexp(1e36 * (q.double() @ k.double().transpose(2, 3)), dim=-1)
    assert ((capped.double() - exact).abs() / exact).max() < 0.15  # FP4 rounding of the largest score


@pytest.mark.parametrize("sm_scale, error, match", [
    (math.inf, ValueError, "sm_scale must be finite"),
    (math.nan, ValueError, "sm_scale must be finite"),
    (1e39, ValueError, "at most 3.40282e\\+38"),
    ("0.1", TypeError, "sm_scale must be a real number .* got str"),
    (torch.tensor(0.1), TypeError, "got Tensor \\(for a one-element tensor pass float\\(t\\)\\)"),
    (True, TypeError, "got bool"),
])
def test_unusable_sm_scale_raises_a_clear_error(sm_scale, error, match):
    with pytest.raises(error, match=match):
        _run(*_qkv(), sm_scale=sm_scale)


# ---- gradients: refused, eager and compiled alike ----

def _leaf_qkv():
    return tuple(t.requires_grad_() for t in _qkv(n_q=64, n_k=64))


@pytest.mark.parametrize("through", ["out", "lse"])
def test_backward_raises_instead_of_returning_wrong_gradients(through):
    q, k, v = _leaf_qkv()
    out, lse = _run(q, k, v, return_lse=True)
    with torch.no_grad():
        assert torch.equal(out, _run(q, k, v))  # the forward is the same with or without autograd
    loss = (out.float().sum() + q.float().sum()) if through == "out" else lse.sum()
    with pytest.raises(RuntimeError) as err:
        loss.backward()
    assert str(err.value) == NO_BACKWARD and "torch.no_grad()" in NO_BACKWARD
    assert all(t.grad is None for t in (q, k, v))


def test_compiled_call_refuses_backward_like_eager():
    q, k, v = _leaf_qkv()
    compiled = torch.compile(lambda q, k, v: _run(q, k, v, sm_scale=0.2), backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v)
    assert torch.equal(out, _run(q, k, v, sm_scale=0.2))
    with pytest.raises(RuntimeError, match="has no backward pass"):
        out.float().sum().backward()


# ---- numeric range: per-tensor scales keep tiny and huge tensors ----

@pytest.mark.parametrize("v_scale", [1e-3, 1e-5, 1e-6])
def test_tiny_v_survives(v_scale):
    q, k, _ = _qkv()
    v = _randn(1, 2, 150, 64, seed=9, scale=v_scale)
    out = _run(q, k, v)
    ref = sdpa_float64(q, k, v)
    print(f"V ~ {v_scale}: max |out| {out.abs().max().item():.3g}, exact {ref.abs().max().item():.3g}")
    assert cosine(out, ref) >= 0.975


def test_v_near_the_fp16_maximum_stays_finite_and_unclipped():
    q, k, _ = _qkv()
    constant = torch.full((1, 2, 150, 64), 60000.0, dtype=torch.float16)
    out = _run(q, k, constant).float()
    # Exact: 60000 (before the per-tensor scale: 2668). FP4 rounding of P flushes a row's smallest
    # weights, so the rows come out 0-6.7% low, 1.1% on average (measured); never above V's maximum.
    assert ((out >= 0.92 * 60000) & (out <= 60000)).all() and (out.mean() - 60000).abs() <= 0.015 * 60000
    signs = torch.where(_randn(1, 2, 150, 64, seed=7) > 0, 65504.0, -65504.0).half()
    out = _run(q, k, signs)
    assert out.isfinite().all() and out.abs().max() <= 65504
    assert cosine(out, sdpa_float64(q, k, signs)) >= 0.975


def test_tiny_q_and_k_with_a_large_sm_scale_match_exact_attention():
    q, k, v = _qkv()
    q, k = q * 1e-3, k * 1e-3
    out = _run(q, k, v, sm_scale=1e6 / 8)  # scores as N(0, 1) inputs with the default scale
    assert cosine(out, sdpa_float64(q, k, v, sm_scale=1e6 / 8)) >= 0.975


@pytest.mark.parametrize("magnitude", [3e3, 1e15])
def test_huge_bf16_q_and_k_give_exact_attentions_result(magnitude):
    q, k, v, expected = _argmax_qkv(magnitude, torch.bfloat16)
    exact32 = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert exact32.isfinite().all()  # the case the issue names: float32 SDPA is finite
    out = _run(q, k, v)
    assert out.isfinite().all() and cosine(out, expected) >= 0.98


# ---- NaN and inf propagate per row / channel, as SDPA's exact math ----

def test_nan_query_row_gives_a_nan_output_row_only():
    q, k, v = _qkv()
    q[0, 1, 37, 5] = math.nan
    out = _run(q, k, v)
    assert out[0, 1, 37].isnan().all()
    rest = torch.ones(out.shape[:3], dtype=torch.bool)
    rest[0, 1, 37] = False
    assert out[rest].isfinite().all()
    assert cosine(out[rest], sdpa_float64(q, k, v)[rest]) >= 0.975


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_key_reaches_only_the_rows_that_see_it(value):
    q, k, v = _qkv(n_q=150, n_k=150)
    k[0, 0, 100, 3] = value
    out = _run(q, k, v, is_causal=True)
    assert out[0, 0, 100:].isnan().all()              # rows that see key 100
    assert out[0, 0, :100].isfinite().all() and out[0, 1].isfinite().all()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_value_gives_nan_in_its_channel(value):
    # SDPA gives +-inf for an infinite V; NVFP4 has no infinity, so sageattn3 gives NaN (documented).
    q, k, v = _qkv()
    v[0, 0, 20, 9] = value
    out = _run(q, k, v)
    assert out[0, 0, :, 9].isnan().all()
    channel = torch.ones(out.shape, dtype=torch.bool)
    channel[0, 0, :, 9] = False
    assert out[channel].isfinite().all()


# ---- degenerate shapes: SDPA's answer where it has one, else a clear error in the caller's layout ----

@pytest.mark.parametrize("q_shape, kv_shape", [
    ((0, 2, 16, 64), (0, 2, 16, 64)),   # no batch
    ((1, 0, 16, 64), (1, 0, 16, 64)),   # no heads
    ((1, 2, 0, 64), (1, 2, 16, 64)),    # no queries
])
def test_empty_inputs_give_empty_outputs(q_shape, kv_shape):
    q, k, v = torch.zeros(q_shape, dtype=torch.half), torch.zeros(kv_shape, dtype=torch.half), \
        torch.zeros(kv_shape, dtype=torch.half)
    out, lse = _run(q, k, v, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:3]


def test_no_keys_gives_zeros_and_minus_infinite_lse_like_sdpa():
    q, k, v = _qkv(n_k=0)
    out, lse = _run(q, k, v, return_lse=True)
    assert torch.equal(out, sdpa_float64(q, k, v).half()) and not out.any()
    assert (lse == -math.inf).all()


@pytest.mark.parametrize("layout, q_shape, kv_shape, match", [
    ("HND", (1, 2, 8, 0), (1, 2, 8, 0), r"head_dim must be at least 1, got q \(1, 2, 8, 0\)"),
    ("HND", (1, 2, 8, 64), (1, 0, 8, 64), r"q heads \(2\) must be a multiple of k/v heads \(0\)"),
    ("NHD", (1, 8, 3, 64), (1, 8, 2, 64), r"heads \(3\) must be a multiple of k/v heads \(2\).*q \(1, 8, 3, 64\).*NHD"),
    ("NHD", (1, 8, 2, 64), (2, 8, 2, 64), r"q \(1, 8, 2, 64\) and k \(2, 8, 2, 64\) disagree .*NHD \[batch, tokens"),
    ("NHD", (1, 8, 2), (1, 8, 2, 64), r"4-D \(NHD \[batch, tokens, heads, head_dim\]\), got shape \(1, 8, 2\)"),
])
def test_bad_shapes_are_named_in_the_callers_layout(layout, q_shape, kv_shape, match):
    q, k, v = (torch.zeros(s, dtype=torch.half) for s in (q_shape, kv_shape, kv_shape))
    with pytest.raises(ValueError, match=match):
        _run(q, k, v, tensor_layout=layout)


# ---- causal alignment: top-left as SDPA; bottom-right on request ----

@pytest.mark.parametrize("n_q, n_k", [(16, 64), (200, 70), (1, 150)])
def test_is_causal_is_top_left_like_sdpa(n_q, n_k):
    q, k, v = _qkv(n_q, n_k)
    out = _run(q, k, v, is_causal=True)
    assert cosine(out, sdpa_float64(q, k, v, is_causal=True)) >= 0.975
    assert torch.equal(out, _run(q, k, v, attn_mask=causal_upper_left(n_q, n_k)))


@pytest.mark.parametrize("n_q, n_k", [(16, 64), (1, 150), (200, 70)])
def test_causal_lower_right_matches_sdpa(n_q, n_k):
    q, k, v = _qkv(n_q, n_k)
    out, lse = _run(q, k, v, attn_mask=causal_lower_right(n_q, n_k), return_lse=True)
    ref = sdpa_float64(q, k, v, attn_mask=causal_lower_right(n_q, n_k))
    assert cosine(out, ref) >= 0.975
    hidden = max(n_q - n_k, 0)  # the first Nq - Nk queries see no key: 0, LSE -inf (as SDPA: 0)
    assert not out[:, :, :hidden].any() and (lse[:, :, :hidden] == -math.inf).all()
    assert lse[:, :, hidden:].isfinite().all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(attn_mask=causal_lower_right(200, 150), is_causal=True), "either is_causal=True or a causal attn_mask"),
    (dict(attn_mask=causal_lower_right(150, 200)), "is for 150 queries and 200 keys, but q has 200 tokens and k 150"),
])
def test_causal_mask_misuse_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _run(*_qkv(), **kwargs)

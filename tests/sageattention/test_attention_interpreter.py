"""Every public function through the Triton kernels (interpreter on CPU) vs the reference and float64."""
import math
import zlib

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import sageattention as sa
from sageattention import reference
from sageattention.inputs import to_hnd
from tests.sageattention.helpers import (
    DEVICE, MASK_VARIANTS, SAGEATTN_TRITON, TOL, VARIANT_IDS, VARIANTS, assert_close, assert_lse_close, check_per_sequence,
    check_variant_vs_fp32, check_variant_vs_reference, fp64_out, make_qkv, oracle_args, packed_varlen, reference_out,
    sdpa_fp32, skip_bf16_pv16, variant,
)

SAGEATTN = variant("sageattn")
FP16_CUDA = variant("fp16_cuda-fp32")


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_variant_gqa(var, layout, is_causal):
    """GQA (4 q heads on 2 kv heads), lengths not multiples of any block, q shorter than k."""
    # a seed per case that every process agrees on (hash() of strings changes with PYTHONHASHSEED)
    seed = zlib.crc32(f"{var.name}-{layout}".encode()) % 1000
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=70, nk=100, d=64, layout=layout, seed=seed)
    check_variant_vs_reference(var, q, k, v, layout, is_causal=is_causal)


@pytest.mark.parametrize("var", [SAGEATTN, FP16_CUDA], ids=lambda v: v.name)
@pytest.mark.parametrize("d", [32, 96, 128, 160, 256])
def test_head_dims(var, d):
    q, k, v = make_qkv(hq=2, nq=40, nk=45, d=d, seed=d)
    check_variant_vs_reference(var, q, k, v, is_causal=d % 64 == 0)


@pytest.mark.parametrize("nq,nk", [(1, 1), (1, 77), (77, 1), (33, 65)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_short_and_mqa(nq, nk, is_causal):
    """Sequence length 1, MQA (1 kv head), batch 1, causal with nq > nk (leading rows see no key)."""
    q, k, v = make_qkv(b=1, hq=3, hk=1, nq=nq, nk=nk, d=64, seed=nq * 100 + nk, layout="NHD")
    check_variant_vs_reference(SAGEATTN, q, k, v, "NHD", is_causal=is_causal)


@pytest.mark.parametrize("var", [SAGEATTN, FP16_CUDA], ids=lambda v: v.name)
@pytest.mark.parametrize("nq,nk", [(16, 64), (40, 100), (100, 40)])
def test_is_causal_is_top_left_like_sdpa(var, nq, nk):
    """is_causal=True means what it means for scaled_dot_product_attention (top-left) at any Nq, Nk."""
    q, k, v = make_qkv(hq=2, nq=nq, nk=nk, d=64, seed=nq + nk)
    out = var(q, k, v, is_causal=True)[0]
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert_close(out.float(), sdpa, cos=TOL[var.pv]["cos"], rel_l1=TOL[var.pv]["l1"])


@pytest.mark.parametrize("var", [SAGEATTN, variant("fp16_triton")], ids=lambda v: v.name)
@pytest.mark.parametrize("nq,nk", [(40, 100), (100, 40)])
@pytest.mark.parametrize("bias", [causal_lower_right, causal_upper_left], ids=lambda f: f.__name__)
def test_causal_mask_objects(var, nq, nk, bias):
    """torch.nn.attention.bias masks choose the alignment; bottom-right rows that see no key give 0, LSE -inf."""
    q, k, v = make_qkv(hq=2, nq=nq, nk=nk, d=64, seed=nq + nk, layout="NHD")
    out, lse = var(q, k, v, "NHD", attn_mask=bias(nq, nk), return_lse=True)
    offset = nk - nq if bias is causal_lower_right else 0
    ref, ref_lse = sdpa_fp32(q, k, v, "NHD", is_causal=True, causal_offset=offset)
    seen = torch.isfinite(ref_lse)  # [B, H, Nq]: rows with at least one key (SDPA gives NaN for the others)
    out_h, ref_h = to_hnd(out, "NHD"), to_hnd(ref, "NHD")
    assert_close(out_h[seen].float(), ref_h[seen], cos=TOL[var.pv]["cos"], rel_l1=TOL[var.pv]["l1"])
    assert (out_h[~seen] == 0).all() and torch.isneginf(lse[~seen]).all()
    assert seen.all() == (offset >= 0)


def test_causal_mask_object_errors():
    q, k, v = make_qkv(hq=2, nq=40, nk=100, d=64)
    with pytest.raises(ValueError, match="not both"):
        sa.sageattn(q, k, v, is_causal=True, attn_mask=causal_lower_right(40, 100))
    with pytest.raises(ValueError, match="is for 100 queries and 40 keys"):
        sa.sageattn(q, k, v, attn_mask=causal_lower_right(100, 40))


@pytest.mark.parametrize("var", MASK_VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", ["nq_nk", "b_1_nq_nk", "1_h_1_nk"])
def test_attn_mask(var, kind, shape):
    b, h, nq, nk = 2, 2, 50, 80
    q, k, v = make_qkv(b=b, hq=h, nq=nq, nk=nk, d=64, seed=21, layout="NHD")
    full = {"nq_nk": (nq, nk), "b_1_nq_nk": (b, 1, nq, nk), "1_h_1_nk": (1, h, 1, nk)}[shape]
    gen = torch.Generator().manual_seed(22)
    keep = torch.rand(full, generator=gen) > 0.3
    keep[..., 0] = True
    if kind == "bool":
        mask = keep
    else:
        mask = torch.where(keep, 2 * torch.randn(full, generator=gen), -math.inf).to(q.dtype)
    check_variant_vs_reference(var, q, k, v, "NHD", attn_mask=mask.to(DEVICE))


def test_attn_mask_fully_masked_rows_and_causal():
    q, k, v = make_qkv(hq=2, nq=60, nk=60, d=32, seed=23)
    mask = torch.ones(60, 60, dtype=torch.bool, device=DEVICE)
    mask[[0, 31, 59]] = False
    out, lse = sa.sageattn(q, k, v, attn_mask=mask, is_causal=True, return_lse=True)
    assert torch.isfinite(out).all()
    assert (out[:, :, [0, 31, 59]] == 0).all() and torch.isneginf(lse[:, :, [0, 31, 59]]).all()
    check_variant_vs_reference(SAGEATTN, q, k, v, attn_mask=mask, is_causal=True)


@pytest.mark.parametrize("var", [SAGEATTN, variant("fp16_triton"), variant("fp8_cuda-fp32+fp16")],
                         ids=lambda v: v.name)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_bf16(var, layout):
    skip_bf16_pv16(var, torch.bfloat16)
    q, k, v = make_qkv(hq=2, nq=64, nk=90, d=64, dtype=torch.bfloat16, layout=layout, seed=24)
    check_variant_vs_reference(var, q, k, v, layout)


@pytest.mark.parametrize("var", [variant("fp16_cuda-fp16+fp32"), variant("fp8_cuda-fp32")], ids=lambda v: v.name)
def test_smoothing_options_and_sm_scale(var):
    q, k, v = make_qkv(hq=2, nq=64, nk=64, d=64, seed=25, k_bias=8.0)
    v = v + 2
    check_variant_vs_reference(var, q, k, v, smooth_v=True, sm_scale=0.3)
    out_raw = var(q, k, v, smooth_k=False)[0]
    out = var(q, k, v)[0]
    exact = fp64_out(q, k, v)[0]
    assert_close(out_raw, reference.sage_attention_reference(q, k, v, pv_dtype=var.pv, qk_quant_gran=var.gran,
                                                              smooth_k=False)[0],
                 cos=TOL[var.pv]["ref_cos"], rel_l1=TOL[var.pv]["ref_l1"], what="smooth_k=False vs reference")
    assert_close(out, exact, cos=TOL[var.pv]["cos"], rel_l1=TOL[var.pv]["l1"])


def test_output_layout_follows_input():
    """NHD in -> NHD out (same shape as q), contiguous or transposed-view inputs alike."""
    for contiguous in (False, True):
        q, k, v = make_qkv(hq=3, nq=20, nk=30, d=32, layout="NHD", contiguous=contiguous, seed=26)
        out = sa.sageattn(q, k, v, tensor_layout="NHD")
        assert out.shape == (1, 20, 3, 32) and out.dtype == torch.float16
        assert_close(to_hnd(out, "NHD"), to_hnd(fp64_out(q, k, v, "NHD")[0], "NHD"),
                     cos=TOL["fp8"]["cos"], rel_l1=TOL["fp8"]["l1"])


def test_matches_sdpa_fp32_helper():
    """The GPU tests' oracle (helpers.sdpa_fp32) agrees with float64 attention: GQA, causal, nq != nk."""
    q, k, v = make_qkv(hq=4, hk=2, nq=30, nk=50, d=32, seed=27, layout="NHD")
    out, lse = sdpa_fp32(q, k, v, "NHD", is_causal=True)
    exact, exact_lse = fp64_out(q, k, v, "NHD", is_causal=True)
    assert_close(out, exact, cos=0.99999, rel_l1=1e-4)
    assert_lse_close(lse, exact_lse, atol=1e-4)


# ---------------------------------------------------------------- varlen

@pytest.mark.parametrize("is_causal", [False, True])
def test_varlen(is_causal):
    lens_q, lens_k = [37, 1, 90], [50, 64, 90]
    q, k, v, cu_q, cu_k = packed_varlen(lens_q, lens_k, seed=int(is_causal))
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=is_causal)
    check_per_sequence(out, q, k, v, cu_q, cu_k, is_causal)


def test_varlen_k_bias_is_smoothed_per_sequence():
    q, k, v, cu_q, cu_k = packed_varlen([30, 40], [30, 40], seed=3)
    k[:30] += 10  # different bias per sequence: a global mean would leave one of them biased
    k[30:] -= 10
    check_per_sequence(sa.sageattn_varlen(q, k, v, cu_q, cu_k, 40, 40), q, k, v, cu_q, cu_k)


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_fp32_sdpa_check_on_cpu(var):
    """The GPU tests' check (helpers.check_variant_vs_fp32) on small CPU inputs: random and K-bias/Q-outlier."""
    q, k, v = make_qkv(hq=4, hk=2, nq=60, nk=90, d=64, seed=28, layout="NHD")
    check_variant_vs_fp32(var, q, k, v, "NHD", is_causal=True)
    q, k, v = make_qkv(hq=2, nq=64, d=128, seed=29, k_bias=20.0, q_outlier=5.0)
    kw = {"qk_quant_gran": "per_thread"} if "qk_quant_gran" in var.kwargs else {}  # as test_gpu.py
    check_variant_vs_fp32(var, q, k, v, tol=TOL["fp8"] if var.gran == "per_block" and not kw else None, **kw)


@pytest.mark.parametrize("var", [SAGEATTN_TRITON, variant("fp16_triton")], ids=lambda v: v.name)
@pytest.mark.parametrize("d", [64, 80, 72])
def test_tma_and_pointer_loads_agree(var, d, monkeypatch):
    """K/V through TMA descriptors (sm90+, and the interpreter) and through pointers (older GPUs, varlen,
    misaligned strides: d=72 int8 rows are not 16-byte multiples) both match the reference, padding included;
    under the interpreter (one tile config for both) they give the same bits. On a GPU the autotuner may pick
    other tiles for each path, which sums in another order."""
    from sageattention.triton import attention as attn_kernel

    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=70, nk=100, d=d, layout="NHD", seed=d)
    made = []
    descriptors = attn_kernel._descriptors
    monkeypatch.setattr(attn_kernel, "_descriptors", lambda *a: made.append(descriptors(*a)) or made[-1])
    check_variant_vs_reference(var, q, k, v, "NHD", is_causal=True, what="TMA loads")
    assert [m is not None for m in made] == ([d % 16 == 0] if attn_kernel._use_tma(q.device) else [])
    via_tma = var(q, k, v, "NHD", is_causal=True, return_lse=True)
    monkeypatch.setattr(attn_kernel, "_use_tma", lambda device: False)
    check_variant_vs_reference(var, q, k, v, "NHD", is_causal=True, what="pointer loads")
    via_pointers = var(q, k, v, "NHD", is_causal=True, return_lse=True)
    if DEVICE.type == "cpu":
        for a, b in zip(via_tma, via_pointers):
            assert torch.equal(a, b)


def test_tuned_config_is_launched_directly(monkeypatch):
    """Once the autotuner has picked a config for a tuning key, later calls launch that config directly (the
    autotuner's own launch path costs tens of microseconds of host time per call), with the same bits."""
    from triton.runtime.autotuner import Autotuner

    from sageattention.triton import attention as attn_kernel

    q, k, v = make_qkv(hq=2, nq=70, nk=90, d=64, seed=43)
    monkeypatch.setattr(attn_kernel, "_tuned", {})
    tuned = SAGEATTN_TRITON(q, k, v, is_causal=True)[0]
    assert len(attn_kernel._tuned) == 1
    monkeypatch.setattr(Autotuner, "run", lambda *a, **kw: pytest.fail("launched through the autotuner"))
    direct = SAGEATTN_TRITON(q, k, v, is_causal=True)[0]
    assert torch.equal(tuned, direct)


@pytest.mark.parametrize("scale,redone", [(1.0, False), (300.0, True)])
def test_coarse_exponent_offsets_are_redone(scale, redone, monkeypatch):
    """With the one-FMA exponent, a program whose rows get an offset 1.5 * 2**23 * c + e on too coarse a grid (|q|, |k|
    in the hundreds) recomputes its rows in two steps: with large inputs the output equals redoing every row, with
    ordinary ones it equals redoing none; the two ways give different bits."""
    from sageattention.triton import attention as attn_kernel

    q, k, v = make_qkv(hq=2, nq=100, nk=150, d=64, seed=41)
    q, k = (q.float() * scale).half(), (k.float() * scale).half()

    def run(threshold):
        monkeypatch.setattr(attn_kernel, "REDO_ABOVE", threshold)
        return SAGEATTN_TRITON(q, k, v, return_lse=True)

    default = run(attn_kernel.REDO_ABOVE)
    every, none = run(0.0), run(float("inf"))
    assert not torch.equal(every[0], none[0])
    for got, want in zip(default, every if redone else none):
        assert torch.equal(got, want)
    # Scores ~1e5 make softmax an argmax that INT8 rounding moves, so the oracle is the quantized reference.
    ref, ref_lse = reference_out(q, k, v, pv=SAGEATTN_TRITON.pv, **oracle_args(SAGEATTN_TRITON, q))
    assert_close(default[0].cpu(), ref, cos=TOL["fp8"]["ref_cos"], rel_l1=TOL["fp8"]["ref_l1"])
    assert_lse_close(default[1], ref_lse, atol=1e-4 * ref_lse.abs().max().item())

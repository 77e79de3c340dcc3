"""GPU tests (H100/H200): every public function vs fp32 SDPA at the spec's thresholds, real Triton kernels.

Run: python -m pytest tests/sageattention/test_gpu.py -q   (skipped without CUDA; the same checks run on CPU under the
interpreter in test_attention_interpreter.py::test_fp32_sdpa_check_on_cpu).
"""
import pytest
import torch

import sageattention as sa
from sageattention import dispatch
from tests.sageattention.helpers import (
    DEVICE, TOL, VARIANT_IDS, VARIANTS, assert_close, check_variant_vs_fp32, make_qkv, metrics, reference_out,
    runs_here, sdpa_fp32, variant, oracle_args,
)

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # _cuda -> Triton notice


def _need(var):
    if not runs_here(var):
        pytest.skip("sm90-only kernel on another GPU (test_sm90_variant_elsewhere_raises covers it)")


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("layout,is_causal,d", [("HND", False, 64), ("NHD", True, 128), ("HND", True, 80),
                                                ("NHD", False, 128)])
def test_vs_sdpa_random(var, layout, is_causal, d):
    _need(var)
    q, k, v = make_qkv(b=2, hq=8, hk=2, nq=700, nk=1000, d=d, layout=layout, seed=d)
    check_variant_vs_fp32(var, q, k, v, layout, is_causal=is_causal)


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_vs_sdpa_k_bias_q_outliers(var, layout):
    """K with a large per-channel bias (removed by smoothing), Q with 4 outlier channels x5. Per-block Q scales
    (128 tokens) reach cos 0.99944 / rel L1 0.033 here even in the exact reference: they get the spec's base
    bounds (cos >= 0.999, rel L1 <= 0.05), not the tighter FP16 ones."""
    _need(var)
    q, k, v = make_qkv(b=1, hq=8, hk=4, nq=1024, d=128, layout=layout, seed=5, k_bias=20.0, q_outlier=5.0)
    # Coarser explicit granularities (per_warp / per_block chosen in helpers.VARIANTS) miss the bounds by
    # ~1e-4 here, as the reference does: test the variants' per-thread default where they take one.
    kw = {"qk_quant_gran": "per_thread"} if "qk_quant_gran" in var.kwargs else {}
    tol = TOL["fp8"] if var.gran == "per_block" and not kw else None
    check_variant_vs_fp32(var, q, k, v, layout, is_causal=True, tol=tol, **kw)


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_q_outliers_x30_as_accurate_as_the_algorithm(var):
    """Q channels x30: INT8 per-token Q loses the small channels, so even the exact quantized algorithm
    (the reference) misses 0.999; the kernel must be as accurate as the reference."""
    _need(var)
    q, k, v = make_qkv(b=1, hq=2, nq=512, d=128, seed=6, k_bias=20.0, q_outlier=30.0)
    out = var(q, k, v)[0]
    ref = reference_out(q, k, v, pv=var.pv, **oracle_args(var, q))[0]
    sdpa = sdpa_fp32(q, k, v)[0].cpu()
    got, want = metrics(out.cpu(), sdpa), metrics(ref, sdpa)
    assert got["cos"] >= want["cos"] - 5e-4 and got["rel_l1"] <= want["rel_l1"] * 1.1 + 0.005, (got, want)


@pytest.mark.parametrize("var", [variant("sageattn"), variant("fp16_triton"), variant("fp8_cuda-fp32+fp16")],
                         ids=lambda v: v.name)
def test_bf16(var):
    q, k, v = make_qkv(b=2, hq=4, nq=800, d=128, dtype=torch.bfloat16, seed=7)
    check_variant_vs_fp32(var, q, k, v, "HND", is_causal=True)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_attn_mask(kind):
    nq, nk = 300, 500
    q, k, v = make_qkv(b=2, hq=4, nq=nq, nk=nk, d=64, seed=8, layout="NHD")
    gen = torch.Generator().manual_seed(9)
    keep = torch.rand(2, 1, nq, nk, generator=gen) > 0.3
    mask = keep if kind == "bool" else torch.where(keep, torch.randn(keep.shape, generator=gen), -float("inf")).half()
    check_variant_vs_fp32(variant("sageattn"), q, k, v, "NHD", attn_mask=mask.to(DEVICE))
    check_variant_vs_fp32(variant("fp16_triton"), q, k, v, "NHD", attn_mask=mask.to(DEVICE))


@pytest.mark.parametrize("is_causal", [False, True])
def test_varlen_vs_sdpa(is_causal):
    lens_q, lens_k = [100, 1, 517, 64], [300, 50, 517, 1]
    gen = torch.Generator().manual_seed(10)
    q = torch.randn(sum(lens_q), 8, 128, generator=gen).half().to(DEVICE)
    k = torch.randn(sum(lens_k), 2, 128, generator=gen).half().to(DEVICE)
    v = torch.randn(sum(lens_k), 2, 128, generator=gen).half().to(DEVICE)
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
          for n in (lens_q, lens_k)]
    out = sa.sageattn_varlen(q, k, v, cu[0], cu[1], max(lens_q), max(lens_k), is_causal=is_causal)
    for i in range(len(lens_q)):
        sq, sk = slice(cu[0][i], cu[0][i + 1]), slice(cu[1][i], cu[1][i + 1])
        want = sdpa_fp32(q[sq][None], k[sk][None], v[sk][None], "NHD", is_causal=is_causal)[0][0]
        seen = torch.isfinite(want).all(dim=-1).all(dim=-1)  # rows with a visible key
        assert_close(out[sq][seen].float(), want[seen], cos=TOL["fp16"]["cos"], rel_l1=TOL["fp16"]["l1"],
                     what=f"sequence {i}")


def test_sm90_variant_elsewhere_raises():
    cap = torch.cuda.get_device_capability()
    if cap == (9, 0):
        pytest.skip("this is an sm90 GPU")
    with pytest.raises(RuntimeError, match=f"sm{cap[0]}{cap[1]}.*supported: sm90"):
        sa.sageattn_qk_int8_pv_fp8_cuda_sm90(*make_qkv(hq=2, nq=128, d=64))


def test_sageattn_uses_fp8_pv_on_sm89_plus():
    cap = torch.cuda.get_device_capability()
    assert dispatch.default_pv_fp8(cap) == (cap >= (8, 9))


def test_torch_compile_fullgraph():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64, dtype=torch.float16, device=DEVICE)

        def forward(self, q, k, v):
            return self.proj(sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=True))

    torch._dynamo.reset()
    model = Block()
    q, k, v = make_qkv(b=2, hq=4, nq=256, d=64, layout="NHD", contiguous=True, seed=11)
    eager = model(q, k, v)
    explanation = torch._dynamo.explain(model)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(q, k, v)
    assert got.shape == eager.shape and got.dtype == eager.dtype
    assert_close(got, eager, cos=0.99999, rel_l1=1e-3)

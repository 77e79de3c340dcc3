"""GPU tests (run on any CUDA GPU; on non-Blackwell ones the Triton path runs emulated).

    pytest -m gpu sageattention3_blackwell/tests -v -s
"""
import pytest
import torch

from sage3_cases import EXTREMES, case_args, case_inputs, check, compare
from sage3_metrics import cosine, poisoned_empty, rel_l1, sdpa_float64
from sageattn3 import sageattn3_blackwell, triton_attn
from sageattn3.dispatch import EMULATION_ENV
from sageattn3.prepare import kernel_scales, quantize_inputs
from sageattn3.reference import attention_reference

pytestmark = pytest.mark.gpu


def _is_blackwell() -> bool:
    return triton_attn.has_native_nvfp4_mma(torch.device("cuda"))


def _inputs(b, h, h_kv, n_q, n_k, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, heads, n, d, generator=g, device="cuda", dtype=dtype)
                 for heads, n in ((h, n_q), (h_kv, n_k), (h_kv, n_k)))


def test_unsupported_gpu_raises_and_points_to_sageattention():
    if _is_blackwell():
        pytest.skip("this GPU is supported")
    q, k, v = _inputs(1, 2, 2, 128, 128, 64)
    with pytest.raises(RuntimeError) as err:
        sageattn3_blackwell(q, k, v)
    message = str(err.value)
    assert "Unsupported GPU" in message and torch.cuda.get_device_name() in message
    assert "sageattention.sageattn" in message and EMULATION_ENV in message


def test_environment_opt_in_runs_the_emulated_path(monkeypatch):
    monkeypatch.setenv(EMULATION_ENV, "1")
    q, k, v = _inputs(1, 2, 2, 128, 128, 64)
    out = sageattn3_blackwell(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype and out.isfinite().all()


@pytest.mark.parametrize("shape, is_causal", [
    ((2, 4, 2, 512, 512, 128), False),
    ((1, 8, 8, 333, 1000, 64), True),
])
def test_triton_matches_reference_on_gpu(monkeypatch, shape, is_causal):
    b, h, h_kv, n_q, n_k, d = shape
    q, k, v = _inputs(*shape)
    qi = quantize_inputs(q, k, v)
    scale = d ** -0.5
    ref, ref_lse = attention_reference(qi, is_causal, scale)
    monkeypatch.setattr(triton_attn.torch, "empty", poisoned_empty)
    out, lse = triton_attn.attention_triton(qi, is_causal, scale)
    cos, l1 = cosine(out, ref), rel_l1(out, ref)
    print(f"GPU triton (native={_is_blackwell()}) vs reference {shape} causal={is_causal}: cos={cos:.6f} "
          f"relL1={l1:.4f} lse_err={(lse - ref_lse).abs().max().item():.2e}")
    assert out.isfinite().all()
    assert cos >= 0.999 and l1 <= 0.02 and (lse - ref_lse).abs().max() <= 1e-3


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("shape, is_causal", [
    ((2, 8, 2, 1024, 1024, 128), True),
    ((1, 4, 4, 700, 900, 64), False),
    ((1, 2, 1, 256, 300, 96), False),   # padded head_dim
])
def test_public_api_vs_float32_sdpa(shape, is_causal, layout):
    q, k, v = _inputs(*shape)
    ref = sdpa_float64(q.float(), k.float(), v.float(), is_causal=is_causal).float()
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    copies = [t.clone() for t in (q, k, v)]
    out = sageattn3_blackwell(q, k, v, is_causal=is_causal, tensor_layout=layout, allow_emulation=True)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), copies))
    if layout == "NHD":
        out = out.transpose(1, 2)
    cos, l1 = cosine(out, ref), rel_l1(out, ref)
    print(f"GPU sageattn3 vs fp32 SDPA {shape} causal={is_causal} {layout}: cos={cos:.4f} relL1={l1:.3f}")
    assert cos >= 0.975 and l1 <= 0.25


def test_cuda_extension_matches_reference():
    try:
        from sageattn3 import _C  # noqa: F401
    except ImportError:
        pytest.skip("sageattn3._C not built")
    if not _is_blackwell():
        pytest.skip("the CUDA kernels need sm_100/sm_120/sm_121")
    q, k, v = _inputs(1, 4, 2, 300, 500, 128)
    ref = sageattn3_blackwell(q, k, v, backend="reference")
    out = sageattn3_blackwell(q, k, v, backend="cuda")
    assert cosine(out, ref) >= 0.999


def test_cuda_extension_loads_and_refuses_other_gpus(monkeypatch):
    """Runs wherever _C is built: the bindings validate their inputs, and on a non-Blackwell GPU the public API
    refuses backend='cuda' with a clear error before reaching the kernels."""
    try:
        from sageattn3 import _C, ops  # noqa: F401 - _C registers the CUDA kernels of ops' operators
    except ImportError:
        pytest.skip("sageattn3._C not built")
    x = torch.randn(4, 32, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="has dtype .*expected"):
        torch.ops.sageattn3.quantize(x)
    with pytest.raises(RuntimeError, match=r"multiple of 16, got shape \[4, 24\]"):
        torch.ops.sageattn3.quantize(torch.randn(4, 24, device="cuda"))
    if _is_blackwell():
        pytest.skip("this GPU runs the kernels; test_cuda_extension_matches_reference covers it")
    monkeypatch.setenv(EMULATION_ENV, "1")
    with pytest.raises(RuntimeError, match="backend='cuda' needs sm_100/sm_120/sm_121"):
        sageattn3_blackwell(*_inputs(1, 2, 2, 128, 128, 128), backend="cuda")
    with pytest.raises(RuntimeError, match="no kernel image"):  # built for sm_100a/sm_120a only
        torch.ops.sageattn3.quantize(torch.randn(4, 32, device="cuda"))
        torch.cuda.synchronize()
    # Called directly with well-formed operands, the bindings refuse this GPU before launching anything.
    qi = quantize_inputs(*_inputs(1, 2, 2, 128, 128, 128))
    with pytest.raises(RuntimeError, match="need sm_100 or sm_120/sm_121, got sm_"):
        ops.run_attention(qi.q_codes, qi.q_scales, qi.k_codes, qi.k_scales, qi.v_codes, qi.v_scales, qi.q_bias,
                          qi.n_k, kernel_scales(qi, 0.1), False, 0)


def _kernel(backend):
    if backend == "triton":
        return triton_attn.attention_triton
    try:
        from sageattn3 import cuda_attn, _C  # noqa: F401
    except ImportError:
        pytest.skip("sageattn3._C not built")
    if not _is_blackwell():
        pytest.skip("the CUDA kernels need sm_100/sm_120/sm_121")
    return cuda_attn.attention_cuda


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("case", EXTREMES, ids=str)
def test_kernels_match_reference_on_hostile_input(monkeypatch, backend, case):
    """Issue 18 on the GPU: bottom-right causal with fully masked rows, negative and capped sm_scale,
    tiny and huge V, a NaN query row; each kernel against the reference on the same quantized operands."""
    run = _kernel(backend)
    qi = quantize_inputs(*case_inputs(case, seed=0, device="cuda"))
    ref, ref_lse = attention_reference(qi, *case_args(case))
    monkeypatch.setattr(triton_attn.torch, "empty", poisoned_empty)
    r = compare(*run(qi, *case_args(case)), ref, ref_lse)
    print(f"GPU {backend} vs reference {case}: cos={r['cos']:.6f} relL1={r['rel_l1']:.4f} lse_err={r['lse_err']:.2e}")
    check(r)


# Tiny V in bf16: in fp16, V ~ 1e-6 is subnormal and the exact output (~4e-8 here) is below fp16's subnormal step
# (6e-8), so no implementation, SDPA included, can return it in fp16.
@pytest.mark.parametrize("v_magnitude, dtype", [(1e-6, torch.bfloat16), (1e-3, torch.float16), (6e4, torch.float16)])
def test_public_api_keeps_tiny_and_huge_v_on_gpu(v_magnitude, dtype):
    q, k, v = _inputs(1, 4, 4, 512, 512, 128, dtype=dtype)
    v = (v.float() * v_magnitude).clamp(-65504, 65504).to(dtype)
    out = sageattn3_blackwell(q, k, v, allow_emulation=True)
    ref = sdpa_float64(q, k, v)
    assert out.isfinite().all() and cosine(out, ref) >= 0.975


def test_backward_is_refused_in_eager_and_compiled_code_on_gpu():
    q, k, v = (t.requires_grad_() for t in _inputs(1, 2, 2, 256, 256, 64, dtype=torch.float16))
    compiled = torch.compile(lambda q, k, v: sageattn3_blackwell(q, k, v, allow_emulation=True))
    for fn in (lambda q, k, v: sageattn3_blackwell(q, k, v, allow_emulation=True), compiled):
        out = fn(q, k, v)
        with torch.no_grad():
            assert cosine(out, sageattn3_blackwell(q, k, v, allow_emulation=True)) >= 0.999
        with pytest.raises(RuntimeError, match="has no backward pass"):
            out.float().sum().backward()

"""Which kernels a call runs (SDPA for small problems, compiled, Triton), with mocked GPUs and builds;
no GPU needed (on a GPU the inputs are CUDA tensors and the mocks still decide)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

import sageattention as sa
from sageattention import archs, core, dispatch, fallback
from sageattention.compiled_call import Granularity, PvAccum
from tests.sageattention.helpers import DEVICE, fp64_out, make_qkv, metrics


@pytest.fixture
def sdpa_fallback():
    fallback.set_sdpa_fallback(True)
    yield
    fallback.set_sdpa_fallback(False)  # tests/sageattention/conftest.py runs everything else without it


@pytest.fixture
def gpu(monkeypatch):
    """Pretend to be a GPU of capability `cap` whose build holds the compiled families in `built`."""
    def make(cap, built=("sm80", "sm89")):
        monkeypatch.setattr(dispatch, "capability", lambda device: cap)
        monkeypatch.setattr(dispatch, "check_supported", lambda device, needs_fp8=False, only=None: cap)

        def family(cap_, pv_fp8, device):
            want = dispatch.family_for(cap_, pv_fp8)
            return want if want in built else None
        monkeypatch.setattr(dispatch, "compiled_family", family)
    return make


@pytest.fixture
def compiled_calls(monkeypatch):
    """The argument tuples of every compiled-kernel call, which returns q instead of running."""
    calls = []
    monkeypatch.setattr(core.ops, "run_compiled_attention", lambda q, k, v, call: calls.append(call) or (q, None))
    return calls


def qkv(nq=256, nk=256, d=64, hq=4, hk=4):
    return make_qkv(b=1, hq=hq, hk=hk, nq=nq, nk=nk, d=d)


@pytest.mark.parametrize("cap, want", [((8, 0), "compiled sm80 kernels"), ((8, 6), "compiled sm80 kernels"),
                                       ((8, 9), "compiled sm89 kernels"), ((12, 0), "compiled sm89 kernels"),
                                       ((9, 0), "compiled sm90 kernels"), ((10, 0), "triton")])
def test_sageattn_routes_by_arch(gpu, cap, want):
    gpu(cap, built=("sm80", "sm89", "sm90"))
    assert sa.explain(*qkv()).startswith(want)


def test_named_cuda_variants_take_the_compiled_kernels_where_sageattn_prefers_triton(gpu, compiled_calls):
    gpu((10, 0))
    q, k, v = qkv()
    core.sageattn_qk_int8_pv_fp8_cuda(q, k, v)
    core.sageattn_qk_int8_pv_fp16_cuda(q, k, v)
    assert [c.family for c in compiled_calls] == ["sm89", "sm80"]


def test_hopper_runs_its_own_family(gpu, compiled_calls):
    gpu((9, 0), built=("sm80", "sm89", "sm90"))
    q, k, v = qkv()
    sa.sageattn(q, k, v)
    core.sageattn_qk_int8_pv_fp8_cuda(q, k, v)
    core.sageattn_qk_int8_pv_fp16_cuda(q, k, v)
    core.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v)
    assert [c.family for c in compiled_calls] == ["sm90", "sm90", "sm80", "sm90"]


def test_hopper_build_without_its_module_runs_fp8_on_triton(gpu, compiled_calls, caplog):
    """A build whose arch list lacks 9.0 has no _C_sm90: FP8 P·V on an H100 takes the Triton kernels (the DEBUG log
    says so), and 16-bit P·V still the sm80 family."""
    gpu((9, 0), built=("sm80", "sm89"))
    q, k, v = qkv()
    with caplog.at_level("DEBUG", logger="sageattention"):
        core.sageattn_qk_int8_pv_fp8_cuda(q, k, v)
        core.sageattn_qk_int8_pv_fp16_cuda(q, k, v)
    assert [c.family for c in compiled_calls] == ["sm80"]
    assert caplog.messages[0].startswith("sageattn_qk_int8_pv_fp8_cuda: triton")


@pytest.mark.parametrize("cap", [(8, 0), (9, 0)])
def test_triton_variant_stays_on_triton(gpu, compiled_calls, caplog, cap):
    gpu(cap, built=("sm80", "sm89", "sm90"))
    with caplog.at_level("DEBUG", logger="sageattention"):
        core.sageattn_qk_int8_pv_fp16_triton(*qkv())
    assert compiled_calls == []
    assert caplog.messages == ["sageattn_qk_int8_pv_fp16_triton: triton (sageattn_qk_int8_pv_fp16_triton runs the "
                               "Triton kernels)"]


@pytest.mark.parametrize("cap, pv_fp8, want", [((8, 0), True, None), ((8, 0), False, "sm80"), ((8, 9), True, "sm89"),
                                               ((9, 0), True, "sm90"), ((12, 1), False, "sm80"),
                                               ((12, 1), True, "sm89"), ((11, 0), True, None)])
def test_family_for_reads_archs_py(cap, pv_fp8, want):
    assert dispatch.family_for(cap, pv_fp8) == want


@pytest.mark.parametrize("why, kwargs, shape", [
    ("attn_mask", {"attn_mask": torch.ones(256, 256, dtype=torch.bool, device=DEVICE)}, {}),
    ("head_dim 192", {}, {"d": 192}),
])
def test_what_the_compiled_kernels_do_not_take_goes_to_triton(gpu, why, kwargs, shape):
    gpu((8, 9))
    assert sa.explain(*qkv(**shape), **kwargs).startswith(f"triton: {why}")


def test_a_build_without_the_family_goes_to_triton(gpu):
    gpu((8, 9), built=("sm80",))
    assert sa.explain(*qkv()).startswith("triton: this build has no compiled FP8")


def test_sageattn_default_granularity_follows_the_backend(gpu, compiled_calls):
    gpu((8, 9))
    q, k, v = qkv()
    sa.sageattn(q, k, v)
    sa.sageattn(q, k, v, qk_quant_gran="per_block")
    assert [c.qk_gran for c in compiled_calls] == [Granularity.named(core.SAGEATTN_GRAN_COMPILED),
                                                   Granularity.PER_BLOCK]


@pytest.mark.parametrize("accum, fp8, want", [
    ("fp32", True, PvAccum.ACC_F32), ("fp32+fp32", True, PvAccum.ACC_TWO_LEVEL),
    ("fp32+fp16", True, PvAccum.ACC_F16_INNER), ("fp32", False, PvAccum.ACC_F32),
    ("fp16+fp32", False, PvAccum.ACC_F16_INNER), ("fp16", False, PvAccum.ACC_F16_INNER),
])
def test_pv_accumulation_reaches_the_compiled_kernels(accum, fp8, want):
    choices = core.FP8_PV_ACCUM if fp8 else core.FP16_PV_ACCUM
    plan = core.resolve_plan("f", (8, 9), qk_quant_gran="per_thread", pv_fp8=fp8, pv_accum_dtype=accum,
                             accum_choices=choices, smooth_k=True, smooth_v=False)
    assert core.compiled_accum(plan) == want


# ---------------------------------------------------------------- small problems -> SDPA

@pytest.mark.parametrize("nq, nk, d, hq, why", [(4096, 77, 64, 10, "77 keys"), (64, 128, 64, 2, "multiply-adds")])
def test_small_problems_go_to_sdpa(sdpa_fallback, nq, nk, d, hq, why):
    q, k, v = make_qkv(b=1, hq=hq, nq=nq, nk=nk, d=d, seed=1)
    assert why in sa.explain(q, k, v)
    out = sa.sageattn(q, k, v)
    exact, _ = fp64_out(q, k, v)
    assert metrics(out, exact)["rel_l1"] < 2e-3  # SDPA is exact; the quantized kernels would be ~1e-2 off


@pytest.mark.parametrize("nq, kwargs", [(77, {"return_lse": True}),
                                        (64, {"attn_mask": torch.ones(64, 77, dtype=torch.bool, device=DEVICE)}),
                                        (100, {"attn_mask": causal_lower_right(100, 77)})])
def test_what_sdpa_cannot_reproduce_keeps_the_kernels(sdpa_fallback, nq, kwargs):
    """LSE, masks, and bottom-right causal with rows that see no key (SDPA: NaN, sageattn: 0)."""
    q, k, v = make_qkv(b=1, hq=2, nq=nq, nk=77, d=64)
    assert not sa.explain(q, k, v, **kwargs).startswith("sdpa")


def test_an_argument_set_is_checked_and_routed_once(gpu, compiled_calls, monkeypatch):
    """Small calls are host-bound: a repeated argument set reuses its checks and route; a new one decides anew."""
    gpu((8, 9))
    decided = []
    resolve = core.resolve_plan
    monkeypatch.setattr(core, "resolve_plan", lambda *a, **kw: decided.append(a[0]) or resolve(*a, **kw))
    q, k, v = qkv()
    for _ in range(3):
        sa.sageattn(q, k, v)
    sa.sageattn(q, k, v, is_causal=True)
    sa.sageattn(*qkv(nq=300))
    assert len(decided) == 3 and len(compiled_calls) == 5


def test_an_unhashable_argument_gets_the_named_error():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"qk_quant_gran=\['per_warp'\] is not supported"):
        sa.sageattn(q, k, v, qk_quant_gran=["per_warp"])
    with pytest.raises(ValueError, match="pv_accum_dtype"):
        sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, pv_accum_dtype={"fp32"})


@pytest.mark.parametrize("positional", [False, True])
def test_an_argument_equal_to_a_cached_one_is_still_checked(gpu, compiled_calls, positional):
    gpu((8, 9))
    q, k, v = qkv()
    call = (lambda s: sa.sageattn(q, k, v, "HND", False, s)) if positional else (
        lambda s: sa.sageattn(q, k, v, sm_scale=s))
    call(1)
    with pytest.raises(TypeError, match="sm_scale must be a float or None, got bool"):
        call(True)  # True == 1: equal signatures but for the type
    assert compiled_calls[0][6] == 1.0  # the scale


def test_a_cached_signature_still_checks_what_it_does_not_hold(gpu, compiled_calls):
    """The signature holds what the checks read; tensors differing there are checked anew."""
    gpu((8, 9))
    q, k, v = qkv()
    sa.sageattn(q, k, v)
    with pytest.raises(ValueError, match="contiguous in its last"):
        sa.sageattn(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    with pytest.raises(TypeError, match="float16 and torch.bfloat16"):
        sa.sageattn(q.float(), k, v)
    with pytest.raises(TypeError, match="unexpected keyword"):
        sa.sageattn(q, k, v, kernels="triton")
    assert len(compiled_calls) == 1


def test_masks_are_never_kept(gpu, monkeypatch):
    """A call with an attn_mask is decided anew each time: a kept run would hold (and reuse) a stale mask."""
    gpu((8, 9))
    masks = []
    monkeypatch.setattr(core.ops, "run_attention", lambda q, k, v, call: masks.append(call.attn_mask) or (q, None))
    q, k, v = qkv()
    first, second = (torch.rand(256, 256, device=DEVICE) > p for p in (0.2, 0.7))
    sa.sageattn(q, k, v, attn_mask=first)
    sa.sageattn(q, k, v, attn_mask=second)
    assert [m.data_ptr() for m in masks] == [first.data_ptr(), second.data_ptr()]
    assert not core._prepared


def test_the_fallback_switch_applies_to_kept_calls(sdpa_fallback, gpu, compiled_calls, monkeypatch):
    gpu((8, 9))
    sdpa_calls = []
    monkeypatch.setattr(fallback, "sdpa", lambda q, *a: sdpa_calls.append(a) or q)
    q, k, v = qkv(nk=77)
    sa.sageattn(q, k, v)
    sa.set_sdpa_fallback(False)
    sa.sageattn(q, k, v)
    assert len(sdpa_calls) == 1 and len(compiled_calls) == 1


def test_kept_signatures_are_bounded(gpu, compiled_calls, monkeypatch):
    gpu((8, 9))
    monkeypatch.setattr(core, "_PREPARED_MAX", 2)
    for n in (200, 201, 202, 203, 204):
        sa.sageattn(*qkv(nq=n))
        assert 1 <= len(core._prepared) <= 2
    assert len(compiled_calls) == 5


def test_the_fallback_can_be_turned_off(sdpa_fallback):
    q, k, v = qkv(nk=77)
    assert sa.explain(q, k, v).startswith("sdpa")
    sa.set_sdpa_fallback(False)
    assert not sa.explain(q, k, v).startswith("sdpa")


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("is_causal, offset", [(False, 0), (True, 0), (True, 60)], ids=["full", "top-left",
                                                                                       "bottom-right"])
def test_sdpa_fallback_keeps_sageattn_semantics(layout, is_causal, offset):
    """GQA, causal alignments (nq < nk), the caller's layout."""
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=40, nk=100, d=64, layout=layout, seed=3)
    out = fallback.sdpa(q, k, v, layout, is_causal, offset, 64**-0.5)
    exact, _ = fp64_out(q, k, v, layout, is_causal=is_causal, causal_offset=offset)
    assert out.shape == q.shape
    assert metrics(out, exact)["rel_l1"] < 2e-3


def test_sdpa_reason_thresholds():
    kw = dict(is_causal=False, causal_offset=0, masked=False, return_lse=False)
    fallback.set_sdpa_fallback(True)
    try:
        assert fallback.sdpa_reason(1, 16, 1024, 127, 64, **kw)
        assert fallback.sdpa_reason(1, 16, 1024, 1024, 64, **kw)  # B1 H16 N1k d64 (2**30 multiply-adds): SDPA
        assert fallback.sdpa_reason(1, 16, 1023, 2048, 64, **kw)
        assert fallback.sdpa_reason(1, 16, 1024, 2048, 64, **kw) is None  # 2**31: the kernels
        assert fallback.sdpa_reason(1, 1, 128, 128, 64, **kw)
        causal = dict(kw, is_causal=True)
        assert fallback.sdpa_reason(1, 16, 77, 77, 64, **causal)
        assert fallback.sdpa_reason(1, 16, 1024, 77, 64, **causal)  # top-left: every query sees key 0
        # bottom-right with more queries than keys: the first rows see no key (SDPA: NaN, sageattn: 0)
        assert fallback.sdpa_reason(1, 16, 1024, 77, 64, **dict(causal, causal_offset=77 - 1024)) is None
        assert fallback.sdpa_reason(1, 16, 1024, 77, 64, **dict(kw, return_lse=True)) is None
    finally:
        fallback.set_sdpa_fallback(False)


HOPPER_CROSSOVER = archs.FAMILIES["sm90"]["sdpa_below_keys"]


@pytest.mark.parametrize("d, causal", [(64, False), (64, True), (96, False), (128, False), (128, True)])
def test_hopper_hands_sequences_shorter_than_its_crossover_to_sdpa(sdpa_fallback, d, causal):
    """archs.py's "sdpa_below_keys": under that many keys the sm90 kernels measured slower than SDPA (head_dim 96 is
    padded to 128); at it they run; other families have no such bound."""
    below = HOPPER_CROSSOVER[(64 if d <= 64 else 128, causal)]
    kw = dict(is_causal=causal, causal_offset=0, return_lse=False)
    reason = fallback.slower_kernels_reason("sm90", below - 1, d, **kw)
    assert reason and f"below {below} keys" in reason
    assert fallback.slower_kernels_reason("sm90", below, d, **kw) is None
    assert fallback.slower_kernels_reason("sm89", 256, d, **kw) is None
    assert fallback.slower_kernels_reason("sm90", 256, d, **dict(kw, return_lse=True)) is None
    if causal:  # bottom-right alignment leaving rows without keys: SDPA would give NaN there
        assert fallback.slower_kernels_reason("sm90", 256, d, **dict(kw, causal_offset=-1)) is None
    fallback.set_sdpa_fallback(False)
    assert fallback.slower_kernels_reason("sm90", below - 1, d, **kw) is None


def test_sageattn_on_hopper_routes_by_key_count(sdpa_fallback, gpu, compiled_calls, monkeypatch):
    """sageattn sends a short Hopper call to SDPA (explain says why) and a long one to the sm90 kernels; the named
    `_cuda` variants always run their kernels; an Ada GPU runs its kernels at any length."""
    gpu((9, 0), built=("sm80", "sm89", "sm90"))
    sdpa_calls = []
    monkeypatch.setattr(fallback, "sdpa", lambda q, *a: sdpa_calls.append(a) or q)
    below = HOPPER_CROSSOVER[(128, False)]
    short, long = qkv(nq=1024, nk=below - 1, d=128, hq=8, hk=8), qkv(nq=1024, nk=below, d=128, hq=8, hk=8)
    assert sa.explain(*short) == (f"sdpa: {below - 1} keys (head_dim 128): the sm90 kernels run slower than SDPA "
                                  f"below {below} keys")
    assert sa.explain(*long).startswith("compiled sm90")
    sa.sageattn(*short)
    sa.sageattn(*long)
    core.sageattn_qk_int8_pv_fp8_cuda(*short)
    assert len(sdpa_calls) == 1 and [c.family for c in compiled_calls] == ["sm90", "sm90"]
    gpu((8, 9))
    assert sa.explain(*short).startswith("compiled sm89")

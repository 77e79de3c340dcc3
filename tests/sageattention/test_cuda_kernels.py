"""The compiled kernels (csrc/, modules sageattention._C_sm80, _C_sm89 and _C_sm90) against the reference, on a GPU.

Kernel level: the modules are called directly, so these tests pin what each kernel computes; test_gpu.py checks
the public functions on top of them. Every output is allocated by the module from memory that was filled with NaN
just before (the caching allocator hands the freed block back), so an element the kernel does not write fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.sageattention.helpers import (assert_close, assert_lse_close, compiled_v_max, lse_tol, make_qkv, metrics,
                                        rounding_ties, sdpa_fp32)
import build_rules
from sageattention import archs, dispatch, reference
from sageattention.compiled_call import CompiledCall, Granularity, PvAccum, VMode
from sageattention.inputs import to_hnd
from sageattention.quant_groups import GRANULARITIES, k_grouping, q_grouping

pytestmark = pytest.mark.gpu

ACC_F32, ACC_TWO_LEVEL, ACC_F16_INNER = PvAccum
V_FP8, V_16 = VMode.V_FP8, VMode.V16


def find_module(family: str):
    """(the family's module, "") where it is built with device code for this GPU, else (None, why not)."""
    mod = dispatch.compiled_module(family)
    if mod is None:
        return None, f"sageattention._C_{family} is not built"
    if not mod.runs_on_current_device():
        return None, f"sageattention._C_{family} has no kernels for this GPU"
    return mod, ""


def module(family: str):
    mod, why = find_module(family)
    if mod is None:
        pytest.skip(why)
    return mod


def poison_allocator(n_bytes: int = 256 << 20) -> None:
    """Fill free blocks of the caching allocator with NaN so that unwritten outputs show."""
    block = torch.full((n_bytes // 2,), float("nan"), dtype=torch.float16, device="cuda")
    del block


def attend(mod, q, k, v, layout, *, causal=False, causal_offset=0, gran="per_thread", accum=ACC_TWO_LEVEL,
         smooth_k=True, smooth_v=False, lse=False, sm_scale=None):
    """The module's fused op, its positional arguments from names (no synchronization: capturable)."""
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    call = CompiledCall("", layout == "NHD", causal, causal_offset, scale, Granularity.named(gran), accum, smooth_k,
                        smooth_v, lse)
    return mod.attention(q, k, v, *call.kernel_args())


def run(mod, q, k, v, layout, **options):
    """attend, on a poisoned allocator, checked not to change its inputs and to return q's shape and dtype."""
    before = [t.clone() for t in (q, k, v)]
    poison_allocator()
    out, lse_out = attend(mod, q, k, v, layout, **options)
    torch.cuda.synchronize()
    for t, b in zip((q, k, v), before):
        assert torch.equal(t, b), "the kernel changed its inputs"
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    return out, lse_out


def reference_of(mod, q, k, v, layout, *, fp8, causal=False, gran="per_thread", accum=ACC_TWO_LEVEL,
                 smooth_v=False, sm_scale=None):
    """What `mod` computes, by the reference."""
    v_max = compiled_v_max(mod, fp8 and accum == ACC_F16_INNER)
    out, lse = reference.sage_attention_reference(
        *(to_hnd(t, layout).cpu() for t in (q, k, v)), is_causal=causal, qk_quant_gran=gran,
        pv_dtype="fp8" if fp8 else "fp16", smooth_v=smooth_v, v_max=v_max, compiled=True, sm_scale=sm_scale)
    return to_hnd(out, layout), lse


FAMILIES = [("sm80", False), ("sm89", True), ("sm90", True)]
TOL = {False: dict(cos=0.9995, rel_l1=0.03), True: dict(cos=0.999, rel_l1=0.05)}  # vs fp32 SDPA
# vs the quantized reference: FP8 P is rounded against the running row max in the kernel and the final one in the
# reference, so FP8 kernels differ from it at FP8-noise level
REF_TOL = {False: dict(cos=0.9999, rel_l1=0.006), True: dict(cos=0.999, rel_l1=0.05)}


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 80, 40])
def test_random_inputs_vs_sdpa(family, fp8, layout, causal, d):
    """Head_dims 80 and 40 are padded (to 128, 64): the sm90 kernels' bulk stores clip each 64-column box at d."""
    mod = module(family)
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=333, nk=1000, d=d, layout=layout, seed=d + causal)
    out, _ = run(mod, q, k, v, layout, causal=causal)
    ref, _ = sdpa_fp32(q, k, v, layout, is_causal=causal)
    assert_close(out.float().cpu(), ref.cpu(), **TOL[fp8], what=f"{family} {layout} causal={causal} d={d}")


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("accum", [ACC_F32, ACC_TWO_LEVEL, ACC_F16_INNER])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_structured_inputs_vs_reference_and_sdpa(family, fp8, gran, accum, dtype):
    """Channel-biased K and outlier Q channels: close to the quantized reference, and to SDPA."""
    mod = module(family)
    q, k, v = make_qkv(b=1, hq=4, nq=512, nk=777, d=128, dtype=dtype, k_bias=3.5, q_outlier=5.5, seed=7)
    out, _ = run(mod, q, k, v, "HND", gran=gran, accum=accum)
    ref, _ = reference_of(mod, q, k, v, "HND", fp8=fp8, gran=gran, accum=accum)
    assert_close(out.float().cpu(), ref.float(), **REF_TOL[fp8], what=f"vs reference {gran} acc={accum}")
    sdpa, _ = sdpa_fp32(q, k, v)
    assert_close(out.float().cpu(), sdpa.cpu(), cos=0.995, rel_l1=0.09, what=f"vs sdpa {gran} acc={accum}")


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("nq, nk", [(1, 1), (17, 17), (77, 4097), (4097, 77), (1000, 1), (128, 64), (129, 65)])
def test_odd_lengths(family, fp8, nq, nk):
    mod = module(family)
    for causal, offset in ((False, 0), (True, 0), (True, nk - nq)):  # top-left and bottom-right causal
        q, k, v = make_qkv(b=1, hq=2, nq=nq, nk=nk, d=64, layout="NHD", seed=nq * 7 + nk)
        out, lse = run(mod, q, k, v, "NHD", causal=causal, causal_offset=offset, lse=True)
        ref, ref_lse = sdpa_fp32(q, k, v, "NHD", is_causal=causal, causal_offset=offset)
        rows = torch.isfinite(ref_lse).cpu()  # bottom-right causal, nq > nk: rows without keys give 0 and -inf
        assert torch.equal(torch.isneginf(lse.cpu()), ~rows), "rows without keys must have LSE -inf"
        masked_out = to_hnd(out, "NHD").float().cpu()[~rows]
        assert torch.equal(masked_out, torch.zeros_like(masked_out)), "rows without keys must be 0"
        assert_close(out.float().cpu(), torch.nan_to_num(ref.cpu()), **TOL[fp8], what=f"nq={nq} nk={nk} {causal}")
        err = (lse.cpu()[rows] - ref_lse.cpu()[rows]).abs().max().item() if rows.any() else 0.0
        assert err < 0.05, f"lse off by {err}"


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("offset", [0, 200])
def test_causal_with_many_items_per_program(family, fp8, offset):
    """Causal calls with several times more 128-row items than SMs: the sm90 kernel's persistent programs then run
    several pairs of a long and a short item (9 query blocks per head, so pairs also span two heads), with GQA,
    top-left and bottom-right causal. Each 128-row block of every head is checked on its own against fp32 SDPA (an
    item computed on another head's keys, or twice, or not at all, fails), and so is every row's LSE."""
    mod = module(family)
    nq = 1100
    q, k, v = make_qkv(b=4, hq=16, hk=4, nq=nq, nk=nq + offset, d=128, seed=29 + offset)
    out, _ = run(mod, q, k, v, "HND", causal=True, causal_offset=offset)
    _, lse = run(mod, q, k, v, "HND", causal=True, causal_offset=offset, lse=True)
    ref, ref_lse = sdpa_fp32(q, k, v, is_causal=True, causal_offset=offset)
    assert_close(out.float().cpu(), ref.cpu(), **TOL[fp8], what=f"causal offset={offset}")
    pad = -nq % 128
    blocks = [torch.nn.functional.pad(t.float(), (0, 0, 0, pad)).unflatten(2, (-1, 128)) for t in (out, ref)]
    rel_l1 = (blocks[0] - blocks[1]).abs().sum((-1, -2)) / blocks[1].abs().sum((-1, -2))
    assert rel_l1.max().item() < 2 * TOL[fp8]["rel_l1"], f"worst 128-row block: rel L1 {rel_l1.max().item():.3f}"
    assert_lse_close(lse, ref_lse, atol=0.05, what=f"causal offset={offset}")


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("d", [64, 128])
def test_more_work_than_sms(family, fp8, d):
    """Several 128-row items per SM (the sm90 kernel's persistent programs each run several, the ring and its
    barriers running on across them): every head's rows are right, not only most of the output."""
    mod = module(family)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hq = 2 * (sms // 8 + 1)  # 4 batches x 3 query blocks x hq heads: more than 3 items per SM
    q, k, v = make_qkv(b=4, hq=hq, hk=hq // 2, nq=300, nk=200, d=d, seed=d)
    out, lse = run(mod, q, k, v, "HND", lse=True)
    ref, ref_lse = sdpa_fp32(q, k, v)
    assert_each_head_close(out, ref, fp8)
    assert_lse_close(lse, ref_lse, atol=0.05)


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("nk", [128, 200])
def test_short_items_keep_their_own_v_statistics(family, fp8, nk):
    """Items of one or two tiles, about eight per program, each K/V head with its own V magnitude: the sm90 kernel at
    d128 loads an item's Q and V statistics while the item two before may still be in its epilogue, so an item
    reading another's V scales (a slot reused too early) shows as a head off by powers of 4. Every head, without
    and with the LSE (separate kernels)."""
    mod = module(family)
    heads = 2 * torch.cuda.get_device_properties(0).multi_processor_count + 8
    q, k, v = make_qkv(b=1, hq=heads, hk=heads, nq=4 * 128, nk=nk, d=128, seed=nk)
    v = v * (4.0 ** (torch.arange(heads, device=v.device) % 5)).view(1, heads, 1, 1).to(v.dtype)
    ref, ref_lse = sdpa_fp32(q, k, v)
    for lse in (False, True):
        out, out_lse = run(mod, q, k, v, "HND", lse=lse)
        assert_each_head_close(out, ref, fp8, f"lse={lse}")
    assert_lse_close(out_lse, ref_lse, atol=0.05)


def assert_each_head_close(out, ref, fp8, what=""):
    """Every (batch, head) of out within the family's relative L1 of ref, not only the output as a whole."""
    per_head = (out.float().cpu() - ref.cpu()).abs().sum((2, 3)) / ref.cpu().abs().sum((2, 3))
    worst = divmod(per_head.argmax().item(), per_head.shape[1])
    assert per_head.max().item() <= TOL[fp8]["rel_l1"], f"{what} worst (batch, head) {worst}: {per_head.max():.3g}"


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("nq, nk", [(4096, 5120), (1024, 32768)])
def test_attention_reads_each_head_once_it_is_prepared(family, fp8, nq, nk):
    """The sm90 kernel starts while the cluster preparation still runs (a programmatic dependent launch) and reads each
    K/V head once all of its blocks are counted written. One K/V head of 5120 keys (the longest the clusters take)
    leaves most SMs free, so its programs start at once; the workspace is NaN before each call, so a head read early
    shows. An early read is a race: with the wait taken out, each of three runs failed by its fourth repeat on an
    H100. At 32768 keys prepare_kv takes the head, and the kernel starts after it. Every head must be right, on every
    repeat."""
    mod = module(family)
    q, k, v = make_qkv(b=1, hq=16, hk=1, nq=nq, nk=nk, d=128, k_bias=2.0, seed=nk)
    ref, _ = sdpa_fp32(q, k, v)
    for i in range(8):
        out, _ = run(mod, q, k, v, "HND")
        assert_each_head_close(out, ref, fp8, f"repeat {i}")


@pytest.mark.parametrize("family, fp8", FAMILIES)
def test_cuda_graph_replay_matches_eager(family, fp8):
    """Captured in a CUDA graph (torch.compile's "reduce-overhead" mode does this), the call replays what eager
    computes on the inputs copied in, the sm90 kernel's dependent launch included."""
    mod = module(family)
    shape = dict(b=1, hq=8, hk=4, nq=640, nk=1500, d=128, layout="NHD")
    q, k, v = make_qkv(**shape, seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture requires
        attend(mod, q, k, v, "NHD")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = attend(mod, q, k, v, "NHD")
    for seed in (2, 3):
        fresh = make_qkv(**shape, seed=seed)
        for static, new in zip((q, k, v), fresh):
            static.copy_(new)
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager, _ = attend(mod, *fresh, "NHD")
        assert torch.equal(captured, eager), f"seed {seed}: replay differs from eager"
        ref, _ = sdpa_fp32(*fresh, "NHD")
        assert_close(captured.float().cpu(), ref.cpu(), **TOL[fp8], what=f"replay, seed {seed}")


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("sm_scale", [-0.3, 0.0, 0.3])
@pytest.mark.parametrize("magnitude", [1.0, 1e-18])
def test_sm_scale_signs_and_tiny_magnitudes(family, fp8, sm_scale, magnitude):
    """Negative and zero sm_scale, and bf16 Q and K so small that the product of their INT8 scales underflows fp32
    (every score dequantizes to 0): causal too, so that masked scores meet those scales, against fp32 SDPA."""
    mod = module(family)
    q, k, v = make_qkv(b=1, hq=2, nq=300, nk=300, d=128, dtype=torch.bfloat16, seed=13)
    q, k = q * magnitude, k * magnitude
    for causal in (False, True):
        out, lse = run(mod, q, k, v, "HND", causal=causal, sm_scale=sm_scale, lse=True)
        ref, ref_lse = sdpa_fp32(q, k, v, is_causal=causal, sm_scale=sm_scale)
        what = f"sm_scale={sm_scale} |q|~{magnitude} {causal}"
        assert_close(out.float().cpu(), ref.cpu(), **TOL[fp8], what=what)
        assert_lse_close(lse, ref_lse, atol=lse_tol(ref_lse), what=what)  # INT8 score error grows with the scores


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("magnitude", [2e3, 1e4])
def test_huge_scores_keep_p_in_range(family, fp8, magnitude):
    """bf16 |q|, |k| ~ magnitude: row maxima ~1e7 / ~1e8 in log2 units, whose ulps (1, 16) round the FP8 kernels'
    exponent shift m - log2(448) past log2(448), so that P's peak would saturate e4m3. P is one-hot or nearly, so the
    kernel must match the quantized algorithm closely (the FP8 kernels drifted to rel. L1 0.003-0.07 before)."""
    mod = module(family)
    q, k, v = make_qkv(b=1, hq=2, nq=256, nk=300, d=64, dtype=torch.bfloat16, seed=17)
    q, k = (torch.where(t < 0, -1.0, 1.0) * t.float().abs().clamp_min(0.2) * magnitude for t in (q, k))
    q, k = q.bfloat16(), k.bfloat16()
    out, lse = run(mod, q, k, v, "HND", lse=True)
    ref, ref_lse = reference_of(mod, q, k, v, "HND", fp8=fp8)
    assert_close(out.float().cpu(), ref.float(), cos=0.9999, rel_l1=0.01, what=f"|q|, |k| ~{magnitude:g}")
    # vs the same quantized scores: fp32 carries them to about 1e-7, the LSE to 1e-4 of its size
    assert_lse_close(lse, ref_lse, atol=2e-3 + 1e-4 * ref_lse.abs().max().item(), what=f"|q|, |k| ~{magnitude:g}")


@pytest.mark.parametrize("case", ["random", "causal", "rising", "jump", "huge"])
def test_sm90_d64_dual_loop(case):
    """From 4096 keys at head_dim 64 (kDualMinKeys, csrc/sm90/launch.cuh) the sm90 kernel runs its dual loop:
    exponents taken speculatively with the running max, and again where a row's max rose past kSpecRoom. 33 tiles
    (an odd count, the last one masked). rising: each tile's max past the last one's by several log2 units (taken again
    at every tile); jump: the second half of the keys 100x larger; huge: |q|, |k| ~ 2e3 in bf16 (maxima ~1e7 in log2
    units: the speculative exponents overflow fp32 until they are taken again)."""
    mod = module("sm90")
    nk = 4224
    dtype = torch.bfloat16 if case == "huge" else torch.float16
    q, k, v = make_qkv(b=1, hq=2, nq=nk if case == "causal" else 256, nk=nk, d=64, dtype=dtype, seed=41)
    if case == "rising":
        k = (k.float() * (1 + 40 * torch.arange(nk, device=k.device) / nk)[:, None]).half()
    elif case == "jump":
        k = torch.cat([k[:, :, : nk // 2], 100 * k[:, :, nk // 2:]], dim=2)
    elif case == "huge":
        q, k = ((torch.where(t < 0, -1.0, 1.0) * t.float().abs().clamp_min(0.2) * 2e3).bfloat16() for t in (q, k))
    out, _ = run(mod, q, k, v, "HND", causal=case == "causal")
    assert torch.isfinite(out).all(), case
    if case in ("random", "causal"):
        ref, _ = sdpa_fp32(q, k, v, is_causal=case == "causal")
        assert_close(out.float().cpu(), ref.cpu(), **TOL[True], what=case)
    else:  # scores past the quantization's resolution: against the quantized algorithm
        ref, _ = reference_of(mod, q, k, v, "HND", fp8=True)
        tol = dict(cos=0.9999, rel_l1=0.01) if case == "huge" else REF_TOL[True]
        assert_close(out.float().cpu(), ref.float(), **tol, what=case)


@pytest.mark.parametrize("family, fp8", FAMILIES)
def test_gqa_mqa_and_smooth_v(family, fp8):
    mod = module(family)
    for hk in (1, 2):
        q, k, v = make_qkv(b=2, hq=8, hk=hk, nq=256, nk=300, d=128, seed=hk)
        v = v + 2.0  # a V mean worth removing
        out, _ = run(mod, q, k, v, "HND", smooth_v=True)
        ref, _ = sdpa_fp32(q, k, v)
        assert_close(out.float().cpu(), ref.cpu(), **TOL[fp8], what=f"hk={hk} smooth_v")


@pytest.mark.parametrize("family, fp8", FAMILIES)
def test_lse_with_smoothing(family, fp8):
    mod = module(family)
    q, k, v = make_qkv(b=1, hq=2, nq=200, nk=300, d=64, k_bias=2.0, seed=3)
    _, lse = run(mod, q, k, v, "HND", lse=True, smooth_k=True)
    _, ref_lse = sdpa_fp32(q, k, v)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 200)
    assert (lse.cpu() - ref_lse.cpu()).abs().max().item() < 0.05


@pytest.mark.parametrize("family, fp8", FAMILIES)
def test_strided_and_unaligned_views(family, fp8):
    mod = module(family)
    q, k, v = make_qkv(b=1, hq=2, nq=100, nk=130, d=64, layout="NHD", strided=True, seed=11)
    out, _ = run(mod, q, k, v, "NHD")
    ref, _ = sdpa_fp32(q, k, v, "NHD")
    assert_close(out.float().cpu(), ref.cpu(), **TOL[fp8], what="strided views")
    # head_dims 60 and 100 (120- and 200-byte rows): no vector loads, and the output by 4-byte stores (sm90: no bulk
    # tensor stores), at both padded head_dims
    for seed, d in ((12, 60), (13, 100)):
        q, k, v = make_qkv(b=1, hq=2, nq=100, nk=130, d=d, seed=seed)
        out, _ = run(mod, q, k, v, "HND")
        ref, _ = sdpa_fp32(q, k, v)
        assert_close(out.float().cpu(), ref.cpu(), **TOL[fp8], what=f"d={d}")


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("long_heads", [False, True])
@pytest.mark.parametrize("smooth_v", [True, False])
def test_quantize_matches_reference_bit_for_bit(family, fp8, gran, d, long_heads, smooth_v):
    """INT8 Q and K (given the kernel's K mean) and the FP8 V^T (given its V mean, where smooth_v asks for one) equal
    the reference's. The sm90 module prepares short heads in clusters (one pass) and long ones like the other
    families: both are checked."""
    mod = module(family)
    nk = 11000 if long_heads else 333 if d == 128 else 1500  # d64: several statistics chunks per head
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=300, nk=nk, d=d, k_bias=2.0, q_outlier=4.0, seed=5)
    v_mode = V_FP8 if fp8 else V_16
    g = Granularity.named(gran)
    q_i8, q_s, k_i8, k_s, k_mean, v_out, v_s, v_mean = mod.quantize(q, k, v, False, g, g, v_mode, True, smooth_v,
                                                                    448.0)
    ref_kmean = reference.token_mean(k.cpu())
    assert torch.allclose(k_mean.cpu()[:, :, None, :], ref_kmean, rtol=1e-5, atol=1e-6)
    assert_int8_matches_reference(q, q_i8, q_s, q_grouping(gran, True), None, f"{gran} Q")
    assert_int8_matches_reference(k, k_i8, k_s, k_grouping(gran, True), k_mean.cpu()[:, :, None, :], f"{gran} K")
    if not smooth_v:
        assert v_mean is None
        if fp8:
            assert_fp8_v_matches_reference(v, v_out, v_s)
        else:
            assert torch.equal(v_out.cpu()[:, :, :nk, :d], v.cpu())
        return
    vm = v_mean.cpu()[:, :, None, :]
    assert torch.allclose(vm, reference.token_mean(v.cpu()), rtol=1e-5, atol=1e-6)
    if fp8:
        assert_fp8_v_matches_reference(v, v_out, v_s, vm)
    else:
        assert torch.equal(v_out.cpu()[:, :, :nk, :d], (v.cpu().float() - vm).to(v.dtype))


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("long_heads", [False, True])
def test_quantize_rounds_ties_like_the_reference(family, fp8, gran, long_heads):
    """Elements exactly halfway between two INT8 values (every group's scale 1) round as the reference's (half to
    even), in Q and in K, on the cluster path (short heads) and on prepare_kv (long ones)."""
    mod = module(family)
    x = rounding_ties(n=11000 if long_heads else 300)
    g = Granularity.named(gran)
    q_i8, q_s, k_i8, k_s, _, _, _, _ = mod.quantize(x, x, x, False, g, g, V_FP8 if fp8 else V_16, False, False, 448.0)
    assert_int8_matches_reference(x, q_i8, q_s, q_grouping(gran, True), None, f"{gran} Q")
    assert_int8_matches_reference(x, k_i8, k_s, k_grouping(gran, True), None, f"{gran} K")


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("nk", [4100, 11000])
def test_each_head_is_quantized_with_its_own_statistics(family, fp8, nk):
    """The preparation launch quantizes each head only after all of that head's statistics units (or, in clusters,
    programs) have finished, however the programs are scheduled: with many heads, each with its own channel bias and V
    range, and many statistics chunks per head, every head's K mean and V scale equal the reference's, on every
    repeat, and so do its INT8 K and FP8 V. At 4100 keys the sm90 module prepares 240 K/V heads in clusters, more
    than run at once; at 11000 its heads are too long for its clusters."""
    mod = module(family)
    b, hk, d = 3, 40, 64  # 17 or more statistics chunks per head for K and for V, 120 heads
    gen = torch.Generator().manual_seed(11)
    k = torch.randn(b, hk, nk, d, generator=gen) + 4 * torch.randn(b, hk, 1, d, generator=gen)
    v = torch.randn(b, hk, nk, d, generator=gen) * torch.rand(b, hk, 1, d, generator=gen).mul(8).exp2()
    q, k, v = (x.to("cuda", torch.float16) for x in (torch.randn(b, hk, 64, d, generator=gen), k, v))
    ref_kmean = reference.token_mean(k.cpu())[:, :, 0]
    gran = "per_thread"
    for _ in range(3):
        _, _, k_i8, k_s, k_mean, v_out, v_s, _ = mod.quantize(q, k, v, False, Granularity.named(gran), Granularity.named(gran),
                                                              V_FP8 if fp8 else V_16, True, False, 448.0)
        worst = (k_mean.cpu() - ref_kmean).abs().amax(-1).argmax().item()
        assert torch.allclose(k_mean.cpu(), ref_kmean, rtol=1e-5, atol=1e-5), f"head {divmod(worst, hk)}: K mean"
        assert_int8_matches_reference(k, k_i8, k_s, k_grouping(gran, True), k_mean.cpu()[:, :, None, :], "K")
        if fp8:
            assert_fp8_v_matches_reference(v, v_out, v_s)


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("long_heads", [False, True])
def test_quantize_marks_non_finite_k_groups_like_the_reference(family, fp8, gran, d, long_heads):
    """K groups holding inf, -inf or NaN get a NaN scale, exactly where the reference's do, and every other group
    keeps its INT8 values and scale; padding keys (nk not a multiple of 64) stay out of every group. K's group
    maximum at head_dim 128 comes from per-channel extremes, at 64 from each element."""
    mod = module(family)
    nk = 11000 if long_heads else 333
    q, k, v = make_qkv(b=1, hq=2, hk=2, nq=64, nk=nk, d=d, k_bias=2.0, seed=6)
    k = k.clone()
    for (h, key, c), value in {(0, 5, 3): float("inf"), (0, 70, d - 1): float("-inf"), (1, 130, 0): float("nan"),
                               (1, nk - 1, 7): float("inf")}.items():
        k[0, h, key, c] = value
    g = Granularity.named(gran)
    _, _, k_i8, k_s, _, _, _, _ = mod.quantize(q, k, v, False, g, g, V_FP8 if fp8 else V_16, False, False, 448.0)
    marked = k_s.cpu()[:, :, :nk].isnan()
    assert marked.any() and not marked.all(), "the test must mark some groups and leave others"
    assert_int8_matches_reference(k, k_i8, k_s, k_grouping(gran, True), None, f"{gran} K")


def assert_int8_matches_reference(x, x_i8, x_scale, grouping, mean, what):
    """The module's INT8 rows of x and their per-row scales equal the reference's (groups of `grouping`, x minus
    `mean`); padding rows are zero. Groups holding inf or NaN have a NaN scale in both, and their INT8 values are not
    compared (the reference's trunc of NaN is not defined)."""
    n, d = x.shape[2], x.shape[3]
    r_i8, r_s = reference.quantize_int8(x.cpu(), grouping, mean)
    r_s = reference.expand_groups(r_s, grouping, n)
    got_s = x_scale.cpu()[:, :, :n]
    assert torch.equal(got_s.isnan(), r_s.isnan()), f"{what}: non-finite groups differ"
    finite = ~r_s.isnan()
    assert torch.equal(got_s[finite], r_s[finite]), f"{what}: scales differ"
    assert torch.equal(x_i8.cpu()[:, :, :n, :d][finite], r_i8[finite]), f"{what}: INT8 values differ"
    assert not x_i8.cpu()[:, :, n:].any(), f"{what}: padding rows must be zero"


def assert_fp8_v_matches_reference(v, v_out, v_scale, v_mean=None):
    """The module's FP8 V^T (keys in the P·V MMA's order) and V scales equal the reference's given V's mean; padding
    keys are zero."""
    nk = v.shape[2]
    r_v, r_s = reference.quantize_v_fp8(v.cpu(), v_mean)
    slot = torch.tensor([_fp8_key_slot(j % 32) + j // 32 * 32 for j in range(v_out.shape[-1])])
    v_keys = v_out.cpu()[..., slot].transpose(-1, -2)  # back to [B, H, N, D] in key order
    assert torch.equal(v_scale.cpu(), r_s), "V scales differ"
    assert torch.equal(v_keys[:, :, :nk, :v.shape[3]].view(torch.uint8), r_v.view(torch.uint8)), "FP8 V differs"
    assert not v_keys[:, :, nk:].view(torch.uint8).any(), "padding keys must be zero"


def _fp8_key_slot(key: int) -> int:
    """csrc/common/prepare/v_rewrite.cuh fp8_key_slot: where key (0..31) of a 32-key group sits in V^T."""
    r = key % 16
    return key // 16 * 16 + (r % 8) // 2 * 4 + r // 8 * 2 + r % 2


@pytest.mark.parametrize("family, fp8", FAMILIES)
def test_large_v_fp16_accumulator_is_redone_in_fp32(family, fp8):
    """fp16 per-tile accumulators that would overflow (|V| ~ 3e4) must not give inf where SDPA is finite."""
    mod = module(family)
    q, k, v = make_qkv(b=1, hq=2, nq=128, nk=256, d=64, seed=9)
    v = (v * 1e4).clamp(-6e4, 6e4)
    out, _ = run(mod, q, k, v, "HND", accum=ACC_F16_INNER)
    ref, _ = sdpa_fp32(q, k, v)
    assert torch.isfinite(out).all()
    assert metrics(out.float().cpu(), ref.cpu())["cos"] > 0.99


@pytest.mark.parametrize("family", ["sm89", "sm90"])
def test_pv8_f16_accumulator_only_where_the_family_has_it(family):
    """The flag the module reports (it decides V's +-2.25 scaling) is archs.py's "f16_accum" under nvcc >= 12.8."""
    mod = module(family)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on the PATH: the build's version is unknown")
    version = build_rules.parse_nvcc_version(subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout)
    has = archs.FAMILIES[family].get("f16_accum", False)
    assert mod.FP8_F16_ACCUM == (has and version >= archs.version_tuple(archs.FP8_F16_ACCUM_MIN_CUDA))


@pytest.mark.parametrize("family, fp8", FAMILIES)
@pytest.mark.parametrize("d", [64, 128])
def test_each_query_finds_its_key(family, fp8, d):
    """A diagnostic of the tile addressing: query i equals key sigma(i) (random +-1 vectors, so its score d stands far
    above the others' ~sqrt(d)), softmax is then an argmax, and V spells each key's index in bits (channel c holds
    bit c % 9 as +-1, exact in e4m3). Each output row must spell sigma(i); a wrong Q, K or V^T layout (swizzle,
    descriptor, key order, channel order) shows as the rows that name another key."""
    mod = module(family)
    nq, nk = 200, 333
    gen = torch.Generator().manual_seed(d)
    k = torch.randint(0, 2, (1, 2, nk, d), generator=gen).float() * 2 - 1
    sigma = (torch.arange(nq) * 37) % nk
    q = k[:, :, sigma]
    bits = torch.arange(d) % 9
    v = ((torch.arange(nk)[:, None] >> bits[None, :]) & 1).float() * 2 - 1
    v = v.expand(1, 2, nk, d)
    q, k, v = (t.half().cuda() for t in (q, k, v))
    out, _ = run(mod, q, k, v, "HND", smooth_k=False, sm_scale=1.0)
    groups = d // 9
    spelled = ((out.float().cpu() > 0).long() << bits)[..., :groups * 9].view(1, 2, nq, groups, 9).sum(-1)
    wrong = (spelled != sigma[None, None, :, None]).any(-1)  # any whole 9-channel group spelling another key
    examples = [(h, r, sigma[r].item(), spelled[0, h, r, 0].item()) for h, r in wrong[0].nonzero().tolist()[:6]]
    assert not wrong.any(), (f"{family} d={d}: {wrong.sum().item()} of {wrong.numel()} rows found another key, e.g. "
                             f"(head, row, want, got) {examples}")


def test_memcheck_clean_on_small_odd_shapes():
    """compute-sanitizer finds no out-of-bounds or misaligned access on odd lengths, head dims, GQA, layouts."""
    module("sm80")
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not installed")
    script = Path(__file__).with_name("memcheck_cases.py")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(script)],
                         capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0 and "memcheck cases done" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
    assert "ERROR SUMMARY: 0 errors" in run.stdout + run.stderr
    for family in (f for f, _ in FAMILIES if find_module(f)[0] is not None):
        assert f"memcheck family {family}" in run.stdout, f"{family} is built for this GPU but was not checked"

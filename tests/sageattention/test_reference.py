"""The PyTorch reference of the quantized algorithm against float64 attention (pure PyTorch, CPU)."""
import math

import pytest
import torch

from sageattention import reference
from sageattention.quant_groups import GRANULARITIES, K_BLOCK, Q_BLOCK, k_grouping, q_grouping
from tests.sageattention.helpers import TOL, assert_close, assert_lse_close, make_qkv, metrics, rounding_ties

CPU = torch.device("cpu")


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_close_to_fp64(pv, gran, is_causal, dtype):
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=150, nk=200, d=64, dtype=dtype, seed=1, device=CPU)
    out, lse = reference.sage_attention_reference(q, k, v, is_causal=is_causal, qk_quant_gran=gran, pv_dtype=pv)
    ref, ref_lse = reference.attention_fp64(q, k, v, is_causal=is_causal)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_close(out, ref, cos=TOL[pv]["cos"], rel_l1=TOL[pv]["l1"], what=f"{pv}/{gran}")
    # causal (top-left): the first rows see a key or two, whose INT8 score error no sum averages out
    assert_lse_close(lse, ref_lse, atol=0.05 if is_causal else 0.02)


@pytest.mark.parametrize("smooth_v", [False, True])
def test_reference_fp8_smooth_v(smooth_v):
    q, k, v = make_qkv(hq=2, nq=128, d=64, seed=2, device=CPU)
    v = v + 4.0  # a common offset: what V smoothing takes out before the FP8 cast
    out, _ = reference.sage_attention_reference(q, k, v, pv_dtype="fp8", smooth_v=smooth_v)
    assert_close(out, reference.attention_fp64(q, k, v)[0], cos=0.999, rel_l1=0.05 if smooth_v else 0.06)


def test_k_smoothing_removes_channel_bias():
    """A large per-channel K bias ruins unsmoothed INT8 K; smoothing makes it harmless (softmax is shift-invariant)."""
    q, k, v = make_qkv(hq=2, nq=128, d=64, seed=3, device=CPU, k_bias=20.0)
    ref, ref_lse = reference.attention_fp64(q, k, v)
    smooth, lse = reference.sage_attention_reference(q, k, v, smooth_k=True)
    raw, _ = reference.sage_attention_reference(q, k, v, smooth_k=False)
    assert_close(smooth, ref, cos=TOL["fp16"]["cos"], rel_l1=TOL["fp16"]["l1"])
    assert metrics(raw, ref)["rel_l1"] > 2 * metrics(smooth, ref)["rel_l1"]
    # the LSE adds back sm_scale * q . mean(k), so it is the LSE of the unshifted scores
    assert_lse_close(lse, ref_lse, atol=0.05)


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", ["nq_nk", "b1_nq_nk", "b_h_nq_nk"])
def test_reference_mask(kind, shape):
    b, h, nq, nk = 2, 2, 70, 90
    q, k, v = make_qkv(b=b, hq=h, nq=nq, nk=nk, d=32, seed=4, device=CPU)
    full = {"nq_nk": (nq, nk), "b1_nq_nk": (b, 1, nq, nk), "b_h_nq_nk": (b, h, nq, nk)}[shape]
    gen = torch.Generator().manual_seed(5)
    keep = torch.rand(full, generator=gen) > 0.3
    keep[..., 0] = True
    mask = keep if kind == "bool" else torch.where(keep, torch.randn(full, generator=gen), -math.inf).half()
    out, lse = reference.sage_attention_reference(q, k, v, attn_mask=mask)
    sdpa_mask = mask if kind == "bool" else mask.float()
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=sdpa_mask)
    assert_close(out, sdpa, cos=TOL["fp16"]["cos"], rel_l1=TOL["fp16"]["l1"])
    assert_close(reference.attention_fp64(q, k, v, attn_mask=mask)[0], sdpa, cos=0.99999, rel_l1=1e-3)


def test_fully_masked_rows_give_zero_and_neg_inf_lse():
    q, k, v = make_qkv(hq=2, nq=40, nk=50, d=32, seed=6, device=CPU)
    mask = torch.ones(40, 50, dtype=torch.bool)
    mask[[0, 7, 39]] = False
    for pv in ("fp16", "fp8"):
        out, lse = reference.sage_attention_reference(q, k, v, attn_mask=mask, pv_dtype=pv)
        assert torch.isfinite(out).all()
        assert (out[:, :, [0, 7, 39]] == 0).all()
        assert torch.isneginf(lse[:, :, [0, 7, 39]]).all() and torch.isfinite(lse[:, :, 1]).all()
    ref, ref_lse = reference.attention_fp64(q, k, v, attn_mask=mask)
    assert (ref[:, :, 0] == 0).all() and torch.isneginf(ref_lse[:, :, 0]).all()


@pytest.mark.parametrize("nq,nk", [(1, 50), (30, 50), (50, 50), (50, 30)])
def test_causal_is_top_left_like_sdpa(nq, nk):
    q, k, v = make_qkv(hq=2, nq=nq, nk=nk, d=32, seed=7, device=CPU)
    out, _ = reference.attention_fp64(q, k, v, is_causal=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    torch.testing.assert_close(out, sdpa)


@pytest.mark.parametrize("nq,nk", [(1, 50), (30, 50), (50, 50)])
def test_bottom_right_offset_is_kv_cache_decoding(nq, nk):
    """Offset nk - nq: the last nq queries of a causal nk x nk attention are exactly a causal nq x nk attention."""
    q, k, v = make_qkv(hq=2, nq=nk, d=32, seed=7, device=CPU)
    full, full_lse = reference.attention_fp64(q, k, v, is_causal=True)
    tail, tail_lse = reference.attention_fp64(q[:, :, -nq:], k, v, is_causal=True, causal_offset=nk - nq)
    torch.testing.assert_close(tail, full[:, :, -nq:])
    torch.testing.assert_close(tail_lse, full_lse[:, :, -nq:])


def test_causal_mask_alignments():
    """Top-left: query i sees keys j <= i; bottom-right with nq > nk: the first nq - nk queries see no key."""
    assert reference.causal_mask(5, 3).sum(dim=1).tolist() == [1, 2, 3, 3, 3]
    m = reference.causal_mask(5, 3, offset=3 - 5)
    assert not m[:2].any() and m[2:].sum(dim=1).tolist() == [1, 2, 3]


@pytest.mark.parametrize("gran", GRANULARITIES)
def test_quant_group_membership(gran):
    """Tokens share a Q scale exactly as documented: per_block Q_BLOCK tokens, per_warp 32, per_thread
    rows r, r+8, r+16, r+24 of each warp's 32; K: K_BLOCK-token blocks, per_thread the columns of
    one lane, (j % 8) // 2, within 64 keys (the m16n8k32 fragment layout)."""
    n = 256
    mags = torch.arange(1, n + 1, dtype=torch.float32)  # distinct row maxima
    x = (torch.ones(1, 1, n, 16) * mags[None, None, :, None]).half()
    for grouping, same in (
        (q_grouping(gran), {"per_block": lambda i: i // Q_BLOCK, "per_warp": lambda i: i // 32,
                            "per_thread": lambda i: (i // 32, i % 8)}[gran]),
        (k_grouping(gran), {"per_block": lambda j: j // K_BLOCK, "per_warp": lambda j: j // K_BLOCK,
                            "per_thread": lambda j: (j // 64, (j % 8) // 2)}[gran]),
    ):
        _, scale = reference.quantize_int8(x, grouping)
        tok = reference.expand_groups(scale, grouping, n)[0, 0]
        for i in range(0, n, 7):
            for j in range(0, n, 5):
                assert (tok[i] == tok[j]) == (same(i) == same(j)), (gran, i, j)


@pytest.mark.parametrize("gran", GRANULARITIES)
def test_quantize_int8_roundtrip(gran):
    x = make_qkv(hq=2, nq=100, d=64, seed=8, device=CPU)[0]
    x[0, 0, 5] = 0  # an all-zero row
    g = q_grouping(gran)
    q8, scale = reference.quantize_int8(x, g)
    tok = reference.expand_groups(scale, g, 100)[..., None]
    assert q8.dtype == torch.int8 and q8.abs().max() <= 127
    assert ((q8.float() * tok - x.float()).abs() <= tok / 2 + 1e-6).all()
    assert (q8.abs().amax(dim=-1) > 0).sum() == x.shape[1] * 100 - 1  # every nonzero row uses its range


@pytest.mark.parametrize("gran", GRANULARITIES)
def test_quantize_int8_rounds_half_to_even(gran):
    """The kernels' rounding (one add of 1.5 * 2**23) is half to even: 2.5 -> 2, 3.5 -> 4, -0.5 -> 0."""
    x = rounding_ties(device=CPU)
    q8, scale = reference.quantize_int8(x, q_grouping(gran))
    assert (scale == 1).all()
    y = x.float()
    want = torch.where((y.floor() % 2 == 0), y.floor(), y.ceil())  # the even neighbour of each half-integer
    want[..., 0] = 127
    assert torch.equal(q8, want.to(torch.int8))


def test_quantize_v_fp8_per_channel():
    v = make_qkv(hq=2, nq=100, d=64, seed=9, device=CPU)[2] * 3
    v8, scale = reference.quantize_v_fp8(v)
    assert v8.dtype == torch.float8_e4m3fn and scale.shape == (1, 2, 64)
    torch.testing.assert_close(scale, v.float().abs().amax(dim=2) / 448)
    deq = v8.float() * scale[:, :, None, :]
    assert ((deq - v.float()).abs() <= v.float().abs() / 16 + scale[:, :, None, :] / 512).all()


@pytest.mark.parametrize("gran", GRANULARITIES)
def test_compiled_groups_fit_the_mma_fragments(gran):
    """What the compiled kernels (mma.sync m16n8k32 and wgmma m64nNk32 alike) assume of their quantization groups:
    the rows g and g + 8 of each 16-row band that one lane holds share a Q scale, and the keys 8j + 2t + {0, 1}
    (j = 0..7) that one lane holds of each 64 keys share a K scale, so a lane dequantizes a 64-key slice with one
    Q·K scale product per row (a 128-key wgmma tile: one per 64-key half)."""
    n = 256
    x = (torch.ones(1, 1, n, 16) * torch.arange(1, n + 1, dtype=torch.float32)[None, None, :, None]).half()
    for grouping, members in (
        (q_grouping(gran, compiled=True), [[band + g, band + g + 8] for band in range(0, n, 16) for g in range(8)]),
        (k_grouping(gran, compiled=True),
         [[h + 8 * j + 2 * t + e for j in range(8) for e in range(2)] for h in range(0, n, 64) for t in range(4)]),
    ):
        _, scale = reference.quantize_int8(x, grouping)
        tok = reference.expand_groups(scale, grouping, n)[0, 0]
        for rows in members:
            assert (tok[rows] == tok[rows[0]]).all(), (gran, rows)

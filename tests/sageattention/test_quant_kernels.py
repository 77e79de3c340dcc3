"""Triton quantization kernels vs the reference quantizers: bit-exact INT8 values, scales and FP8 V."""
import pytest
import torch

from sageattention import reference
from sageattention.quant_groups import GRANULARITIES, K_BLOCK, k_grouping, q_grouping
from sageattention.triton import quant
from sageattention.inputs import to_hnd
from tests.sageattention.helpers import make_qkv, rounding_ties

SHAPES = [  # (heads, tokens, head_dim): tokens not a multiple of any block, odd head_dims
    (2, 100, 64),
    (1, 200, 96),
    (3, 1, 32),
    (2, 128, 128),
]


def _assert_int8_matches(x_hnd, grouping, mean=None, seg=None, ref_mean=None):
    got, got_scale = quant.quantize_int8(x_hnd, grouping, mean, seg)
    want, want_scale = reference.quantize_int8(x_hnd.cpu(), grouping, None if ref_mean is None else ref_mean.cpu())
    n = x_hnd.shape[2]
    assert got.dtype == torch.int8 and got.shape == x_hnd.shape and got_scale.shape == x_hnd.shape[:3]
    assert torch.equal(got_scale.cpu(), reference.expand_groups(want_scale, grouping, n)), "scales differ"
    mism = (got.cpu() != want).sum().item()
    assert mism == 0, f"{mism} int8 values differ"


@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("h,n,d", SHAPES)
def test_int8_q_exact(gran, layout, h, n, d):
    q = make_qkv(b=2, hq=h, nq=n, d=d, layout=layout, seed=n + d, strided=layout == "HND")[0]
    _assert_int8_matches(to_hnd(q, layout), q_grouping(gran))


@pytest.mark.parametrize("gran", GRANULARITIES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("h,n,d", SHAPES)
def test_int8_k_smoothed_exact(gran, layout, h, n, d):
    k = to_hnd(make_qkv(b=2, hq=h, nq=n, d=d, layout=layout, seed=n * d, k_bias=5.0)[1], layout)
    mean = reference.token_mean(k).to(k.device)
    _assert_int8_matches(k, k_grouping(gran), mean, ref_mean=mean)


@pytest.mark.parametrize("gran", GRANULARITIES)
def test_int8_rounding_ties_exact(gran):
    """Elements exactly halfway between two INT8 values round like the reference (half to even)."""
    x = rounding_ties()
    _assert_int8_matches(x, q_grouping(gran))
    _assert_int8_matches(x, k_grouping(gran))


def test_int8_k_segment_mean_exact():
    """Packed varlen keys: each token subtracts the mean of its own sequence."""
    k = make_qkv(hq=2, nq=150, d=64, seed=11, k_bias=3.0)[1]
    lengths = torch.tensor([40, 77, 33])
    seg = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), lengths).to(k.device)
    means = torch.stack([reference.token_mean(part)[:, :, 0] for part in k.split(lengths.tolist(), dim=2)], dim=2)
    _assert_int8_matches(k, k_grouping("per_block"), means.to(k.device), seg, ref_mean=means[:, :, seg.long().cpu()])


def test_int8_values_use_full_range_and_zero_groups():
    n = 2 * K_BLOCK + 2
    x = make_qkv(hq=1, nq=n, d=64, seed=12)[0].clone()
    x[:, :, K_BLOCK:2 * K_BLOCK] = 0  # the second K block all zero -> scale 1, values 0
    got, scale = quant.quantize_int8(x, k_grouping("per_block"))
    assert (scale[:, :, K_BLOCK:2 * K_BLOCK] == 1).all() and (got[:, :, K_BLOCK:2 * K_BLOCK] == 0).all()
    assert got[:, :, :K_BLOCK].abs().max() == 127 and got[:, :, 2 * K_BLOCK:].abs().max() == 127


@pytest.mark.parametrize("smooth_v", [False, True])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("h,n,d", SHAPES)
def test_fp8_v_exact(smooth_v, layout, h, n, d):
    v = to_hnd(make_qkv(b=2, hq=h, nq=n, d=d, layout=layout, seed=n + 3 * d)[2], layout) * 3 + 1
    mean = v.mean(dim=2, dtype=torch.float32).contiguous() if smooth_v else None
    vt, scale = quant.quantize_v_fp8(v, mean)
    want, want_scale = reference.quantize_v_fp8(v.cpu(), None if mean is None else mean[:, :, None, :].cpu())
    n_pad = vt.shape[-1]
    assert vt.dtype == torch.float8_e4m3fn and vt.shape[:3] == (2, h, d) and n_pad % 16 == 0 and n_pad >= n
    assert torch.equal(scale.cpu(), want_scale), "per-channel V scales differ"
    got = vt[..., :n].transpose(-1, -2).cpu()
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), "fp8 V values differ"


def test_fp8_v_tiny_negatives_round_to_negative_zero():
    """Values under half of e4m3's smallest subnormal round to zero with their sign, as torch's cast does."""
    v = make_qkv(hq=1, nq=64, d=32, seed=17)[2].clone()
    v[0, 0, 0] = 448.0  # scale 1 for every channel that reaches 448 ...
    v[0, 0, 1:9] = -0.0005  # ... so these are below 2**-10
    vt, _ = quant.quantize_v_fp8(v)
    want, _ = reference.quantize_v_fp8(v.cpu())
    got = vt[..., :64].transpose(-1, -2).cpu()
    assert (want[0, 0, 1:9].view(torch.uint8) == 0x80).any(), "the case must produce -0"
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_nan_makes_group_scale_nan():
    """A NaN in a group poisons that group's scale (so it reaches the output), not the others."""
    x = make_qkv(hq=1, nq=128, d=32, seed=13)[0].clone()
    x[0, 0, 3, 5] = float("nan")
    g = q_grouping("per_warp")
    _, scale = quant.quantize_int8(x, g)
    _, want = reference.quantize_int8(x.cpu(), g)
    torch.testing.assert_close(scale.cpu(), reference.expand_groups(want, g, 128), rtol=0, atol=0, equal_nan=True)
    assert scale[0, 0, :32].isnan().all() and not scale[0, 0, 32:].isnan().any()


@pytest.mark.parametrize("with_k,with_v,smooth_v", [(True, True, False), (True, False, False), (False, True, True)])
def test_token_stats_one_pass(with_k, with_v, smooth_v):
    """The fused K-mean / V-absmax pass vs torch, on a length with a partial last block."""
    _, k, v = make_qkv(b=2, hq=3, nq=1100, d=64, seed=14, k_bias=4.0)  # 3 chunks, the last partial
    v = v * 5 - 2
    v_mean = v.mean(dim=2, dtype=torch.float32).contiguous() if smooth_v else None
    k_mean, v_amax = quant.token_stats(k if with_k else None, v if with_v else None, v_mean)
    if with_k:
        torch.testing.assert_close(k_mean, k.float().mean(dim=2, keepdim=True), rtol=1e-5, atol=1e-5)
    else:
        assert k_mean is None
    if with_v:
        centred = v.float() - (v_mean[:, :, None, :] if smooth_v else 0)
        torch.testing.assert_close(v_amax, centred.abs().amax(dim=2), rtol=0, atol=0)
    else:
        assert v_amax is None


@pytest.mark.parametrize("gran", GRANULARITIES)
def test_two_jobs_in_one_launch_match_separate_launches(gran):
    """The pipeline's two launches (INT8 Q + K/V statistics, INT8 K + FP8 V^T) share one grid between jobs of
    different head counts and lengths; each job's results equal those of its own launch."""
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=300, nk=700, d=64, seed=15, k_bias=2.0)
    q_job, stats = quant.Int8Job(q, q_grouping(gran)), quant.KVJob(k, v)
    quant.launch(q_job, stats)
    k_mean, v_amax = stats.finalize()
    want_k_mean, want_v_amax = quant.token_stats(k, v)
    assert torch.equal(k_mean, want_k_mean) and torch.equal(v_amax, want_v_amax)
    assert all(torch.equal(a, b) for a, b in zip((q_job.out, q_job.scale), quant.quantize_int8(q, q_grouping(gran))))
    k_job, v_job = quant.Int8Job(k, k_grouping(gran), k_mean), quant.KVJob(None, v, None, v_amax)
    quant.launch(k_job, v_job)
    want = quant.quantize_int8(k, k_grouping(gran), k_mean)
    assert torch.equal(k_job.out, want[0]) and torch.equal(k_job.scale, want[1])
    want_v, want_scale = quant.quantize_v_fp8(v, None, v_amax)
    n = v.shape[2]  # tokens past n are padding, never written
    assert torch.equal(v_job.out[..., :n].view(torch.uint8), want_v[..., :n].view(torch.uint8))
    assert torch.equal(v_job.scale, want_scale)

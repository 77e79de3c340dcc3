"""sm_scale: every finite value of magnitude up to inputs.MAX_SM_SCALE gives the quantized algorithm's result (negative
and zero included), anything else a clear error, on every public function."""
import numpy as np
import pytest
import torch

import sageattention as sa
from sageattention.inputs import MAX_SM_SCALE
from tests.sageattention.helpers import (
    TOL, VARIANT_IDS, VARIANTS, assert_close, assert_lse_close, check_variant_vs_reference, fp64_out, make_qkv,
    cu_seqlens, oracle_args, reference_out, skip_unless_runs,
)


def _varlen(q, k, v, sm_scale):
    """sageattn_varlen on a batch of one sequence (q, k, v HND [1, H, N, D])."""
    qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
    cu_q, cu_k = cu_seqlens([qp.shape[0]], device=q.device), cu_seqlens([kp.shape[0]], device=q.device)
    out = sa.sageattn_varlen(qp, kp, vp, cu_q, cu_k, qp.shape[0], kp.shape[0], sm_scale=sm_scale)
    return out.transpose(0, 1)[None]


# ---------------------------------------------------------------- errors

BAD = {  # sm_scale -> (exception, message fragment)
    "bool": (True, TypeError, "sm_scale must be a float"),
    "str": ("0.1", TypeError, "sm_scale must be a float"),
    "tensor": (torch.tensor(0.1), TypeError, r"float\(t\)"),
    "nan": (float("nan"), ValueError, "must be finite"),
    "inf": (float("inf"), ValueError, "must be finite"),
    "-inf": (float("-inf"), ValueError, "must be finite"),
    "too_large": (-1e39, ValueError, r"\|sm_scale\| <= 2.36e\+38"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_bad_sm_scale(var, case):
    value, exc, fragment = BAD[case]
    with pytest.raises(exc, match=fragment):
        var(*make_qkv(hq=2, nq=8, d=32), sm_scale=value)


@pytest.mark.parametrize("case", list(BAD))
def test_bad_sm_scale_varlen(case):
    value, exc, fragment = BAD[case]
    with pytest.raises(exc, match=fragment):
        _varlen(*make_qkv(hq=2, nq=8, d=32), value)


def test_sm_scale_number_types():
    """ints and numpy floats are numbers too; the largest accepted magnitude runs."""
    q, k, v = make_qkv(hq=2, nq=16, d=32)
    want = sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, sm_scale=0.25)
    assert torch.equal(sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, sm_scale=np.float32(0.25)), want)
    assert torch.isfinite(sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, sm_scale=1)).all()
    # q = 0: every score is 0, at any scale (the kernels' intermediate products of the scale stay finite)
    out = sa.sageattn_qk_int8_pv_fp16_triton(torch.zeros_like(q), k, v, sm_scale=-MAX_SM_SCALE)
    torch.testing.assert_close(out, v.float().mean(dim=2, keepdim=True).expand_as(out).half(), rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------- values

# Ordinary magnitudes: the reference and float64 thresholds of every other accuracy test.
SCALES = {"negative": -0.125, "zero": 0.0, "negative_zero": -0.0, "tiny": 1e-6, "tiny_negative": -1e-30}


@pytest.mark.parametrize("name", list(SCALES))
@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_sm_scale_values(var, name):
    skip_unless_runs(var)
    q, k, v = make_qkv(hq=2, nq=64, nk=80, d=64, seed=41)
    check_variant_vs_reference(var, q, k, v, sm_scale=SCALES[name])


def _check_large_scores(var, q, k, v, layout="HND", **kw):
    """Scores of tens to thousands: the quantized algorithm's result; float64's only loosely (INT8 score error grows
    with the scores, and picks slightly different winners where softmax is an argmax); the LSE to a relative 1e-4."""
    out, lse = var(q, k, v, layout, return_lse=True, **kw)
    ref, ref_lse = reference_out(q, k, v, layout, pv=var.pv, **kw, **oracle_args(var, q, layout))
    assert_close(out.cpu(), ref, cos=TOL[var.pv]["ref_cos"], rel_l1=TOL[var.pv]["ref_l1"], what="vs reference")
    assert_close(out.cpu(), fp64_out(q, k, v, layout, **kw)[0], cos=0.95, rel_l1=0.1, what="vs float64")
    assert_lse_close(lse, ref_lse, atol=2e-3 + 1e-4 * ref_lse.abs().max().item())


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_negative_sm_scale_with_large_scores(var):
    """Scores of tens of log2 units with a negative scale: each row's max is its most negative q·k."""
    skip_unless_runs(var)
    q, k, v = make_qkv(hq=2, nq=64, nk=80, d=64, seed=42, layout="NHD")
    _check_large_scores(var, q * 3, k * 3, v, "NHD", sm_scale=-1.0)


@pytest.mark.parametrize("sm_scale", [1e3, -1e3])
@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_huge_sm_scale(var, sm_scale):
    skip_unless_runs(var)
    q, k, v = make_qkv(hq=2, nq=64, nk=80, d=64, seed=43)
    _check_large_scores(var, q, k, v, sm_scale=sm_scale)


@pytest.mark.parametrize("sm_scale", [-0.125, 0.0, 1e-6, -1.0])
def test_varlen_sm_scale(sm_scale):
    """One packed sequence (per-block scales, 16-bit P·V; no one-FMA path: packed tiles have no single K scale)."""
    q, k, v = make_qkv(hq=2, nq=70, d=64, seed=44)
    if sm_scale == -1.0:
        q, k = q * 3, k * 3
    out = _varlen(q, k, v, sm_scale)
    ref = reference_out(q, k, v, gran="per_block", sm_scale=sm_scale)[0]
    assert_close(out.cpu(), ref, cos=TOL["fp16"]["ref_cos"], rel_l1=TOL["fp16"]["ref_l1"], what="vs reference")
    tol = (0.95, 0.1) if sm_scale == -1.0 else (TOL["fp16"]["cos"], TOL["fp16"]["l1"])
    assert_close(out.cpu(), fp64_out(q, k, v, sm_scale=sm_scale)[0], cos=tol[0], rel_l1=tol[1], what="vs float64")


def test_negative_sm_scale_reverses_the_ranking():
    """sm_scale = -s attends like +s with q negated (the LSE too)."""
    q, k, v = make_qkv(hq=2, nq=64, nk=80, d=64, seed=45)
    out, lse = sa.sageattn(q, k, v, sm_scale=-0.2, return_lse=True)
    want, want_lse = sa.sageattn(-q, k, v, sm_scale=0.2, return_lse=True)
    assert torch.equal(out, want)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-5)

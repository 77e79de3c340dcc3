"""sageattention.flash_attn_compat: flash-attn's and SDPA's calling conventions, honoured or refused by name."""
import pytest
import torch

import sageattention as sa
from sageattention.flash_attn_compat import flash_attn_forward, flash_attn_func, scaled_dot_product_attention
from tests.sageattention.helpers import (
    TOL, assert_close, assert_lse_close, lse_tol, make_qkv, sageattn_pv, sdpa_fp32,
)

PV_TOL = TOL[sageattn_pv()]


def test_flash_attn_func_bottom_right_causal_gqa_scale():
    """flash-attn's conventions: NHD, GQA, causal aligned bottom-right when Sq != Sk, softmax_scale, lse [B, H, Sq]
    fp32, and the accepted no-op values of the arguments it cannot vary."""
    q, k, v = make_qkv(b=2, hq=4, hk=2, nq=40, nk=100, d=64, layout="NHD", seed=1)
    out, lse, probs = flash_attn_func(q, k, v, 0.0, 0.1, causal=True, window_size=[-1, -1], softcap=0.0,
                                      deterministic=True, return_attn_probs=True)
    ref, ref_lse = sdpa_fp32(q, k, v, "NHD", is_causal=True, sm_scale=0.1, causal_offset=100 - 40)
    assert probs is None and out.dtype == q.dtype and lse.shape == (2, 4, 40)
    assert_close(out.float(), ref, cos=PV_TOL["cos"], rel_l1=PV_TOL["l1"])
    assert_lse_close(lse, ref_lse, atol=lse_tol(ref_lse))


def test_flash_attn_forward_runs_a_named_kernel():
    """A ring step as yunchang's SAGE_FP16 type would run it: the named variant with its own keyword arguments."""
    q, k, v = make_qkv(b=1, hq=2, nq=64, d=64, layout="NHD", seed=2)
    out, lse = flash_attn_forward(q, k, v, 0.0, None, causal=True, return_softmax=False,
                                  kernel=sa.sageattn_qk_int8_pv_fp16_cuda, pv_accum_dtype="fp32")
    ref, ref_lse = sdpa_fp32(q, k, v, "NHD", is_causal=True)
    assert_close(out.float(), ref, cos=TOL["fp16"]["cos"], rel_l1=TOL["fp16"]["l1"])
    assert_lse_close(lse, ref_lse, atol=lse_tol(ref_lse))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # _cuda variant on Triton
def test_flash_attn_func_plain_output_and_unknown_keywords():
    q, k, v = make_qkv(b=1, hq=2, nq=48, nk=80, d=32, layout="NHD", seed=3)
    out = flash_attn_func(q, k, v)
    assert_close(out.float(), sdpa_fp32(q, k, v, "NHD")[0], cos=PV_TOL["cos"], rel_l1=PV_TOL["l1"])
    with pytest.raises(TypeError, match="unexpected keyword"):
        flash_attn_func(q, k, v, no_such_argument=1)
    with pytest.raises(ValueError, match="causal=True with 48 queries and 80 keys.*sageattn_qk_int8_pv_fp16_cuda"):
        flash_attn_func(q, k, v, causal=True, kernel=sa.sageattn_qk_int8_pv_fp16_cuda)


@pytest.mark.parametrize("fn", [flash_attn_func, flash_attn_forward])
@pytest.mark.parametrize("kwargs,name", [
    ({"dropout_p": 0.1}, "dropout_p"),
    ({"window_size": (128, 0)}, "window_size"),
    ({"softcap": 30.0}, "softcap"),
    ({"alibi_slopes": torch.ones(2)}, "alibi_slopes"),
])
def test_unsupported_arguments_are_named(fn, kwargs, name):
    q, k, v = make_qkv(b=1, hq=2, nq=16, d=32, layout="NHD")
    with pytest.raises(ValueError, match=f"^{name}"):
        fn(q, k, v, **kwargs)


def test_return_softmax_is_refused():
    q, k, v = make_qkv(b=1, hq=2, nq=16, d=32, layout="NHD")
    with pytest.raises(ValueError, match="^return_softmax"):
        flash_attn_forward(q, k, v, return_softmax=True)


@pytest.mark.parametrize("fn", [sa.sageattn, sa.sageattn_qk_int8_pv_fp16_cuda, sa.sageattn_qk_int8_pv_fp8_cuda])
def test_main_entry_points_still_refuse_flash_attn_keywords(fn):
    """The public functions keep upstream's signatures and refuse what they would ignore: a flash-attn caller must
    go through flash_attn_compat rather than have causal= or softmax_scale= silently dropped."""
    q, k, v = make_qkv(b=1, hq=2, nq=16, d=32)
    with pytest.raises(TypeError, match="unexpected keyword"):
        fn(q, k, v, causal=True, softmax_scale=0.5)


def test_scaled_dot_product_attention_keywords():
    """SDPA's keywords (para-attn's attn_func): HND, GQA, scale=, a bool attn_mask; dropout refused."""
    q, k, v = make_qkv(b=1, hq=4, hk=1, nq=40, nk=72, d=64, seed=4)
    mask = torch.rand(40, 72, generator=torch.Generator().manual_seed(0)) > 0.3
    mask = mask.to(q.device)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=0.2,
                                       enable_gqa=True)
    ref, _ = sdpa_fp32(q, k, v, attn_mask=mask, sm_scale=0.2)
    assert_close(out.float(), ref, cos=PV_TOL["cos"], rel_l1=PV_TOL["l1"])
    with pytest.raises(ValueError, match="^dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.1)

"""Bad input: clear TypeError/ValueError naming the problem, raised before any kernel runs."""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

import sageattention as sa
from sageattention import inputs
from tests.sageattention.helpers import DEVICE, VARIANT_IDS, VARIANTS, make_qkv, variant

SAGEATTN = variant("sageattn")


def qkv(**kw):
    return make_qkv(hq=2, nq=8, d=32, **kw)


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_unsupported_dtype(var, dtype):
    q, k, v = (t.to(dtype) for t in qkv())
    with pytest.raises(TypeError, match="dtype.*float16 and torch.bfloat16"):
        var(q, k, v)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="CPU tensors are an error only without the interpreter")
@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_cpu_tensors_without_interpreter(var, monkeypatch):
    monkeypatch.setattr(inputs, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="CUDA GPUs.*cpu"):
        var(*qkv())


def test_cpu_tensors_without_interpreter_varlen(monkeypatch):
    monkeypatch.setattr(inputs, "interpreting", lambda: False)
    q, k, v = (t.cpu()[0].transpose(0, 1) for t in qkv())
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA GPUs"):
        sa.sageattn_varlen(q, k, v, cu, cu, 8, 8)


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
def test_mismatched_dtypes(var):
    q, k, v = qkv()
    with pytest.raises(TypeError, match="share one dtype"):
        var(q, k.bfloat16(), v)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a second device type")
def test_mismatched_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        sa.sageattn(q, k.cpu(), v)


CASES = {  # name -> (q, k, v maker, kwargs, exception, message fragment)
    "batch": (lambda: (qkv()[0], *make_qkv(b=2, hq=2, nq=8, d=32)[1:]), {}, ValueError, "batch size differs"),
    "head_dim": (lambda: (qkv()[0], *make_qkv(hq=2, nq=8, d=64)[1:]), {}, ValueError, "head_dim differs"),
    "gqa_heads": (lambda: make_qkv(hq=3, hk=2, nq=8, d=32), {}, ValueError, "must divide the q heads"),
    "k_v_shape": (lambda: (*qkv()[:2], make_qkv(hq=2, nq=9, d=32)[2]), {}, ValueError, "same shape"),
    "rank": (lambda: tuple(t[0] for t in qkv()), {}, ValueError, "must be 4-D"),
    "head_dim_gt_256": (lambda: make_qkv(hq=1, nq=4, d=288), {}, ValueError, "head_dim 288 is not supported"),
    "zero_tokens": (lambda: make_qkv(hq=2, nq=0, nk=8, d=32), {}, ValueError, "zero-size"),
    "zero_batch": (lambda: make_qkv(b=0, hq=2, nq=8, d=32), {}, ValueError, "zero-size"),
    "last_dim_strided": (lambda: tuple(t.transpose(-1, -2) for t in make_qkv(hq=2, nq=32, d=32)), {}, ValueError,
                         "contiguous in its last"),
    "layout": (qkv, {"tensor_layout": "BHND"}, ValueError, "tensor_layout='BHND'"),
    "not_tensor": (lambda: (qkv()[0].tolist(), *qkv()[1:]), {}, TypeError, "must be a torch.Tensor"),
    "sm_scale": (qkv, {"sm_scale": "0.1"}, TypeError, "sm_scale"),
}


@pytest.mark.parametrize("var", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_shapes_and_args(var, case):
    make, kw, exc, fragment = CASES[case]
    q, k, v = make()
    kw = dict(kw)
    layout = kw.pop("tensor_layout", "HND")
    with pytest.raises(exc, match=fragment):
        var(q, k, v, layout, **kw)


@pytest.mark.parametrize("var", [v for v in VARIANTS if "qk_quant_gran" in v.fn.__code__.co_varnames],
                         ids=lambda v: v.name)
def test_bad_qk_quant_gran(var):
    with pytest.raises(ValueError, match="qk_quant_gran='per_tile'.*per_block"):
        var(*qkv(), qk_quant_gran="per_tile")


@pytest.mark.parametrize("fn,bad", [
    (sa.sageattn_qk_int8_pv_fp16_cuda, "fp32+fp16"),
    (sa.sageattn_qk_int8_pv_fp8_cuda, "fp16+fp32"),
    (sa.sageattn_qk_int8_pv_fp8_cuda_sm90, "fp32+fp16"),
    (sa.sageattn_qk_int8_pv_fp8_cuda, "bf16"),
])
def test_bad_pv_accum_dtype(fn, bad):
    with pytest.raises(ValueError, match=re.escape(f"pv_accum_dtype='{bad}' is not supported; use one of")):
        fn(*qkv(), pv_accum_dtype=bad)


def test_sageattn_unknown_kwarg_names_it():
    with pytest.raises(TypeError, match="scale_factor"):
        sa.sageattn(*qkv(), scale_factor=2.0)


def test_sageattn_dropout():
    with pytest.raises(ValueError, match="dropout_p=0.1"):
        sa.sageattn(*qkv(), dropout_p=0.1)
    q, k, v = qkv()
    torch.testing.assert_close(sa.sageattn(q, k, v, dropout_p=0.0, attn_mask=None), sa.sageattn(q, k, v),
                               rtol=0, atol=0)


def test_comfyui_call_pattern():
    """ComfyUI: sageattn(q, k, v, attn_mask=None, is_causal=False, tensor_layout=...) just works."""
    q, k, v = make_qkv(hq=2, nq=8, d=32, layout="NHD")
    out = sa.sageattn(q, k, v, attn_mask=None, is_causal=False, tensor_layout="NHD")
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("mask,exc,fragment", [
    (torch.ones(8, 9, dtype=torch.bool), ValueError, "does not broadcast"),
    (torch.ones(8, 8, dtype=torch.int32), TypeError, "attn_mask has dtype torch.int32"),
    ([[True]], TypeError, "attn_mask must be a torch.Tensor"),
])
def test_bad_attn_mask(mask, exc, fragment):
    if isinstance(mask, torch.Tensor):
        mask = mask.to(DEVICE)
    with pytest.raises(exc, match=fragment):
        sa.sageattn(*qkv(), attn_mask=mask)


def test_bad_quantization_backend():
    with pytest.raises(ValueError, match="quantization_backend='cutlass'"):
        sa.sageattn_qk_int8_pv_fp16_triton(*qkv(), quantization_backend="cutlass")
    with pytest.raises(ValueError, match="quantization_backend='cutlass'"):
        sa.sageattn(*qkv(), quantization_backend="cutlass")


def _varlen_args():
    q, k, v = (t[0].transpose(0, 1) for t in make_qkv(hq=2, nq=10, d=32))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
    return [q, k, v, cu, cu.clone(), 6, 6]


# cu_seqlens and max_seqlen: test_varlen_validation.py
@pytest.mark.parametrize("index,value,exc,fragment", [
    (0, None, ValueError, "must be 3-D"),
])
def test_bad_varlen_args(index, value, exc, fragment):
    args = _varlen_args()
    if value is None:
        args[index] = args[index][None]
    elif isinstance(value, torch.Tensor):
        args[index] = value.to(DEVICE)
    else:
        args[index] = value
    with pytest.raises(exc, match=fragment):
        sa.sageattn_varlen(*args)


def test_varlen_gqa_heads():
    q, k, v, cu, cu_k, mq, mk = _varlen_args()
    with pytest.raises(ValueError, match="must divide"):
        sa.sageattn_varlen(torch.cat([q, q[:, :1]], dim=1), k, v, cu, cu_k, mq, mk)


def test_errors_leave_inputs_untouched():
    q, k, v = qkv()
    q0 = q.clone()
    with pytest.raises(ValueError):
        sa.sageattn(q, k, v, dropout_p=0.5)
    assert torch.equal(q, q0)


DEFECTS = {  # each makes a tensor fail one of check_qkv's checks
    "dtype": lambda t: t.float(), "int": lambda t: t.to(torch.int8), "bf16": lambda t: t.bfloat16(),
    "strided": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2), "list": lambda t: [t], "rank": lambda t: t.unsqueeze(0), "empty": lambda t: t[:0],
    "head_dim": lambda t: t[..., :32], "wide": lambda t: torch.zeros(*t.shape[:-1], 300, dtype=t.dtype),
    "device": lambda t: t.to("meta"), "subclass": lambda t: torch.nn.Parameter(t, requires_grad=False),
    "tokens": lambda t: t[..., :1, :],
}


@st.composite
def _qkv_attempts(draw):
    """A valid CPU q, k, v with a few defects (DEFECTS) applied, each to some of the three."""
    ndim = draw(st.sampled_from([3, 4]))
    qkv = [torch.zeros((2,) * (ndim - 1) + (64,), dtype=torch.float16) for _ in range(3)]
    for name in draw(st.lists(st.sampled_from(sorted(DEFECTS)), max_size=2)):
        for i in draw(st.sets(st.integers(0, 2), min_size=1)):
            if isinstance(qkv[i], torch.Tensor):
                qkv[i] = DEFECTS[name](qkv[i])
    return (*qkv, ndim)


@settings(max_examples=1000, deadline=None)
@given(_qkv_attempts(), st.booleans())
def test_the_quick_input_check_accepts_nothing_the_named_checks_reject(case, interpret):
    q, k, v, ndim = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inputs, "interpreting", lambda: interpret)
        if inputs._pass_all(q, k, v, ndim):
            inputs._check_each(q, k, v, ndim)  # raises if the quick check let something through

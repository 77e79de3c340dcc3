"""torch.library ops: opcheck under the interpreter and the fake (meta) implementations' shapes/dtypes."""
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import sageattention as sa
from sageattention import backward, dispatch, ops
from sageattention.compiled_call import CompiledCall, Granularity, PvAccum
from tests.sageattention.helpers import DEVICE, make_qkv, packed_varlen

# All of opcheck's checks: schema, fake impl, autograd registration, AOTAutograd tracing (dynamic shapes).
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _dense_args(layout, return_lse, mask=False):
    q, k, v = make_qkv(hq=4, hk=2, nq=20, nk=33, d=32, layout=layout, contiguous=True, seed=41)
    attn_mask = torch.ones(20, 33, dtype=torch.bool, device=DEVICE).tril(13).expand(1, 4, 20, 33) if mask else None
    return (q, k, v, attn_mask, layout, True, 0, 32**-0.5, "per_thread", True, True, False, True, False, return_lse, "")


def test_compiled_family_lookup_traces_as_a_constant():
    """torch.compile(fullgraph=True) of the compiled route: looking up the family's module (an import, a query of the
    device) must not break the graph; it answers as in eager."""
    def pick(x):
        return x + (1.0 if dispatch.compiled_family((8, 9), True, torch.device("cuda", 0)) is None else 2.0)
    x = torch.zeros(2)
    assert torch.equal(torch.compile(pick, fullgraph=True, backend="eager")(x), pick(x))


def test_import_loads_neither_dynamo_nor_triton():
    """`import sageattention` stays light (torch._dynamo alone costs ~2 s); Triton loads with its first kernel."""
    code = "import sys, sageattention; print(sorted(m for m in ('torch._dynamo', 'triton') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_opcheck_attention(layout, return_lse):
    torch.library.opcheck(ops.attention, _dense_args(layout, return_lse, mask=return_lse), test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_opcheck_attention_with_gradients(layout):
    """The backward formula under AOTAutograd (inputs that require grad) gives eager's gradients."""
    args = list(_dense_args(layout, False))
    args[:3] = [t.detach().requires_grad_() for t in args[:3]]
    torch.library.opcheck(ops.attention, tuple(args), test_utils=OPCHECK_TESTS)


def test_opcheck_backward_ops():
    q, k, v, mask, layout, causal, offset, scale = _dense_args("NHD", True, mask=True)[:8]
    g = torch.randn_like(q)
    torch.library.opcheck(backward.dense_backward, (g, torch.zeros(0), q, k, v, mask, layout, causal, offset, scale),
                          test_utils=OPCHECK_TESTS)
    vq, vk, vv, cu_q, cu_k, _, causal, scale, _ = _varlen_args()
    torch.library.opcheck(backward.varlen_backward, (torch.randn_like(vq), vq, vk, vv, cu_q, cu_k, causal, scale),
                          test_utils=OPCHECK_TESTS)


def _varlen_args():
    return (*packed_varlen([12, 18], [20, 21], hq=4, hk=2, d=32, seed=42), 18, True, 32**-0.5, True)


def test_opcheck_attention_varlen():
    torch.library.opcheck(ops.attention_varlen, _varlen_args(), test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fake_impl_shapes(layout, return_lse, dtype):
    with FakeTensorMode():
        shape = (2, 5, 37, 64) if layout == "HND" else (2, 37, 5, 64)
        kv_shape = (2, 1, 50, 64) if layout == "HND" else (2, 50, 1, 64)
        q = torch.empty(shape, dtype=dtype, device=DEVICE)
        k = torch.empty(kv_shape, dtype=dtype, device=DEVICE)
        out, lse = ops.attention(q, k, k, None, layout, False, 0, 0.125, "per_thread", True, True, False, True, False,
                                 return_lse, "")
        assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
        assert lse.dtype == torch.float32
        assert lse.shape == ((2, 5, 37) if return_lse else (0,))
        vq = torch.empty(30, 4, 64, dtype=dtype, device=DEVICE)
        vk = torch.empty(41, 2, 64, dtype=dtype, device=DEVICE)
        cu = torch.empty(3, dtype=torch.int32, device=DEVICE)
        out = ops.attention_varlen(vq, vk, vk, cu, cu, 18, False, 0.125, True)
        assert out.shape == vq.shape and out.dtype == dtype


def test_op_matches_eager_function(monkeypatch):
    """The registered Triton op (what compiled graphs call) computes what the eager call computes; the eager `_cuda`
    call runs the Triton kernels here because the build is made to hold no compiled family."""
    monkeypatch.setattr(dispatch, "compiled_family", lambda cap, pv_fp8, device: None)
    args = _dense_args("NHD", True)
    out, lse = ops.attention(*args)
    ref_out, ref_lse = ops._attention(*args)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    eager, eager_lse = sa.sageattn_qk_int8_pv_fp8_cuda(*args[:3], tensor_layout="NHD", is_causal=True,
                                                       pv_accum_dtype="fp32+fp32", return_lse=True)
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels need a GPU")
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_compiled_op_passes_opcheck_and_matches_eager(layout):
    """sageattention::compiled_attention (what compiled graphs call on the compiled route): opcheck, and the same
    output as the eager `_cuda` call."""
    cap = dispatch.capability(DEVICE)
    family = dispatch.compiled_family(cap, True, DEVICE)
    if family is None:
        pytest.skip(f"this build has no compiled FP8 family for sm{cap[0]}{cap[1]}")
    q, k, v = _dense_args(layout, True)[:3]
    args = (q, k, v, *CompiledCall(family, layout == "NHD", True, 0, 32**-0.5, Granularity.PER_THREAD,
                                   PvAccum.ACC_TWO_LEVEL, True, False, True))
    torch.library.opcheck(ops.compiled_attention, args, test_utils=OPCHECK_TESTS[:3])
    out, lse = ops.compiled_attention(*args)
    eager, eager_lse = sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, tensor_layout=layout, is_causal=True,
                                                       qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32",
                                                       return_lse=True)
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)

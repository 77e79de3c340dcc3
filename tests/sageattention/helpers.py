"""Shared test helpers: input makers, accuracy metrics, the public variants and their oracles.

Everything here runs on the GPU when there is one and on CPU under Triton's interpreter otherwise,
so the GPU tests and their CPU rehearsals share one implementation of every check.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pytest
import torch

import sageattention as sa
from sageattention.bench.workloads import sageattn_on_triton
from sageattention import core, dispatch, reference
from sageattention.inputs import to_hnd
from sageattention.reference import error_metrics

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LAYOUTS = ("HND", "NHD")


# ---------------------------------------------------------------- inputs

def make_qkv(*, b=1, hq=2, hk=None, nq=64, nk=None, d=64, dtype=torch.float16, layout="HND", seed=0,
             device=DEVICE, strided=False, contiguous=False, k_bias=0.0, q_outlier=0.0, n_outliers=4):
    """Fresh random q, k, v in `layout` (NHD ones are transposed views of HND storage unless contiguous).

    strided: views into wider storage, contiguous only in the last dim.
    k_bias: scale of a per-channel bias added to every key (what K smoothing removes).
    q_outlier: factor applied to `n_outliers` random channels of q."""
    hk = hq if hk is None else hk
    nk = nq if nk is None else nk
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=gen) for h, n in ((hq, nq), (hk, nk), (hk, nk)))
    if k_bias:
        k = k + k_bias * torch.randn(d, generator=gen)
    if q_outlier:
        idx = torch.randperm(d, generator=gen)[:n_outliers]
        q[..., idx] *= q_outlier
    out = []
    for x in (q, k, v):
        if strided:
            pad = torch.zeros(*x.shape[:-1], 8)
            x = torch.cat([x, pad], dim=-1)
        x = x.to(device=device, dtype=dtype)
        x = x[..., :d] if strided else x
        x = to_hnd(x, layout)
        out.append(x.contiguous() if contiguous else x)
    return tuple(out)


def rounding_ties(b=1, h=2, n=300, d=64, device=DEVICE, dtype=torch.float16):
    """[b, h, n, d] half-integers in [-125.5, 126.5] with 127 in every row's first channel: every quantization group's
    scale is 1, so each other element lands exactly halfway between two INT8 values (what tells roundings apart)."""
    x = torch.arange(b * h * n * d, dtype=torch.float32).remainder(253).sub(125.5).reshape(b, h, n, d)
    x[..., 0] = 127.0
    return x.to(device=device, dtype=dtype)


# ---------------------------------------------------------------- metrics

def metrics(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """reference.error_metrics on the CPU, where the float64 oracles run."""
    return error_metrics(out.cpu(), ref.cpu())


def assert_close(out, ref, *, cos: float, rel_l1: float, what: str = "") -> dict:
    """out is finite and close to ref in cosine similarity and relative L1; returns the metrics."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(out).all(), f"{what}: non-finite values in the output"
    m = metrics(out, ref)
    assert m["cos"] >= cos and m["rel_l1"] <= rel_l1, f"{what}: {m} (need cos >= {cos}, rel_l1 <= {rel_l1})"
    return m


def assert_lse_close(lse, ref_lse, *, atol: float, what: str = ""):
    """LSE (fp32 [B, H, Nq]) close to a higher-precision LSE, with -inf exactly where ref is -inf."""
    assert lse.dtype == torch.float32, f"{what}: lse dtype {lse.dtype}"
    lse, ref_lse = lse.double().cpu(), ref_lse.double().cpu()
    assert lse.shape == ref_lse.shape, f"{what}: lse shape {tuple(lse.shape)} != {tuple(ref_lse.shape)}"
    ninf = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), ninf), f"{what}: -inf LSE rows differ"
    err = (lse[~ninf] - ref_lse[~ninf]).abs().max().item() if (~ninf).any() else 0.0
    assert err <= atol, f"{what}: max |lse - ref| = {err} > {atol}"


def lse_tol(ref_lse) -> float:
    """LSE error budget vs full precision: INT8 score error grows with the scores' magnitude."""
    finite = ref_lse[torch.isfinite(ref_lse)]
    return 0.02 + 0.01 * (finite.abs().max().item() if finite.numel() else 0.0)


# Accuracy bounds, from the reference algorithm's own error (tests/sageattention/test_reference.py measures it):
# vs the same quantized algorithm ("ref") and vs full-precision attention.
TOL = {
    "fp16": {"ref_cos": 0.9999, "ref_l1": 0.003, "cos": 0.9995, "l1": 0.03},
    # FP8 P is rounded per key block against the running row max in the kernel and against the final
    # row max in the reference: the two round differently, so kernel-vs-reference is FP8-noise level.
    "fp8": {"ref_cos": 0.999, "ref_l1": 0.05, "cos": 0.999, "l1": 0.05},
}


# ---------------------------------------------------------------- oracles

def reference_out(q, k, v, layout="HND", *, pv="fp16", gran="per_thread", p_scale=None, **kw):
    """sage_attention_reference on layout tensors; returns (out in layout, lse).

    p_scale: the FP8 stretch of P (448, or 1 with an fp16 per-block accumulator). kw: more of the reference's
    arguments (qk_quant_gran there overrides gran)."""
    if p_scale is not None:
        kw["p_scale"] = p_scale
    kw.setdefault("qk_quant_gran", gran)
    q, k, v = (to_hnd(t, layout).cpu() for t in (q, k, v))
    out, lse = reference.sage_attention_reference(q, k, v, pv_dtype=pv, **kw)
    return to_hnd(out, layout), lse


def fp64_out(q, k, v, layout="HND", **kw):
    """float64 attention on layout tensors; returns (out fp64 in layout, lse fp64)."""
    out, lse = reference.attention_fp64(*(to_hnd(t, layout).cpu() for t in (q, k, v)), **kw)
    return to_hnd(out, layout), lse


def sdpa_fp32(q, k, v, layout="HND", *, is_causal=False, attn_mask=None, sm_scale=None, causal_offset=0):
    """fp32 SDPA on .float() inputs with an explicit causal mask (query i sees keys j <= i + causal_offset);
    returns (out fp32 layout, lse)."""
    qh, kh, vh = (to_hnd(t, layout).float() for t in (q, k, v))
    nq, nk = qh.shape[2], kh.shape[2]
    rep = qh.shape[1] // kh.shape[1]
    kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    bias = torch.zeros(nq, nk, device=qh.device)
    if attn_mask is not None:
        bias = bias + (attn_mask.float() if attn_mask.dtype != torch.bool
                       else torch.zeros_like(attn_mask, dtype=torch.float32).masked_fill(~attn_mask, float("-inf")))
    if is_causal:
        bias = bias.masked_fill(~reference.causal_mask(nq, nk, qh.device, causal_offset), float("-inf"))
    scale = qh.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias, scale=scale)
    lse = torch.logsumexp(qh @ kh.transpose(-1, -2) * scale + bias, dim=-1)
    return to_hnd(out, layout), lse


# ---------------------------------------------------------------- packed (varlen) batches

def cu_seqlens(lens, dtype=torch.int32, device=DEVICE) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=dtype, device=device)


def packed_varlen(lens_q, lens_k, *, hq=4, hk=2, d=64, seed=0, dtype=torch.float16, cu_dtype=torch.int32):
    """q [sum(lens_q), hq, d], k/v [sum(lens_k), hk, d] and their cu_seqlens."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=gen).to(dtype).to(DEVICE)
    k, v = (torch.randn(sum(lens_k), hk, d, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    return q, k, v, cu_seqlens(lens_q, cu_dtype), cu_seqlens(lens_k, cu_dtype)


def check_per_sequence(out, q, k, v, cu_q, cu_k, is_causal=False, *, oracle=None, tol=None):
    """Each sequence of a packed batch against attention on it alone (oracle: fp64_out by default, or sdpa_fp32);
    a sequence with queries but no keys gives 0."""
    oracle, tol = oracle or fp64_out, tol or TOL["fp16"]
    assert out.shape == q.shape and out.dtype == q.dtype
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if sq.start == sq.stop:
            continue
        if sk.start == sk.stop:
            assert torch.equal(out[sq], torch.zeros_like(out[sq])), f"sequence {i} has no keys: want 0"
            continue
        want = oracle(q[sq][None], k[sk][None], v[sk][None], "NHD", is_causal=is_causal)[0][0]
        assert_close(out[sq].float().cpu(), want.float().cpu(), cos=tol["cos"], rel_l1=tol["l1"],
                     what=f"sequence {i}")


# ---------------------------------------------------------------- the public functions

def sageattn_pv() -> str:
    """P·V precision sageattn picks on this device (FP8 under the interpreter and on sm89+)."""
    return "fp8" if dispatch.default_pv_fp8(dispatch.capability(DEVICE)) else "fp16"


@dataclass(frozen=True)
class Variant:
    name: str
    fn: object
    pv: str  # "fp16" or "fp8" (P·V precision)
    gran: str = "per_thread"
    kwargs: dict = field(default_factory=dict)
    mask: bool = False  # accepts attn_mask
    sm90_only: bool = False
    triton: bool = False  # always runs the Triton kernels
    p_scale: float | None = None  # FP8 P stretch (None: the reference's default, 448)

    def __call__(self, q, k, v, layout="HND", *, is_causal=False, return_lse=False, attn_mask=None, **kw):
        extra = dict(self.kwargs, **kw)
        if attn_mask is not None:
            extra["attn_mask"] = attn_mask
        res = self.fn(q, k, v, tensor_layout=layout, is_causal=is_causal, return_lse=return_lse, **extra)
        return res if return_lse else (res, None)


def _variants():
    return [
        Variant("sageattn", sa.sageattn, sageattn_pv(), core.SAGEATTN_GRAN, mask=True),
        Variant("fp16_triton", sa.sageattn_qk_int8_pv_fp16_triton, "fp16", "per_block", mask=True, triton=True),
        Variant("fp16_cuda-fp32", sa.sageattn_qk_int8_pv_fp16_cuda, "fp16", kwargs={"pv_accum_dtype": "fp32"}),
        Variant("fp16_cuda-fp16+fp32", sa.sageattn_qk_int8_pv_fp16_cuda, "fp16", "per_warp",
                kwargs={"pv_accum_dtype": "fp16+fp32", "qk_quant_gran": "per_warp"}),
        Variant("fp8_cuda-fp32", sa.sageattn_qk_int8_pv_fp8_cuda, "fp8", kwargs={"pv_accum_dtype": "fp32"}),
        Variant("fp8_cuda-fp32+fp32", sa.sageattn_qk_int8_pv_fp8_cuda, "fp8", "per_block",
                kwargs={"pv_accum_dtype": "fp32+fp32", "qk_quant_gran": "per_block"}),
        Variant("fp8_cuda-fp32+fp16", sa.sageattn_qk_int8_pv_fp8_cuda, "fp8", kwargs={"pv_accum_dtype": "fp32+fp16"},
                p_scale=1.0),
        Variant("fp8_cuda_sm90", sa.sageattn_qk_int8_pv_fp8_cuda_sm90, "fp8", sm90_only=True),
    ]


VARIANTS = _variants()
# sageattn pinned to the Triton kernels on any GPU: for the tests of Triton-only machinery (not in VARIANTS: the
# public functions' tests cover its kernels through fp16_triton, and through sageattn on the interpreter)
SAGEATTN_TRITON = Variant("sageattn_triton", sageattn_on_triton, sageattn_pv(), core.SAGEATTN_GRAN, mask=True,
                          triton=True)
VARIANT_IDS = [v.name for v in VARIANTS]
MASK_VARIANTS = [v for v in VARIANTS if v.mask]


def variant(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def runs_here(var: Variant) -> bool:
    """sm90-only kernels run on sm90 GPUs and under the interpreter."""
    cap = dispatch.capability(DEVICE)
    return not var.sm90_only or cap is None or cap == (9, 0)


def skip_unless_runs(var: Variant) -> None:
    if not runs_here(var):
        pytest.skip("sm90-only kernel")


def runs_compiled(var: Variant, q, layout="HND", *, masked=False) -> bool:
    """Whether this call of `var` runs the compiled kernels (csrc/) on this device, rather than Triton."""
    if var.name == "sageattn":
        return sa.explain(q, q, q, layout, attn_mask=torch.ones((), dtype=torch.bool, device=q.device) if masked
                          else None).startswith("compiled")
    if var.triton or masked or q.shape[-1] > core.COMPILED_MAX_HEAD_DIM:
        return False
    return dispatch.compiled_family(dispatch.capability(q.device), var.pv == "fp8", q.device) is not None


def oracle_args(var: Variant, q, layout="HND", *, masked=False, **kw) -> dict:
    """The reference's arguments for what `var` computes here: the backend's quantization groups and defaults,
    and its FP8 scaling (the Triton kernels stretch P by 1 under an fp16 accumulator, the compiled ones scale V
    to +-2.25 instead)."""
    if not runs_compiled(var, q, layout, masked=masked):
        out = {"qk_quant_gran": kw.get("qk_quant_gran", var.gran)}
        return out if var.p_scale is None else dict(out, p_scale=var.p_scale)
    gran = kw.get("qk_quant_gran", core.SAGEATTN_GRAN_COMPILED if var.name == "sageattn" else var.gran)
    v_max = reference.FP8_MAX
    if var.pv == "fp8":
        family = dispatch.compiled_family(dispatch.capability(q.device), True, q.device)
        v_max = compiled_v_max(dispatch.compiled_module(family), var.kwargs.get("pv_accum_dtype") == "fp32+fp16")
    return {"qk_quant_gran": gran, "compiled": True, "v_max": v_max}


def compiled_v_max(module, f16_inner: bool) -> float:
    """V's FP8 range in a compiled module's call: +-2.25 where it runs its fp16-accumulating P·V (asked for, and built:
    sm89 family, nvcc >= 12.8; sm90 runs that request two-level in fp32), else e4m3's 448."""
    return reference.F16_ACCUM_V_MAX if f16_inner and module.FP8_F16_ACCUM else reference.FP8_MAX


def check_variant_vs_fp32(var: Variant, q, k, v, layout="HND", *, is_causal=False, attn_mask=None,
                          what="", tol=None, **kw) -> dict:
    """Run a public function and compare out and LSE with fp32 SDPA / logsumexp at the spec's thresholds."""
    out, lse = var(q, k, v, layout, is_causal=is_causal, return_lse=True, attn_mask=attn_mask, **kw)
    ref, ref_lse = sdpa_fp32(q, k, v, layout, is_causal=is_causal, attn_mask=attn_mask)
    assert out.dtype == q.dtype and out.shape == q.shape
    tol = tol or TOL[var.pv]
    m = assert_close(out, ref, cos=tol["cos"], rel_l1=tol["l1"], what=what or var.name)
    assert_lse_close(lse, ref_lse, atol=lse_tol(ref_lse), what=what or var.name)
    return m


# ---------------------------------------------------------------- interpreter limits

@functools.lru_cache(maxsize=None)
def interpreter_bf16_dot_ok() -> bool:
    """Triton 3.6's interpreter computes tl.dot on bfloat16 operands wrongly (errors ~1e10): probe it."""
    if DEVICE.type == "cuda":
        return True
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(A, B, C):
        r = tl.arange(0, 16)
        acc = tl.dot(tl.load(A + r[:, None] * 16 + r[None, :]), tl.load(B + r[:, None] * 16 + r[None, :]))
        tl.store(C + r[:, None] * 16 + r[None, :], acc)

    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=gen).bfloat16() for _ in range(2))
    c = torch.empty(16, 16)
    _dot[(1,)](a, b, c)
    return torch.allclose(c, a.float() @ b.float(), atol=1e-2)


def skip_bf16_pv16(var: Variant, dtype) -> None:
    """bf16 with 16-bit P·V needs a bf16 tl.dot, which the CPU interpreter gets wrong."""
    if dtype == torch.bfloat16 and var.pv == "fp16" and not interpreter_bf16_dot_ok():
        pytest.skip("Triton interpreter: tl.dot on bfloat16 operands is wrong (covered by the GPU tests)")


def check_variant_vs_reference(var: Variant, q, k, v, layout="HND", *, is_causal=False, attn_mask=None,
                               what="", **kw) -> dict:
    """Run a public function (return_lse=True) and compare with the quantized reference and float64 attention."""
    q0, k0, v0 = (t.clone() for t in (q, k, v))
    out, lse = var(q, k, v, layout, is_causal=is_causal, return_lse=True, attn_mask=attn_mask, **kw)
    for before, after in ((q0, q), (k0, k), (v0, v)):
        assert torch.equal(before, after), "the inputs were modified"
    assert out.dtype == q.dtype and out.shape == q.shape and out.device == q.device
    ref_kw = {key: kw[key] for key in ("smooth_k", "smooth_v", "sm_scale") if key in kw}
    ref_kw.update(oracle_args(var, q, layout, masked=attn_mask is not None, **kw))
    ref, ref_lse = reference_out(q, k, v, layout, pv=var.pv, is_causal=is_causal,
                                 attn_mask=None if attn_mask is None else attn_mask.cpu(), **ref_kw)
    exact, exact_lse = fp64_out(q, k, v, layout, is_causal=is_causal, sm_scale=kw.get("sm_scale"),
                                attn_mask=None if attn_mask is None else attn_mask.cpu())
    tol = TOL[var.pv]
    name = what or var.name
    m_ref = assert_close(out.cpu(), ref, cos=tol["ref_cos"], rel_l1=tol["ref_l1"], what=f"{name} vs reference")
    m = assert_close(out.cpu(), exact, cos=tol["cos"], rel_l1=tol["l1"], what=f"{name} vs float64")
    assert_lse_close(lse, ref_lse, atol=2e-3, what=f"{name} lse vs reference")
    assert_lse_close(lse, exact_lse, atol=lse_tol(exact_lse), what=f"{name} lse vs float64")
    return {"vs_ref": m_ref, "vs_fp64": m}

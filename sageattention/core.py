"""The public API: upstream SageAttention 2.2's names, parameters and defaults, plus masks, GQA and LSE."""
from __future__ import annotations

import dataclasses
import functools
import logging

import torch

from . import dispatch, fallback, inputs, ops
from .compiled_call import CompiledCall, Granularity, PvAccum
from .plan import Plan
from .quant_groups import check_granularity

_log = logging.getLogger("sageattention")

# pv_accum_dtype -> (two-level accumulation, fp16 per-block accumulator)
_PV_ACCUM = {
    "fp32": (False, False),
    "fp32+fp32": (True, False),
    "fp32+fp16": (True, True),
    # An fp16 per-block accumulator is used only for FP8 P·V (P in [0, 1] times V within +-448 stays below
    # 65504 over a key tile). 16-bit V can reach 6e4, so "fp16+fp32" and "fp16" (16-bit P·V only) accumulate
    # each block in fp32: at least the precision asked for, never an overflow where SDPA is finite.
    "fp16+fp32": (True, False),
    "fp16": (True, False),
}
FP16_PV_ACCUM = ("fp32", "fp16+fp32", "fp16")
FP8_PV_ACCUM = ("fp32", "fp32+fp32", "fp32+fp16")
SM90_PV_ACCUM = ("fp32", "fp32+fp32")
QUANT_BACKENDS = ("triton", "cuda")

# sageattn's granularity on the Triton kernels: one Q scale per 32 rows and one K scale per 128 keys lets the Triton
# kernel dequantize a score tile with one FMA per element (per-thread K scales vary along the tile).
SAGEATTN_GRAN = "per_warp"
# ... and on the compiled kernels, where per-thread scales cost no more than per-block ones (a lane holds one Q and
# one K scale per tile) and are what meets the accuracy target (docs/decisions/0003-per-thread-int8-scales.md).
SAGEATTN_GRAN_COMPILED = "per_thread"
COMPILED_MAX_HEAD_DIM = 128

SAGEATTN_KWARGS = frozenset(("attn_mask", "dropout_p", "smooth_k", "smooth_v", "qk_quant_gran", "pv_accum_dtype",
                             "quantization_backend"))


def resolve_plan(fn_name, cap, *, qk_quant_gran, pv_fp8, pv_accum_dtype, accum_choices, smooth_k,
                 smooth_v) -> Plan:
    """What the kernels compute for a public call on a GPU of capability `cap` (None: the interpreter).
    pv_fp8 None: the GPU's default (FP8 P·V where FP8 tensor cores exist), with its accumulation choices and,
    when pv_accum_dtype is None, their default."""
    if pv_fp8 is None:
        pv_fp8 = dispatch.default_pv_fp8(cap)
        accum_choices = FP8_PV_ACCUM if pv_fp8 else FP16_PV_ACCUM
        pv_accum_dtype = pv_accum_dtype or ("fp32+fp32" if pv_fp8 else "fp32")
    check_granularity(qk_quant_gran)
    if pv_accum_dtype not in accum_choices:
        raise ValueError(f"{fn_name}: pv_accum_dtype={pv_accum_dtype!r} is not supported; use one of {accum_choices}")
    two_level, inner_fp16 = _PV_ACCUM[pv_accum_dtype]
    return Plan(qk_quant_gran, pv_fp8, two_level, inner_fp16, bool(smooth_k), bool(smooth_v))


def sageattn_plan(cap) -> Plan:
    """The plan of `sageattn(q, k, v)` with its defaults (what the benchmark times kernel-only)."""
    return resolve_plan("sageattn", cap, qk_quant_gran=SAGEATTN_GRAN, pv_fp8=None, pv_accum_dtype=None,
                        accum_choices=None, smooth_k=True, smooth_v=False)


def compiled_accum(plan: Plan) -> PvAccum:
    """The compiled kernels' P·V accumulation for a plan. 16-bit P·V: the fp16 modes accumulate each 64-key tile in
    fp16 (a tile that would overflow is redone in fp32), "fp32" accumulates in fp32."""
    if plan.pv_fp8:
        return (PvAccum.ACC_F16_INNER if plan.pv_inner_fp16 else PvAccum.ACC_TWO_LEVEL if plan.pv_two_level
                else PvAccum.ACC_F32)
    return PvAccum.ACC_F16_INNER if plan.pv_two_level else PvAccum.ACC_F32


def _route(fn_name, device, cap, plan, *, b, hq, nq, nk, d, is_causal, causal_offset, masked, return_lse, kernels):
    """Which kernels run a call: ("sdpa", why), ("compiled", family) or ("triton", why). kernels, what the entry point
    may run: "auto" (sageattn: SDPA for small problems, else the compiled kernels where built and archs.py prefers
    them, unless they run slower than SDPA at that length, else Triton), "compiled" (the `_cuda` variants: the
    compiled kernels wherever built) or "triton" (the `_triton` variant, and sageattn pinned to Triton by sageattention.bench)."""
    if kernels == "auto":
        why = fallback.sdpa_reason(b, hq, nq, nk, d, is_causal=is_causal, causal_offset=causal_offset, masked=masked,
                                   return_lse=return_lse)
        if why:
            return "sdpa", why
    if cap is None:
        return "triton", "CPU tensors run under Triton's interpreter"
    if kernels == "triton":
        return "triton", f"{fn_name} runs the Triton kernels"
    if masked:
        return "triton", "attn_mask is applied by the Triton kernels"
    if d > COMPILED_MAX_HEAD_DIM:
        return "triton", f"head_dim {d}: the compiled kernels take head_dim <= {COMPILED_MAX_HEAD_DIM}"
    if kernels == "auto" and not dispatch.sageattn_prefers_compiled(cap):
        return "triton", f"sm{cap[0]}{cap[1]}: sageattn prefers the Triton kernels here (sageattention/archs.py)"
    family = dispatch.compiled_family(cap, plan.pv_fp8, device)
    if family is None:
        return "triton", f"this build has no compiled {'FP8' if plan.pv_fp8 else '16-bit'} P·V kernels for the GPU"
    if kernels == "auto":
        why = fallback.slower_kernels_reason(family, nk, d, is_causal=is_causal, causal_offset=causal_offset,
                                             return_lse=return_lse)
        if why:
            return "sdpa", why
    return "compiled", family


def _prepare(fn_name, q, k, v, *, tensor_layout, is_causal, sm_scale, qk_quant_gran, pv_fp8, pv_accum_dtype,
             accum_choices, smooth_k, smooth_v, return_lse, attn_mask=None, dropout_p=0.0, kernels="auto",
             only_archs=None):
    """Checks a call and routes it: (run, backend, detail), where run(q, k, v) runs the chosen kernels with every
    other argument decided. See `resolve_plan` for pv_fp8, pv_accum_dtype and accum_choices; qk_quant_gran None:
    the backend's default. kernels: "auto", "compiled" or "triton" (see `_route`). only_archs: a frozenset of
    capabilities."""
    b, hq, _, nq, nk = inputs.check_dense(q, k, v, tensor_layout)
    attn_mask, is_causal, causal_offset = inputs.causal_alignment(attn_mask, is_causal, nq, nk)
    mask = inputs.expand_mask(attn_mask, q, (b, hq, nq, nk))
    if mask is not None and mask.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{fn_name}: gradients with respect to attn_mask are not supported; pass attn_mask.detach()")
    scale = inputs.resolve_sm_scale(sm_scale, q.shape[-1])
    device = q.device
    cap = dispatch.capability(device)
    plan = resolve_plan(fn_name, cap, qk_quant_gran=qk_quant_gran or SAGEATTN_GRAN, pv_fp8=pv_fp8,
                        pv_accum_dtype=pv_accum_dtype, accum_choices=accum_choices, smooth_k=smooth_k,
                        smooth_v=smooth_v)
    inputs.check_dropout(dropout_p)
    dispatch.check_supported(device, needs_fp8=plan.pv_fp8, only=only_archs)
    return_lse = bool(return_lse)
    backend, detail = _route(fn_name, device, cap, plan, b=b, hq=hq, nq=nq, nk=nk, d=q.shape[-1], is_causal=is_causal,
                             causal_offset=causal_offset, masked=mask is not None, return_lse=return_lse,
                             kernels=kernels)
    if backend == "compiled" and qk_quant_gran is None:
        plan = dataclasses.replace(plan, qk_quant_gran=SAGEATTN_GRAN_COMPILED)
    if backend == "sdpa":
        def run(q, k, v):
            return fallback.sdpa(q, k, v, tensor_layout, is_causal, causal_offset, scale)
    elif backend == "compiled":
        call = CompiledCall(family=detail, nhd=tensor_layout == "NHD", is_causal=is_causal,
                            causal_offset=causal_offset, sm_scale=scale,
                            qk_gran=Granularity.named(plan.qk_quant_gran), pv_accum=compiled_accum(plan),
                            smooth_k=plan.smooth_k, smooth_v=plan.smooth_v, return_lse=return_lse)

        def run(q, k, v):
            out, lse = ops.run_compiled_attention(q, k, v, call)
            return (out, lse) if return_lse else out
    else:
        call = ops.TritonCall(mask, tensor_layout, is_causal, causal_offset, scale, *plan.fields(), return_lse,
                              fn_name if kernels == "compiled" else "")

        def run(q, k, v):
            out, lse = ops.run_attention(q, k, v, call)
            return (out, lse) if return_lse else out
    return run, backend, detail


# A model calls attention with a handful of argument sets: each is checked and routed once (`_prepare`), and later
# calls with the same signature go straight to the kernels, since small calls are host-bound
# (docs/decisions/0041-signature-cache-host-time.md).
# Tests that fake a GPU or a build clear it (tests' conftest).
_prepared: dict = {}
_PREPARED_MAX = 256
_PLAIN = (bool, int, float, str, type(None))  # argument values that are kept in a signature


def _plain(values) -> bool:
    """Whether equal values of these types act alike; a tensor (an attn_mask) never enters a signature."""
    return all(type(x) in _PLAIN for x in values)


def prepared_calls(prepare):
    """The entry point of `prepare(q, k, v, ...) -> (run, backend, detail)`, which checks and routes each call
    signature once: the tensors' types, shapes, dtypes, devices and last strides (what the checks read), the SDPA
    switch, and every other argument with its type (sm_scale=True is refused, 1 is served)."""
    @functools.wraps(prepare)
    def entry_point(q, k, v, *args, **kwargs):
        if torch.compiler.is_compiling():  # the trace runs the checks once; the compiled graph calls the op
            return prepare(q, k, v, *args, **kwargs)[0](q, k, v)
        try:
            key = (prepare, type(q), type(k), type(v), q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                   q.device, k.device, v.device, q.stride(-1), k.stride(-1), v.stride(-1), fallback.is_enabled(),
                   *args, *map(type, args), *kwargs.items(), *map(type, kwargs.values()))
            prepared = _prepared.get(key)
        except (AttributeError, TypeError):  # not tensors, or an unhashable argument: the checks name the problem
            key = prepared = None
        if prepared is None:
            prepared = prepare(q, k, v, *args, **kwargs)
            if key is not None and _plain(args) and _plain(kwargs.values()):
                if len(_prepared) >= _PREPARED_MAX:
                    _prepared.clear()
                _prepared[key] = prepared
        run, backend, detail = prepared
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("%s: %s (%s)", entry_point.__name__, backend, detail)
        return run(q, k, v)
    return entry_point


def explain(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs) -> str:
    """Which kernels `sageattn` would run for these arguments, and why, e.g. "compiled sm89 kernels" or
    "sdpa: 77 keys (fewer than 128): quantizing K and V cannot pay off". Runs nothing."""
    _, backend, detail = _sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)
    return f"compiled {detail} kernels" if backend == "compiled" else f"{backend}: {detail}"


@prepared_calls
def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    """Quantized attention, a drop-in for scaled_dot_product_attention; picks the fastest kernel for the GPU
    (`explain` says which; small problems go to SDPA, see sageattention/fallback.py).

    q: [B, Hq, Nq, D] ("HND") or [B, Nq, Hq, D] ("NHD"); k, v likewise with Hk heads (Hk divides Hq).
    Keyword arguments of the named variants are forwarded (smooth_k, smooth_v, qk_quant_gran,
    pv_accum_dtype, quantization_backend); attn_mask (bool, True = attend, or additive) and
    dropout_p=0.0 are accepted like SDPA. is_causal is top-left (query i sees keys j <= i), as SDPA;
    attn_mask=torch.nn.attention.bias.causal_lower_right(Nq, Nk) gives bottom-right (KV-cache decoding);
    rows that see no key give 0. Returns out (q's layout and dtype), or (out, lse) with
    lse [B, Hq, Nq] fp32 natural-log logsumexp of the scaled scores. Backward gives the gradient of exact
    attention (sageattention/backward.py); gradients through lse raise."""
    return _sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)


def _sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, kernels="auto"):
    """sageattn's `_prepare`; kernels="triton" pins it to the Triton kernels (sageattention.bench)."""
    inputs.check_kwargs("sageattn", kwargs, SAGEATTN_KWARGS)
    _check_quant_backend(kwargs.get("quantization_backend", "triton"))
    return _prepare(
        "sageattn", q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
        qk_quant_gran=kwargs.get("qk_quant_gran"), pv_fp8=None,
        pv_accum_dtype=kwargs.get("pv_accum_dtype"), accum_choices=None, smooth_k=kwargs.get("smooth_k", True),
        smooth_v=kwargs.get("smooth_v", False), return_lse=return_lse, attn_mask=kwargs.get("attn_mask"),
        dropout_p=kwargs.get("dropout_p", 0.0), kernels=kernels,
    )


def _check_quant_backend(backend) -> None:
    if backend not in QUANT_BACKENDS:
        raise ValueError(f"quantization_backend={backend!r} is not supported; use one of {QUANT_BACKENDS}")


@prepared_calls
def sageattn_qk_int8_pv_fp16_triton(q, k, v, tensor_layout="HND", quantization_backend="triton", is_causal=False,
                                    attn_mask=None, sm_scale=None, smooth_k=True, return_lse=False):
    """INT8 Q·K (per-block scales), 16-bit P·V with fp32 accumulation, on Triton (any supported GPU)."""
    _check_quant_backend(quantization_backend)
    return _prepare(
        "sageattn_qk_int8_pv_fp16_triton", q, k, v, tensor_layout=tensor_layout, is_causal=is_causal,
        sm_scale=sm_scale, qk_quant_gran="per_block", pv_fp8=False, pv_accum_dtype="fp32",
        accum_choices=("fp32",), smooth_k=smooth_k, smooth_v=False, return_lse=return_lse, attn_mask=attn_mask,
        kernels="triton",
    )


def _cuda_variant(fn_name, pv_fp8, accum_choices, q, k, v, tensor_layout, is_causal, qk_quant_gran, sm_scale,
                  pv_accum_dtype, smooth_k, smooth_v, return_lse, only_archs=None):
    """The `_cuda` variants: CUDA kernels when built for the GPU, else the same algorithm on Triton."""
    return _prepare(
        fn_name, q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
        qk_quant_gran=qk_quant_gran, pv_fp8=pv_fp8, pv_accum_dtype=pv_accum_dtype, accum_choices=accum_choices,
        smooth_k=smooth_k, smooth_v=smooth_v, return_lse=return_lse, kernels="compiled", only_archs=only_archs,
    )


@prepared_calls
def sageattn_qk_int8_pv_fp16_cuda(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                  sm_scale=None, pv_accum_dtype="fp32", smooth_k=True, smooth_v=False,
                                  return_lse=False):
    """INT8 Q·K, 16-bit P·V (sm80+)."""
    return _cuda_variant("sageattn_qk_int8_pv_fp16_cuda", False, FP16_PV_ACCUM, q, k, v, tensor_layout, is_causal,
                         qk_quant_gran, sm_scale, pv_accum_dtype, smooth_k, smooth_v, return_lse)


@prepared_calls
def sageattn_qk_int8_pv_fp8_cuda(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                 sm_scale=None, pv_accum_dtype="fp32+fp16", smooth_k=True, smooth_v=False,
                                 return_lse=False):
    """INT8 Q·K, FP8 P·V with per-channel V scales (sm89+). pv_accum_dtype="fp32+fp16" accumulates each key tile in
    fp16 where the GPU's kernels have that MMA (sm89 family); on sm90 it runs two-level in fp32."""
    return _cuda_variant("sageattn_qk_int8_pv_fp8_cuda", True, FP8_PV_ACCUM, q, k, v, tensor_layout, is_causal,
                         qk_quant_gran, sm_scale, pv_accum_dtype, smooth_k, smooth_v, return_lse)


@prepared_calls
def sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                      sm_scale=None, pv_accum_dtype="fp32+fp32", smooth_k=True, return_lse=False):
    """The Hopper (sm90) variant of INT8 Q·K + FP8 P·V; its kernel accumulates P·V two-level in fp32 for either
    pv_accum_dtype."""
    return _cuda_variant("sageattn_qk_int8_pv_fp8_cuda_sm90", True, SM90_PV_ACCUM, q, k, v, tensor_layout,
                         is_causal, qk_quant_gran, sm_scale, pv_accum_dtype, smooth_k, False, return_lse,
                         only_archs=frozenset({(9, 0)}))


def sageattn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                    sm_scale=None, smooth_k=True):
    """Packed variable-length batches: q [total_q, Hq, D], k/v [total_k, Hk, D]; sequence i spans
    cu_seqlens[i]:cu_seqlens[i+1]. INT8 Q·K (per-block scales), 16-bit P·V. Returns out like q.

    cu_seqlens_q/k: int32 (or int64) [batch+1], starting at 0, non-decreasing, ending at total_q/total_k;
    empty sequences are allowed (a sequence with queries but no keys gives 0). max_seqlen_q/k: at least the
    longest sequence. These are checked on the host before any kernel runs: cu_seqlens on the CPU cost no
    synchronization (they are checked there, then copied to q's device without blocking); on q's device they are
    read back in one small copy, one synchronization per call. Under torch.compile tracing cannot read them: the
    compiled graph's op checks them when it runs."""
    inputs.check_qkv(q, k, v, 3)
    inputs.check_heads(q.shape[1], k.shape[1])
    cu_q, cu_k = inputs.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q,
                                         max_seqlen_k, q.device)
    dispatch.check_supported(q.device)
    scale = inputs.resolve_sm_scale(sm_scale, q.shape[-1])
    return ops.run_attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q, bool(is_causal), scale, bool(smooth_k))

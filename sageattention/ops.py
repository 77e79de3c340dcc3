"""torch.library registration: one custom op per entry point, with fake (meta) implementations,
so `torch.compile(fullgraph=True)` traces through sageattention without a graph break, and with backward
formulas (the gradient of exact attention: sageattention/backward.py)."""
import typing
from typing import Optional

import torch

from . import archs, backward, forward, inputs
from .compiled_call import CompiledCall
from .inputs import to_hnd
from .plan import Plan


class TritonCall(typing.NamedTuple):
    """Everything but q, k, v that the Triton path's op takes; the field types give its schema (the compiled kernels'
    op takes compiled_call.CompiledCall)."""

    attn_mask: Optional[torch.Tensor]
    tensor_layout: str
    is_causal: bool
    causal_offset: int
    sm_scale: float
    qk_quant_gran: str  # then the rest of Plan's fields, in its order
    pv_fp8: bool
    pv_two_level: bool
    pv_inner_fp16: bool
    smooth_k: bool
    smooth_v: bool
    return_lse: bool
    cuda_variant: str  # the `_cuda` variant that runs on Triton here ("" for others): it warns once

    @property
    def plan(self) -> Plan:
        return Plan(*self[5:11])


def _schema(fields: type, skip: int = 0) -> str:
    """The op schema of (q, k, v, *fields[skip:]) -> (out, lse), from the NamedTuple's field types."""
    types = {bool: "bool", int: "int", float: "float", str: "str", torch.Tensor: "Tensor"}
    hints = typing.get_type_hints(fields)

    def schema_type(kind) -> str:
        if typing.get_origin(kind) is typing.Union:  # Optional[X]
            return schema_type(next(t for t in typing.get_args(kind) if t is not type(None))) + "?"
        return next(t for base, t in types.items() if issubclass(kind, base))

    args = ", ".join(f"{schema_type(kind)} {name}" for name, kind in list(hints.items())[skip:])
    return f"(Tensor q, Tensor k, Tensor v, {args}) -> (Tensor, Tensor)"


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *call) -> tuple[torch.Tensor, torch.Tensor]:
    call = TritonCall(*call)
    forward.note_cuda_fallback(call.cuda_variant, q.device, call.pv_fp8)
    return forward.dense(q, k, v, call.attn_mask, call.tensor_layout, call.is_causal, call.causal_offset,
                         call.sm_scale, call.plan, call.return_lse)


attention = torch.library.custom_op("sageattention::attention", _attention, mutates_args=(), schema=_schema(TritonCall))


@attention.register_fake
def _attention_fake(q, k, v, *call):
    call = TritonCall(*call)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if not call.return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    b, h, n, _ = to_hnd(q, call.tensor_layout).shape
    return out, q.new_empty((b, h, n), dtype=torch.float32)


def _attention_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, is_causal: bool, sm_scale: float, smooth_k: bool,
) -> torch.Tensor:
    plan = Plan(qk_quant_gran="per_block", smooth_k=smooth_k)
    return forward.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, is_causal, sm_scale, plan)


def _attention_varlen_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, is_causal: bool, sm_scale: float, smooth_k: bool,
) -> torch.Tensor:
    # compiled graphs reach the kernel only through the op, and tracing skipped sageattn_varlen's value checks
    inputs.check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q)
    return _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, is_causal, sm_scale, smooth_k)


attention_varlen = torch.library.custom_op("sageattention::attention_varlen", _attention_varlen_op, mutates_args=())


@attention_varlen.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, is_causal, sm_scale, smooth_k):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _compiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *call) -> tuple[torch.Tensor, torch.Tensor]:
    return forward.compiled(q, k, v, CompiledCall(*call))


compiled_attention = torch.library.custom_op("sageattention::compiled_attention", _compiled_attention,
                                             mutates_args=(), schema=_schema(CompiledCall))


@compiled_attention.register_fake
def _compiled_attention_fake(q, k, v, *call):
    call = CompiledCall(*call)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous in the caller's layout, like the kernel
    if not call.return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    b, h, n, _ = to_hnd(q, "NHD" if call.nhd else "HND").shape
    return out, q.new_empty((b, h, n), dtype=torch.float32)


# The compiled modules' operators, torch.ops.sageattention_<family>.attention and .quantize (the module's intermediates,
# for tests): declared once, here; each module registers their CUDA kernels (csrc/common/binding.h), in the stable-ABI
# build and in the version-specific one alike. attention takes CompiledCall's fields after `family`.
QUANTIZE_SCHEMA = ("(Tensor q, Tensor k, Tensor v, bool nhd, int q_gran, int k_gran, int v_mode, bool smooth_k, "
                   "bool smooth_v, float v_fp8_max) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


def _family_attention_fake(q, k, v, *kernel_args):
    return _compiled_attention_fake(q, k, v, "", *kernel_args)


for _family in archs.FAMILIES:
    torch.library.define(f"sageattention_{_family}::attention", _schema(CompiledCall, skip=1))
    torch.library.define(f"sageattention_{_family}::quantize", QUANTIZE_SCHEMA)
    torch.library.register_fake(f"sageattention_{_family}::attention", _family_attention_fake)


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])  # q, k, v
    ctx.args = inputs[3:]


def _attention_backward(ctx, grad_out, grad_lse):
    q, k, v = ctx.saved_tensors
    call = TritonCall(*ctx.args)
    grads = backward.dense_backward(grad_out, grad_lse, q, k, v, call.attn_mask, call.tensor_layout, call.is_causal,
                                    call.causal_offset, call.sm_scale)
    return *grads, *(None,) * len(ctx.args)


def _compiled_attention_backward(ctx, grad_out, grad_lse):
    q, k, v = ctx.saved_tensors
    call = CompiledCall(*ctx.args)
    grads = backward.dense_backward(grad_out, grad_lse, q, k, v, None, "NHD" if call.nhd else "HND", call.is_causal,
                                    call.causal_offset, call.sm_scale)
    return *grads, *(None,) * len(ctx.args)


def _varlen_attention_backward(ctx, grad_out):
    q, k, v = ctx.saved_tensors
    cu_seqlens_q, cu_seqlens_k, _, is_causal, sm_scale = ctx.args[:5]
    grads = backward.varlen_backward(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, sm_scale)
    return *grads, *(None,) * len(ctx.args)


attention.register_autograd(_attention_backward, setup_context=_save_inputs)
compiled_attention.register_autograd(_compiled_attention_backward, setup_context=_save_inputs)
attention_varlen.register_autograd(_varlen_attention_backward, setup_context=_save_inputs)


def call(op, impl, *args):
    """Eager calls skip the dispatcher (it costs tens of microseconds) unless autograd needs the op's backward;
    compiled graphs see the op."""
    q, k, v = args[:3]
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                                                      v.requires_grad)):
        return op(*args)
    return impl(*args)


def run_attention(q, k, v, triton_call: TritonCall):
    return call(attention, _attention, q, k, v, *triton_call)


def run_compiled_attention(q, k, v, compiled_call: CompiledCall):
    return call(compiled_attention, _compiled_attention, q, k, v, *compiled_call)


def run_attention_varlen(*args):
    return call(attention_varlen, _attention_varlen, *args)

"""What one call of the compiled kernels (csrc/) takes: the enums that cross to C++ and the argument structure that
travels from core.py through the registered op (ops.py) and forward.py to the binding.

Torch-free. The enums are csrc/common/params.h's, named alike (`kPerBlock` is PER_BLOCK), and CompiledCall's fields
are, after `family`, the parameters of csrc/common/binding.h's attention() after q, k, v, in order;
tests/sageattention/test_compiled_call.py parses both headers and checks that they agree.
"""
from enum import IntEnum
from typing import NamedTuple


class Granularity(IntEnum):
    """Which tokens share one INT8 scale of Q and K (sageattention/quant_groups.py describes the groups)."""

    PER_BLOCK = 0
    PER_WARP = 1
    PER_THREAD = 2

    @classmethod
    def named(cls, name: str) -> "Granularity":
        """"per_thread" (the public qk_quant_gran) -> PER_THREAD."""
        return cls[name.upper()]


class PvAccum(IntEnum):
    """P·V accumulation: every tile into the fp32 output; each 64-key tile in its own fp32 accumulator; or in an fp16
    one (added to fp32 after the tile)."""

    ACC_F32 = 0
    ACC_TWO_LEVEL = 1
    ACC_F16_INNER = 2


class VMode(IntEnum):
    """What the preparation does with V (the modules' `quantize`, for tests): nothing, FP8 V^T, or a padded copy."""

    V_NONE = 0
    V_FP8 = 1
    V16 = 2


class CompiledCall(NamedTuple):
    """Everything but q, k, v that a compiled call takes; the field types give the op's schema (ops.py)."""

    family: str  # the module that runs it, sageattention._C_<family>; the module's arguments follow
    nhd: bool  # the tensors are [B, N, H, D] (else [B, H, N, D])
    is_causal: bool
    causal_offset: int  # causal: key j is visible to query i when j <= i + causal_offset
    sm_scale: float
    qk_gran: Granularity  # of Q and K alike
    pv_accum: PvAccum
    smooth_k: bool
    smooth_v: bool
    return_lse: bool

    def kernel_args(self) -> tuple:
        """The arguments of the module's attention() after q, k, v."""
        return self[1:]

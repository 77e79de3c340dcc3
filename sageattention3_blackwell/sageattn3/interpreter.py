"""`tl.dot_scaled` for the Triton CPU interpreter (TRITON_INTERPRET=1).

Triton 3.6's interpreter has no `create_dot_scaled`, so a kernel calling `tl.dot_scaled` fails
there. This adds one for the only case sageattn3 uses (e2m1 x e2m1, e4m3 scales per 16 along K,
both operands packed along K): the operands are decoded exactly by `nvfp4.dequantize` and
multiplied in float32 with NumPy. It is installed only when the running Triton lacks its own.
"""
import numpy as np
import torch

from . import nvfp4


def _dequantize(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Codes [..., K/2] uint8 and e4m3 scales [..., K/16] (any 1-byte dtype) -> float32 [..., K]."""
    scales = torch.from_numpy(np.ascontiguousarray(scales).view(np.uint8)).view(torch.float8_e4m3fn)
    return nvfp4.dequantize(torch.from_numpy(np.ascontiguousarray(packed)), scales).numpy()


def _create_dot_scaled(self, lhs, lhs_scale, lhs_format, rhs, rhs_scale, rhs_format, fast_math, lhs_k_pack,
                       rhs_k_pack, acc):
    from triton._C.libtriton import ir
    import triton.language as tl

    e2m1 = ir.ScaleDotElemTypeTY.E2M1
    supported = (lhs_format == e2m1 and rhs_format == e2m1 and lhs_k_pack and rhs_k_pack
                 and lhs_scale is not None and rhs_scale is not None
                 and lhs_scale.dtype == tl.float8e4nv and rhs_scale.dtype == tl.float8e4nv)
    if not supported:
        raise NotImplementedError("sageattn3's interpreter dot_scaled covers only e2m1 x e2m1 with e4m3 scales")
    a = _dequantize(lhs.data, lhs_scale.data)                                        # [M, K]
    b = _dequantize(rhs.data.swapaxes(-1, -2), rhs_scale.data).swapaxes(-1, -2)      # [K, N]
    return type(acc)(np.matmul(a, b, dtype=np.float32) + acc.data, acc.dtype.scalar)


def install() -> None:
    from triton.runtime.interpreter import InterpreterBuilder
    if not hasattr(InterpreterBuilder, "create_dot_scaled"):
        InterpreterBuilder.create_dot_scaled = _create_dot_scaled
